"""``sparkd import-compose`` on every compose shape vLLM's docs and the field use, and on generated services
(hypothesis): the answer is a config that check-config accepts, written as TOML that tomllib reads back, or one
clear line naming what is wrong; never another exception (a traceback on the operator's terminal)."""

from __future__ import annotations

import shlex
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkd.cli.compose import ComposeError, import_compose
from sparkd.cli.compose.interpolate import key_path
from sparkd.config import config_from_mapping

MISTRAL = "mistralai/Mistral-7B-v0.1"


def convert(service: dict[str, Any], *, extra: str = "", files: dict[str, str] | None = None,
            environ: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The service imported through a real compose file; (the TOML read back by tomllib, the notes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "compose.yaml"
        for name, text in (files or {}).items():
            (Path(tmp) / name).write_text(text)
        path.write_text(extra + yaml.safe_dump({"services": {"vllm": service}}))
        result = import_compose(path, environ=environ or {})
    data = tomllib.loads(result.toml)
    config_from_mapping(data, env={})  # what check-config validates
    return data, result.not_carried


GPU_RESERVATION = {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all",
                                                                 "capabilities": ["gpu"]}]}}}


def test_vllm_docs_shape_image_entrypoint_and_flags() -> None:
    # docs.vllm.ai's deployment page: the image's ENTRYPOINT is `vllm serve`; `command:` holds only flags.
    data, notes = convert({"image": "vllm/vllm-openai:latest", "ipc": "host", "ports": ["8000:8000"],
                           "command": f"--model {MISTRAL} --max-model-len 4096", "deploy": GPU_RESERVATION})
    launch = data["launch"]
    assert (launch["executable"], launch["subcommand"], launch["model"]) == ("vllm", "serve", MISTRAL)
    assert launch["max_model_len"] == 4096 and launch["extra_args"] == []
    assert data["container"]["gpus"] == "all"
    assert any("ENTRYPOINT runs it: `vllm serve` (vllm/vllm-openai's ENTRYPOINT)" in n for n in notes)


def test_a_model_first_command_for_the_vllm_image() -> None:
    data, _ = convert({"image": "vllm/vllm-openai:v0.8.5", "command": [MISTRAL, "--port", "8001"]})
    assert (data["launch"]["model"], data["launch"]["port"], data["launch"]["subcommand"]) == (MISTRAL, 8001, "serve")


@pytest.mark.parametrize("entrypoint", [
    None, ["python3", "-m", "vllm.entrypoints.openai.api_server"], "python -m vllm.entrypoints.openai.api_server"])
def test_the_api_server_module_is_carried_as_vllm_serve(entrypoint: Any) -> None:
    command = ["--model", MISTRAL, "--tensor-parallel-size", "2"]
    if entrypoint is None:
        command = ["python3", "-m", "vllm.entrypoints.openai.api_server", *command]
    data, notes = convert({"image": "vllm/vllm-openai:v0.4.0", "entrypoint": entrypoint, "command": command})
    assert (data["launch"]["executable"], data["launch"]["subcommand"]) == ("vllm", "serve")
    assert (data["launch"]["model"], data["launch"]["tensor_parallel_size"]) == (MISTRAL, 2)
    assert any("is carried as `vllm serve`" in n for n in notes)


@pytest.mark.parametrize("command", [f"vllm serve {MISTRAL} --max-num-seqs 8",
                                     ["vllm", "serve", MISTRAL, "--max-num-seqs", "8"],
                                     ["bash", "-c", f"exec vllm serve {MISTRAL} --max-num-seqs 8"]])
def test_command_as_a_string_a_list_or_a_shell_string(command: Any) -> None:
    data, _ = convert({"image": "img", "command": command})
    assert (data["launch"]["model"], data["launch"]["max_num_seqs"]) == (MISTRAL, 8)


def test_an_entrypoint_override_comes_first() -> None:
    data, _ = convert({"image": "img", "entrypoint": ["vllm", "serve"], "command": [MISTRAL, "--port", "9000"]})
    assert (data["launch"]["executable"], data["launch"]["model"], data["launch"]["port"]) == ("vllm", MISTRAL, 9000)


def test_env_files_profiles_deploy_limits_and_extensions() -> None:
    extra = "x-common: &common\n  HF_HOME: /hf\n"
    service = {"image": "vllm/vllm-openai", "command": ["--model", MISTRAL], "profiles": ["gpu"],
               "env_file": ["vllm.env", {"path": "optional.env", "required": False}],
               "environment": {"HF_TOKEN_PATH": "/run/t"}, "x-owner": "ml-team",
               "deploy": {"resources": {"limits": {"memory": "100g", "cpus": "8"},
                                        "reservations": {"devices": [{"capabilities": [["gpu"]],
                                                                      "device_ids": ["0", "1"]}]}}}}
    data, notes = convert(service, extra=extra, files={"vllm.env": "NCCL_DEBUG=WARN\n"})
    container = data["container"]
    assert container["env"] == {"NCCL_DEBUG": "WARN", "HF_TOKEN_PATH": "/run/t"}
    assert (container["gpus"], container["memory"]) == ("device=0,1", "100g")
    joined = "\n".join(notes)
    assert "services.vllm.profiles: not carried: sparkd runs the service whenever sparkd runs" in joined
    assert "only the GPU reservation and the memory limit are carried (not cpus)" in joined
    assert "x-owner" not in joined


def test_a_required_env_file_that_is_missing_is_named() -> None:
    with pytest.raises(ComposeError, match=r"missing\.env: cannot read"):
        convert({"image": "img", "command": ["vllm", "serve", "m"], "env_file": "missing.env"})


def test_toml_that_tomllib_reads_back_for_every_awkward_character() -> None:
    # The old hand-written writer put a raw DEL (\x7f) into the file: tomllib refuses it ('Illegal character').
    value = "a\x7fb\x00c\"d\\e\u2028f\tg"
    data, _ = convert({"image": "img", "command": ["vllm", "serve", "m"], "environment": {"ODD": value},
                       "labels": {"with space": "x", "ünï": "y"}})
    assert data["container"]["env"]["ODD"] == value
    assert data["container"]["labels"] == {"with space": "x", "ünï": "y"}


# Generated services: pieces of real commands and values, mixed with junk of every YAML type.
junk = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=6)
flags = st.sampled_from([
    ["--model", MISTRAL], ["--port", "8000"], ["--port", "eighty"], ["--max-model-len", "4096"], ["--nnodes", "2"],
    ["--node-rank", "x"], ["--headless"], ["--tensor-parallel-size", "2"], ["--gpu-memory-utilization", "0.9"],
    ["--compilation-config", '{"level": 3}'], ["--compilation-config.level", "3"], ["-O3"], ["--enforce-eager"],
    ["--no-enable-prefix-caching"], ["--speculative-config", "[1]"], ["--served-model-name", "m"], ["--port"],
    ["--kv-cache-dtype", "fp8"], ["--trust-remote-code"], ["--unknown-flag", "v"], ["--max-num-seqs=4"],
])
heads = st.sampled_from([[], ["vllm", "serve"], ["vllm", "serve", MISTRAL], [MISTRAL], ["python3", "-m",
                         "vllm.entrypoints.openai.api_server"], ["/usr/local/bin/entrypoint.sh", "serve", "m"],
                         ["NCCL_DEBUG=INFO"], ["exec", "vllm", "serve", "m"], ["sleep", "infinity"]])


@st.composite
def commands(draw: st.DrawFn) -> Any:
    words = draw(heads) + [w for f in draw(st.lists(flags, max_size=6)) for w in f]
    shape = draw(st.sampled_from(["list", "string", "shell", "junk", "text"]))
    if shape == "string":
        return shlex.join(words)
    if shape == "shell":
        return ["bash", draw(st.sampled_from(["-c", "-lc"])), shlex.join(words) + draw(st.sampled_from(["", "; x"]))]
    if shape == "junk":
        return draw(junk)
    if shape == "text":
        return draw(st.text(max_size=30))
    return words


services = st.fixed_dictionaries(
    {"image": st.sampled_from(["vllm/vllm-openai:latest", "img", "ghcr.io/x/vllm:1"]) | junk,
     "command": commands()},
    optional={
        "entrypoint": st.sampled_from([["vllm", "serve"], "vllm serve", ["/bin/bash", "-c"], None,
                                       ["python3", "-m", "vllm.entrypoints.openai.api_server"]]) | junk,
        "environment": st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(), max_size=3) | junk,
        "env_file": st.sampled_from(["none.env", [{"path": "none.env", "required": False}], [{}]]) | junk,
        "profiles": st.lists(st.text(max_size=5), max_size=2) | junk,
        "deploy": st.just(GPU_RESERVATION) | junk,
        "gpus": st.sampled_from(["all", 1, -1]) | junk,
        "volumes": st.lists(st.sampled_from(["/a:/b", "/a:/b:ro", "./rel:/c", "anon", {"type": "bind"}]) | junk,
                            max_size=3) | junk,
        "shm_size": st.sampled_from(["64gb", "1g", "lots"]) | junk,
        "ulimits": st.sampled_from([{"memlock": -1}, {"stack": {"soft": 1, "hard": 2}}]) | junk,
        "stop_grace_period": st.sampled_from(["1m30s", "10s", "forever"]) | junk,
        "x-extension": junk, "ports": junk, "network_mode": st.sampled_from(["host", "bridge"]) | junk,
        "labels": junk, "devices": junk, "ipc": junk, "container_name": junk, "privileged": junk,
    },
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example(service={"image": "vllm/vllm-openai:latest", "command": [], "labels": {"\n": []}})  # a CI-like run's
@given(service=services)
def test_a_generated_service_is_a_valid_config_or_one_clear_error(service: dict[str, Any]) -> None:
    try:
        convert(service)
    except ComposeError as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message, message


KEY_PATHS = [  # (where, key, as named): a key with anything but a plain name's characters is quoted
    ("services.vllm", "labels", "services.vllm.labels"),
    ("services", "vllm-head_0", "services.vllm-head_0"),
    ("services.vllm.labels", "com.example/role:x@y", "services.vllm.labels.com.example/role:x@y"),
    ("services.vllm.labels", "\n", "services.vllm.labels['\\n']"),
    ("services.vllm.environment", "A KEY", "services.vllm.environment['A KEY']"),
    ("", "services", "services"),
    ("", "two words", "['two words']"),
]


@pytest.mark.parametrize(("where", "key", "named"), KEY_PATHS)
def test_a_key_is_named_on_one_line(where: str, key: str, named: str) -> None:
    assert key_path(where, key) == named and "\n" not in key_path(where, key)


def test_control_characters_in_what_the_header_quotes_stay_in_their_comment_line(tmp_path: Path) -> None:
    # Found by the property test above: a command of "\x1f\r0" was quoted in a "not carried" comment, and TOML
    # refuses control characters there (tomllib: invalid character '\x1f').
    data, notes = convert({"image": "img", "command": "\x1f\r0"})
    assert data["launch"]["executable"] == "\x1f" and any("\x1f" in note for note in notes)
    folder = tmp_path / "new\nline"
    folder.mkdir()
    service = {"image": "img", "command": "vllm serve m"}
    (folder / "compose.yaml").write_text(yaml.safe_dump({"services": {"vllm": service}}))
    text = import_compose(folder / "compose.yaml", environ={}).toml
    assert "new\\u000aline" in text.splitlines()[0]
    tomllib.loads(text)

