"""``sparkd import-compose`` (sparkd/cli/compose): compose's interpolation, the 001 service as a config that passes
check-config, what cannot be carried named, and errors that name the variable or key."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sparkd.cli.compose import ComposeError, import_compose
from sparkd.cli.compose.interpolate import interpolate
from sparkd.config import load_config

REPO = Path(__file__).resolve().parents[2]
FIELD_001 = REPO / "tests" / "data" / "field-001-compose.yaml"
WORKER = {"NODE_RANK": "1", "HEADLESS": "1", "MASTER_ADDR": "192.168.0.8", "HF_CACHE": "/data/hf", "HOME": "/home/u"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A}", "a"), ("$A/x", "a/x"), ("${NOPE:-d}", "d"), ("${EMPTY:-d}", "d"), ("${EMPTY-d}", ""),
        ("${A:+--on}", "--on"), ("${EMPTY:+--on}", ""), ("${NOPE:-${A}/z}", "a/z"), ("$$A", "$A"),
        ("${A:?needed}", "a"),
    ],
)
def test_interpolation(text: str, expected: str) -> None:
    assert interpolate(text, {"A": "a", "EMPTY": ""}) == expected


def test_a_required_variable_is_named() -> None:
    with pytest.raises(ComposeError) as err:
        interpolate({"x": "${NODE_RANK:?set 0 on head}"}, {}, "services.vllm")
    assert str(err.value) == "services.vllm.x: required variable NODE_RANK is missing a value: set 0 on head"


def imported(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, Any], list[str], Path]:
    result = import_compose(FIELD_001, environ=env)
    out = tmp_path / "worker.toml"
    out.write_text(result.toml)
    return tomllib.loads(result.toml), result.not_carried, out


def test_field_001_becomes_a_config_that_passes_check_config(tmp_path: Path) -> None:
    data, notes, path = imported(tmp_path, WORKER)
    cfg = load_config(path, env={})
    assert cfg.runtime.value == "docker-run"
    assert (cfg.node.role.value, cfg.node.rank, cfg.headless) == ("worker", 1, True)
    assert (cfg.master_addr, cfg.master_port, cfg.nnodes) == ("192.168.0.8", 25000, 2)
    cc = cfg.container
    assert (cc.image, cc.host_network, cc.host_ipc, cc.gpus) == (
        "aidendle94/sparkrun-vllm-ds4-gb10:production-ready", True, True, "all")
    assert cc.shm_size == 64 << 30 and data["container"]["shm_size"] == "64gb"
    assert {k: (u.soft, u.hard) for k, u in cc.ulimits.items()} == {"memlock": (-1, -1), "stack": (67108864,) * 2}
    assert cc.devices == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert [(m.source, m.target, m.read_only) for m in cc.mounts] == [
        ("/data/hf", "/cache/huggingface", False), ("/etc/passwd", "/etc/passwd", True),
        ("/etc/group", "/etc/group", True)]
    assert cc.env["NCCL_IB_GID_INDEX"] == "3" and cc.env["VLLM_CACHE_ROOT"] == "/cache/huggingface/vllm-cache"
    launch = cfg.launch
    assert (launch.executable, launch.subcommand, launch.model) == (
        "/usr/local/bin/dsv4-vllm-entrypoint", "serve", "deepseek-ai/DeepSeek-V4-Flash")
    assert (launch.max_model_len, launch.max_num_seqs, launch.gpu_memory_utilization) == (1000000, 6, 0.82)
    assert launch.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    assert launch.default_chat_template_kwargs == {"thinking": True, "reasoning_effort": "high"}
    assert (launch.enable_prefix_caching, launch.enable_auto_tool_choice, launch.trust_remote_code) == (True,) * 3
    assert launch.extra_args == [
        "--distributed-executor-backend", "mp", "--reasoning-config",
        '{"reasoning_parser":"deepseek_v4","reasoning_start_str":"","reasoning_end_str":""}',
        "--enable-flashinfer-autotune"]
    assert any("`bash -lc` runs a login shell" in note for note in notes)
    result = subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "role worker, runtime docker-run" in result.stdout


def test_the_head_from_the_same_file(tmp_path: Path) -> None:
    _, _, path = imported(tmp_path, {**WORKER, "NODE_RANK": "0", "HEADLESS": ""})
    cfg = load_config(path, env={})
    assert (cfg.node.role.value, cfg.node.rank, cfg.headless) == ("head", 0, False)


def test_constructs_that_cannot_be_carried_are_named(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        "services:\n  vllm:\n    image: img\n    restart: unless-stopped\n    healthcheck: {test: [CMD, true]}\n"
        "    networks: [fabric]\n    x-note: 1\n    colour: blue\n    volumes: [/scratch]\n"
        "    stop_grace_period: 1m30s\n    command: [vllm, serve, m, --max-num-seqs, '4']\n")
    result = import_compose(compose, environ={})
    joined = "\n".join(result.not_carried)
    assert "services.vllm.restart: not carried: sparkd decides restarts" in joined
    assert "services.vllm.healthcheck: not carried" in joined
    assert "services.vllm.networks: not carried" in joined
    assert "services.vllm.colour: not carried: sparkd has no such setting" in joined
    assert "x-note" not in joined  # an extension: the author's own key, passed over
    assert "services.vllm.volumes[0]: the anonymous volume /scratch is not carried" in joined
    data = tomllib.loads(result.toml)
    assert data["supervisor"] == {"stop_grace_s": 90.0} and data["launch"]["max_num_seqs"] == 4
    assert "# not carried: services.vllm.restart" in result.toml


@pytest.mark.parametrize(
    ("compose", "words"),
    [
        ("services: {}\n", "no services"),
        ("services:\n  a: {image: x, command: [vllm, serve, m]}\n  b: {image: y}\n", "2 services (a, b); name one"),
        ("services:\n  vllm: {command: [vllm, serve, m]}\n", "services.vllm.image: required"),
        ("services:\n  vllm: {image: x}\n", "services.vllm.command: none"),
        ("services:\n  vllm: {image: x, command: [vllm, serve, --port, '8']}\n", "no model"),
        ("services:\n  vllm: {image: x, shm_size: lots, command: [vllm, serve, m]}\n", "container.shm_size"),
        ("services:\n  vllm: [\n", "not valid YAML (line"),
    ],
)
def test_what_cannot_be_converted_is_named(tmp_path: Path, compose: str, words: str) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(compose)
    with pytest.raises(ComposeError) as err:
        import_compose(path, environ={})
    assert words in str(err.value)


def test_the_command_line(tmp_path: Path) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text("NODE_RANK=1\nHEADLESS=1\nMASTER_ADDR=192.168.0.8\nHF_CACHE=/data/hf\n")
    out = tmp_path / "worker.toml"
    run = [sys.executable, "-m", "sparkd.cli", "import-compose", str(FIELD_001), "--service", "vllm",
           "--env-file", str(env_file)]
    result = subprocess.run([*run, "--output", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "not carried: services.vllm.command" in result.stderr and out.exists()
    printed = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert printed.stdout == out.read_text()
    missing = subprocess.run([sys.executable, "-m", "sparkd.cli", "import-compose", str(FIELD_001)],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "required variable NODE_RANK is missing a value" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_without_pyyaml_the_command_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # as in the .deb's virtualenv, which leaves PyYAML out
    with pytest.raises(ComposeError) as err:
        import_compose(FIELD_001, environ=WORKER)
    assert "needs PyYAML: pip install 'sparkd[compose]'" in str(err.value)
