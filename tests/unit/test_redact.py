"""Secrets stay secret (reliability.md 5d): the API key reaches vLLM through its environment only, and the
redactor masks the key and the peer token in every text sparkd logs, keeps or shows."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkd.cluster.shared import shared_settings
from sparkd.config import ConfigError, config_from_mapping
from sparkd.config.secretrule import is_secret_name
from sparkd.host.logs import configure_logging, get_logger
from sparkd.launch.redact import MASK, Redactor, redactor_for, use_for_logs
from sparkd.launch.render import render, render_script

KEY = "sk-SECRET-rel5"
TOKEN = "peer-token-0123456789"


def config(tmp_path: Path, **launch: object) -> object:
    token = tmp_path / "peer.token"
    token.write_text(TOKEN + "\n")
    return config_from_mapping({
        "runtime": "process", "node": {"role": "single"},
        "launch": {"model": "/models/m", "api_key": KEY, **launch},
        "api": {"token_file": str(token)},
    }, env={})


def test_the_api_key_is_in_the_launchs_environment_only(tmp_path: Path) -> None:
    spec = render(config(tmp_path))  # type: ignore[arg-type]
    assert KEY not in " ".join(spec.argv) and "--api-key" not in spec.argv
    assert KEY not in render_script(spec) and KEY not in json.dumps(spec.to_json()) and KEY not in repr(spec)
    assert spec.secret_env == {"VLLM_API_KEY": KEY} and spec.environment()["VLLM_API_KEY"] == KEY
    assert "VLLM_API_KEY" not in spec.env


def test_the_script_gets_the_key_from_its_environment_and_refuses_to_run_without_it(tmp_path: Path) -> None:
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\necho \"argv: $*\"; echo \"key: ${VLLM_API_KEY:-none}\"\n")
    program.chmod(0o755)
    spec = render(config(tmp_path, executable=str(program)))  # type: ignore[arg-type]
    script = tmp_path / "launch.sh"
    script.write_text(render_script(spec))
    ran = subprocess.run(["bash", str(script)], env={**os.environ, **spec.environment()}, capture_output=True,
                         text=True, timeout=30)
    assert ran.returncode == 0 and f"key: {KEY}" in ran.stdout and KEY not in ran.stdout.split("key:")[0]
    bare = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    refused = subprocess.run(["bash", str(script)], env=bare, capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "argv:" not in refused.stdout
    assert "VLLM_API_KEY: is not set: sparkd passes it in the environment" in refused.stderr


def test_a_key_set_in_launch_env_is_kept_out_of_the_script_too(tmp_path: Path) -> None:
    spec = render(config(tmp_path, api_key=None, env={"VLLM_API_KEY": "sk-from-env-table", "OTHER": "1"}))  # type: ignore[arg-type]
    assert spec.secret_env == {"VLLM_API_KEY": "sk-from-env-table"} and spec.env["OTHER"] == "1"
    assert "sk-from-env-table" not in render_script(spec)


@pytest.mark.parametrize(("text", "shown"), [
    (f"---- sparkd: launch vllm serve /m --api-key {KEY} --port 8000",
     f"---- sparkd: launch vllm serve /m --api-key {MASK} --port 8000"),
    ("launched argv=['vllm', '--api-key', 'sk-not-told', '--port']",
     f"launched argv=['vllm', '--api-key', '{MASK}', '--port']"),
    ("--api-key=sk-not-told x", f"--api-key={MASK} x"),
    ("INFO [utils.py:253] non-default args: {'model': '/m', 'api_key': ['sk-not-told'], 'port': 8}",
     f"INFO [utils.py:253] non-default args: {{'model': '/m', 'api_key': ['{MASK}'], 'port': 8}}"),
    ('{"Authorization": "Bearer abc-not-told"}', f'{{"Authorization": "Bearer {MASK}"}}'),
    ("VLLM_API_KEY=sk-not-told vllm serve", f"VLLM_API_KEY={MASK} vllm serve"),
    (f"the token {TOKEN} leaked", f"the token {MASK} leaked"),
    (f"key inside a word x{KEY}y", f"key inside a word x{MASK}y"),
    ("INFO 01-01 Loading weights took 1.2 s", "INFO 01-01 Loading weights took 1.2 s"),
    ("a bearer of good news", "a bearer of good news"),
    # Security review 2, #20: shapes that went through.
    ("vllm serve /m --hf-token hf_REAL3 --port 8000", f"vllm serve /m --hf-token {MASK} --port 8000"),
    ("argv=['vllm', '--hf-token', 'hf_REAL3']", f"argv=['vllm', '--hf-token', '{MASK}']"),
    ("export OPENAI_API_KEY='sk-REAL13'", f"export OPENAI_API_KEY='{MASK}'"),
    ('export HF_TOKEN="hf_REAL14" && run', f'export HF_TOKEN="{MASK}" && run'),
    ("pip install -i https://user:REAL9@pypi.example/simple", f"pip install -i https://user:{MASK}@pypi.example/simple"),
    ("GITHUB_PAT=ghp_REAL12 PROXY_AUTH=u:REAL15", f"GITHUB_PAT={MASK} PROXY_AUTH={MASK}"),
    ("--max-num-batched-tokens 8192 --tokenizer /m --ssl-keyfile /k.pem PATH=/usr/bin AUTHOR=me",
     "--max-num-batched-tokens 8192 --tokenizer /m --ssl-keyfile /k.pem PATH=/usr/bin AUTHOR=me"),
    ("see http://host:8000/v1/models", "see http://host:8000/v1/models"),
])
def test_redaction(text: str, shown: str) -> None:
    assert Redactor([KEY, TOKEN, None, "", "ab"])(text) == shown


def test_argv_and_records_are_redacted() -> None:
    redact = Redactor([KEY])
    assert redact.argv(["vllm", "serve", "--api-key", "short", "--x", KEY, "--hf-token", "hf_1", "--port", "8"]) == \
        ["vllm", "serve", "--api-key", MASK, "--x", MASK, "--hf-token", MASK, "--port", "8"]
    record = {"message": f"failed with --api-key {KEY}", "tail": [KEY, 3], "n": 1}
    assert redact.mapping(record) == {"message": f"failed with --api-key {MASK}", "tail": [MASK, 3], "n": 1}


def test_the_daemons_redactor_knows_the_key_and_the_peer_token(tmp_path: Path) -> None:
    redact = redactor_for(config(tmp_path))  # type: ignore[arg-type]
    assert redact(f"{KEY} and {TOKEN}") == f"{MASK} and {MASK}"


# ---- one rule for every secret (security review §4)

@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("NGC_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("OPENAI_APIKEY", True), ("DB_PASSWORD", True), ("GOOGLE_APPLICATION_CREDENTIALS", True), ("VLLM_API_KEY", True),
    ("TOKENIZERS_PARALLELISM", False), ("NCCL_SOCKET_IFNAME", False), ("max_num_batched_tokens", False),
    ("GITHUB_PAT", True), ("PROXY_AUTH", True), ("PATH", False), ("AUTHOR", False), ("VLLM_COMPAT", False),
    ("MY_PATH_ROOT", False),
])
def test_the_secret_rule(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
    assert is_secret_name("MY_SESAME", ["MY_SESAME"])  # [launch] secret_env adds names


def test_every_secret_named_variable_reaches_vllm_through_its_environment_only(tmp_path: Path) -> None:
    env = {"HF_TOKEN": "hf_LAUNCHENVSECRET123", "NGC_API_KEY": "nvapi-SECRET", "MY_PAT": "ghp_SECRET",
           "TOKENIZERS_PARALLELISM": "false"}
    spec = render(config(tmp_path, env=env, secret_env=["MY_PAT"]))  # type: ignore[arg-type]
    assert set(spec.secret_env) == {"HF_TOKEN", "NGC_API_KEY", "MY_PAT", "VLLM_API_KEY"}
    assert spec.env["TOKENIZERS_PARALLELISM"] == "false"
    shown = render_script(spec) + json.dumps(spec.to_json())
    for value in (*list(env.values())[:3], KEY):
        assert value not in shown
    assert ': "${HF_TOKEN:?is not set' in render_script(spec)
    assert spec.to_json()["secret_env"] == ["HF_TOKEN", "MY_PAT", "NGC_API_KEY", "VLLM_API_KEY"]


def test_a_container_inspect_is_redacted_by_shape_without_being_told_the_values() -> None:
    """The review found HF_TOKEN=, NGC_API_KEY= and AWS_SECRET_ACCESS_KEY= in an incident's container.json."""
    inspect = {"Config": {"Env": ["HF_TOKEN=hf_x1", "NGC_API_KEY=nv_x2", "AWS_SECRET_ACCESS_KEY=aws_x3", "A=1"],
                          "Labels": {"MY_TOKEN": "t_x4"}}, "Args": ["--api-key", "sk_x5"]}
    shown = json.dumps(Redactor().mapping(inspect))
    assert not any(f"_x{i}" in shown for i in range(1, 5)), shown
    assert "A=1" in shown and f"HF_TOKEN={MASK}" in shown


def test_the_api_key_can_live_in_a_file_and_an_unreadable_one_refuses_the_launch(tmp_path: Path) -> None:
    key_file = tmp_path / "api.key"
    key_file.write_text("sk-FROM-FILE-0123\n")
    key_file.chmod(0o600)
    cfg = config(tmp_path, api_key=None, api_key_file=str(key_file))
    assert render(cfg).secret_env == {"VLLM_API_KEY": "sk-FROM-FILE-0123"}  # type: ignore[arg-type]
    assert redactor_for(cfg)("sk-FROM-FILE-0123") == MASK  # type: ignore[arg-type]
    key_file.chmod(0o644)  # open to others: not used, and the launch script refuses to start vLLM without it
    assert render(cfg).secret_env == {"VLLM_API_KEY": ""}  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="set either api_key or api_key_file"):
        config(tmp_path, api_key_file=str(key_file))


def test_an_invalid_secret_is_never_echoed_in_the_error() -> None:
    """The review: `launch.api_key: Input should be a valid string (got ['sk-LEAKED-IN-ERROR'])`."""
    for launch in ({"api_key": ["sk-LEAKED-IN-ERROR"]}, {"env": {"HF_TOKEN": ["sk-LEAKED-IN-ERROR"]}},
                   {"env": "HF_TOKEN=sk-LEAKED-IN-ERROR"}, {"api_key": 5, "x": {"api_key": "sk-LEAKED-IN-ERROR"}}):
        with pytest.raises(ConfigError) as refused:
            config_from_mapping({"runtime": "process", "launch": {"model": "/m", **launch}}, env={})
        assert "sk-LEAKED" not in str(refused.value), refused.value
    with pytest.raises(ConfigError) as refused:  # the same through a SPARKD_* override
        config_from_mapping({"runtime": "process", "launch": {"model": "/m"}},
                            env={"SPARKD_LAUNCH__ENV": '"HF_TOKEN=sk-LEAKED-IN-ERROR"'})
    assert "sk-LEAKED" not in str(refused.value) and "SPARKD_LAUNCH__ENV" in str(refused.value)


def test_every_log_event_is_redacted_and_the_redactor_follows_a_reload(tmp_path: Path) -> None:
    stream = io.StringIO()
    configure_logging(json_lines=True, stream=stream, environ={})
    use_for_logs(Redactor(["sk-OLD-0123"]))
    log = get_logger()
    log.info("config_reloaded", settings=["container.env.FOO: None → 'sk-OLD-0123'"], HF_TOKEN="hf_raw",
             detail={"NGC_API_KEY": "nv-raw"}, note="VLLM_API_KEY=sk-shape")
    use_for_logs(Redactor(["sk-NEW-4567"]))  # what the daemon does when a reload changes the secrets
    log.warning("event", said="sk-NEW-4567 and sk-OLD-0123")
    text = stream.getvalue()
    for value in ("sk-OLD-0123", "hf_raw", "nv-raw", "sk-shape", "sk-NEW-4567"):
        assert value not in text.split('"said"')[0 if value != "sk-NEW-4567" else 1], (value, text)
    assert "sk-OLD-0123" in text.split('"said"')[1]  # forgotten once the reload replaced it
    use_for_logs(Redactor())


def test_ranks_compare_a_shared_secret_by_a_digest_under_the_peers_key(tmp_path: Path) -> None:
    def settings(key_value: str, token: str | None) -> dict[str, object]:
        cfg = config_from_mapping({"runtime": "process", "node": {"role": "head"},
                                   "cluster": {"peers": ["10.0.0.2"], "master_addr": "10.0.0.1"},
                                   "launch": {"model": "/m", "env": {"VLLM_API_KEY": key_value}}}, env={})
        return shared_settings(cfg, token)

    same, other = settings("sk-a", "t" * 40), settings("sk-b", "t" * 40)
    assert same == settings("sk-a", "t" * 40) and same["env.VLLM_API_KEY"] != other["env.VLLM_API_KEY"]
    assert str(same["env.VLLM_API_KEY"]).startswith("(secret ") and "sk-a" not in json.dumps(same)
    assert settings("sk-a", None)["env.VLLM_API_KEY"] == MASK  # no key (a status without peers): the mask
