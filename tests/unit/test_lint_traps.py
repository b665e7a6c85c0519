"""The field's known traps as lint rules (sparkd.launch.traps), each with the bad setting and the good one; the
environment they are judged in is the daemon's (sparkd's own on the host); check-config judges by the starts this
node measured and by the running daemon's own environment; the preflight fails a launch on a measured start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sparkd.config import config_from_mapping
from sparkd.launch.lint import Level, lint
from sparkd.launch.traps import RULES, NodeFacts
from sparkd.state.starttimes import KEEP, engine_seconds, measured_starts, record_start

REPO = Path(__file__).resolve().parents[2]
ERR, WARN = Level.error, Level.warning


def cfg(launch: dict[str, Any] | None = None, *, runtime: str = "process", allow: tuple[str, ...] = (),
        **sections: Any) -> Any:
    data: dict[str, Any] = {"runtime": runtime, "launch": {"model": "m", **(launch or {})},
                            "lint": {"allow": list(allow)}, **sections}
    if runtime != "process":
        data["container"] = {"image": "vllm:x"}
    return config_from_mapping(data, env={})


def found(config: Any, rule: str, **kw: Any) -> list[tuple[Level, str, str]]:
    kw.setdefault("host_env", {})
    return [(f.level, f.key, f.message) for f in lint(config, **kw) if f.rule == rule]


# ---- KV offload with expandable segments (MiaAI GLM PR #58)

OFFLOAD = ["--kv-offloading-size", "64"]


@pytest.mark.parametrize("setting", ["expandable_segments:True", "expandable_segments:False,max_split_size_mb:512"])
def test_kv_offload_with_expandable_segments_is_refused(setting: str) -> None:
    ((level, key, message),) = found(cfg({"extra_args": OFFLOAD, "env": {"PYTORCH_CUDA_ALLOC_CONF": setting}}),
                                     "kv-offload-expandable-segments")
    assert level is ERR and key == "launch.env.PYTORCH_CUDA_ALLOC_CONF"
    assert "MiaAI GLM PR #58" in message and "both hosts wedged" in message and "--kv-offloading-size 64" in message
    refused = "vLLM refuses a KV connector" in message
    assert refused == setting.startswith("expandable_segments:True")


def test_kv_offload_alone_is_a_warning_and_no_offload_is_nothing() -> None:
    ((level, _, message),) = found(cfg({"extra_args": ["--kv-offloading-size=32"]}), "kv-offload-expandable-segments")
    assert level is WARN and "MiaAI GLM PR #58" in message
    transfer = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both"})
    bad = cfg({"extra_args": ["--kv-transfer-config", transfer],
               "env": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}})
    assert [f[0] for f in found(bad, "kv-offload-expandable-segments")] == [ERR]
    good = cfg({"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})  # no offload: the recipes' setting
    assert found(good, "kv-offload-expandable-segments") == []
    nixl = cfg({"extra_args": ["--kv-transfer-config", '{"kv_connector":"NixlConnector"}']})
    assert found(nixl, "kv-offload-expandable-segments") == []
    allowed = cfg({"extra_args": OFFLOAD, "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
                  allow=("kv-offload-expandable-segments",))
    assert found(allowed, "kv-offload-expandable-segments") == []


# ---- VLLM_ENGINE_READY_TIMEOUT_S against the measured starts (vllm #48031)


@pytest.mark.parametrize(("timeout", "starts", "expected"), [
    ("600", (412.0, 713.5), ERR), ("1000", (713.5,), WARN), ("3600", (713.5,), None), ("600", (), None),
    ("600", (380.0,), None)])
def test_engine_ready_timeout_against_this_nodes_starts(timeout: str, starts: tuple[float, ...],
                                                        expected: Level | None) -> None:
    config = cfg({"env": {"VLLM_ENGINE_READY_TIMEOUT_S": timeout}})
    got = found(config, "engine-ready-timeout-below-cold-start", node=NodeFacts(starts))
    assert [level for level, _, _ in got] == ([] if expected is None else [expected])
    if expected is ERR:
        (_, key, message), = got
        assert key == "launch.env.VLLM_ENGINE_READY_TIMEOUT_S" and "vllm #48031" in message
        assert "longest measured start took 714 s (of 2 timed by sparkd" in message and "at least 1440 s" in message


def test_an_unset_timeout_is_vllms_600_s() -> None:
    ((level, key, message),) = found(cfg({"default_env": False}), "engine-ready-timeout-below-cold-start",
                                     node=NodeFacts((650.0,)))
    assert level is ERR and key == "launch.env.VLLM_ENGINE_READY_TIMEOUT_S" and "vLLM's default 600 s" in message


# ---- dev mode beyond loopback


@pytest.mark.parametrize(("host", "value", "role", "bad"), [
    (None, "1", "single", True), ("0.0.0.0", "1", "single", True), ("10.0.0.1", "2", "single", True),
    ("127.0.0.1", "1", "single", False), ("::1", "1", "single", False), ("localhost", "1", "single", False),
    (None, "0", "single", False), (None, "1", "worker", False)])
def test_dev_mode_only_on_loopback(host: str | None, value: str, role: str, bad: bool) -> None:
    launch: dict[str, Any] = {"env": {"VLLM_SERVER_DEV_MODE": value}, **({"host": host} if host else {})}
    sections: dict[str, Any] = {"node": {"role": role, "rank": 1}, "cluster": {"master_addr": "10.0.0.1"}} \
        if role == "worker" else {}
    got = found(cfg(launch, **sections), "dev-mode-beyond-loopback")
    assert [level for level, _, _ in got] == ([ERR] if bad else [])
    if bad:
        message = got[0][2]
        assert "/collective_rpc" in message and "guards only /v1" in message and 'launch.host = "127.0.0.1"' in message


def test_every_trap_names_its_report() -> None:
    for rule, (level, report) in RULES.items():
        assert level == "error" and any(mark in report for mark in ("#", "routers.py")), rule


# ---- the environment is the daemon's: sparkd's own on the host


def test_on_the_host_sparkds_own_environment_is_judged_in_a_container_it_is_not() -> None:
    inherited = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    on_host = {f.rule: f.key for f in lint(cfg(), host_env=inherited) if f.level is ERR}
    assert on_host["dev-mode-beyond-loopback"].startswith("sparkd's own environment (VLLM_SERVER_DEV_MODE")
    assert on_host["multiproc-fork"].startswith("sparkd's own environment (VLLM_WORKER_MULTIPROC_METHOD")
    in_container = {f.rule for f in lint(cfg(runtime="docker-run"), host_env=inherited) if f.level is ERR}
    assert in_container.isdisjoint({"dev-mode-beyond-loopback", "multiproc-fork"})
    exported = {f.rule: f.key for f in lint(cfg({"env": {"VLLM_SERVER_DEV_MODE": "0"}}), host_env=inherited)}
    assert "dev-mode-beyond-loopback" not in exported  # the launch's export wins over what it inherits


# ---- the measured starts


def test_measured_starts_are_read_from_both_files_and_never_fail(tmp_path: Path) -> None:
    assert measured_starts(tmp_path) == ()
    phases = {"launching": 48.0, "waiting_for_peer": 12.0, "loading_weights": 300.0, "compiling": 250.0,
              "kv_cache": 8.25, "graph_capture": 70.0, "api_starting": 20.0}  # the engine's part: 640.25 s
    timing = {"sparkd_s": 1.2, "vllm_start_s": 708.25, "phases_s": phases, "adopted": False}
    (tmp_path / "status.json").write_text(json.dumps({"start_timing": timing}))
    assert engine_seconds(timing) == 640.2 and measured_starts(tmp_path) == (640.2,)
    assert engine_seconds({**timing, "adopted": True}) is None and engine_seconds({"vllm_start_s": 9.0}) is None
    for n in range(KEEP + 3):
        record_start(tmp_path, 100.0 + n, at=1e9, launch_hash="h")
    record_start(tmp_path, float("nan"), at=1e9, launch_hash="h")  # not a time: not kept
    assert measured_starts(tmp_path) == (*[100.0 + n for n in range(3, KEEP + 3)], 640.2)
    record_start(tmp_path, 640.2, at=1e9, launch_hash="h")  # the status's last start, kept in both: once
    assert measured_starts(tmp_path).count(640.2) == 1
    (tmp_path / "start-times.json").write_text("{torn")
    (tmp_path / "status.json").write_text(json.dumps({"start_timing": {"phases_s": {"compiling": "x"}}}))
    assert measured_starts(tmp_path) == ()


# ---- check-config: the node's starts and the running daemon's environment


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SPARKD_"))})


def write_config(tmp_path: Path, launch: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'runtime = "process"\n[paths]\nstate_dir = "{tmp_path}"\n[launch]\nmodel = "/m"\nhost = '
                    f'"0.0.0.0"\n{launch}')
    return path


def test_check_config_judges_the_timeout_by_the_starts_this_node_measured(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[launch.env]\nVLLM_ENGINE_READY_TIMEOUT_S = "600"\n')
    assert check_config(path).returncode == 0
    record_start(tmp_path, 754.0, at=1e9, launch_hash="h")
    result = check_config(path)
    assert result.returncode == 2 and "[engine-ready-timeout-below-cold-start]" in result.stderr, result.stderr


def test_check_config_reads_the_running_daemons_own_environment(tmp_path: Path) -> None:
    """A ``sparkd run`` whose unit sets VLLM_SERVER_DEV_MODE=1: its vLLM inherits it, and check-config, run from a
    shell without it, judges the daemon's environment (a stand-in process titled as that daemon)."""
    path = write_config(tmp_path)
    assert check_config(path).returncode == 0
    daemon = subprocess.Popen(["bash", "-c", f'exec -a /usr/bin/sparkd {sys.executable} -c "import time; '
                               f'time.sleep(60)" run --config {path}'],
                              env={"PATH": os.environ["PATH"], "VLLM_SERVER_DEV_MODE": "1"})
    try:
        (tmp_path / "status.json").write_text(json.dumps({"daemon_pid": daemon.pid}))
        deadline = time.monotonic() + 10
        while b"run" not in Path(f"/proc/{daemon.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = check_config(path)
        assert result.returncode == 2, result.stderr
        assert "error: sparkd's own environment (VLLM_SERVER_DEV_MODE, inherited by vLLM)" in result.stderr
        (tmp_path / "other.toml").write_text(path.read_text())
        assert check_config(tmp_path / "other.toml").returncode == 0  # another config: not that daemon's
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)


@pytest.mark.anyio
async def test_the_preflight_fails_a_launch_whose_timeout_a_measured_start_outlasts(tmp_path: Path) -> None:
    from sparkd.launch.render import render
    from sparkd.preflight.base import PreflightContext, Verdict
    from sparkd.preflight.container import check_container
    from sparkd.runtime.process import ProcessRuntime
    from sparkd.supervisor.failures import FailureClass

    config = cfg({"env": {"VLLM_ENGINE_READY_TIMEOUT_S": "600"}}, paths={"state_dir": str(tmp_path)})
    ctx = PreflightContext(cfg=config, spec=render(config), runtime=ProcessRuntime(tmp_path))
    assert (await check_container(ctx)).verdict is Verdict.ok
    record_start(tmp_path, 754.0, at=1e9, launch_hash="h")
    result = await check_container(ctx)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert "VLLM_ENGINE_READY_TIMEOUT_S is 600 s, but this node's longest measured start took 754 s" in result.found
