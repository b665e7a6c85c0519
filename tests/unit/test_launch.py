"""Launch rendering: argv, environment, and a script that delivers JSON flags byte for byte."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.config import config_from_mapping
from sparkd.launch.render import RECOMMENDED_ENV, health_settings, render, render_script

TABLES = {
    "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE", "custom_ops": ["all"]},
    "speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 2},
    "default_chat_template_kwargs": {"thinking": True, "note": 'it\'s "quoted" $HOME `x` \\ ;&|'},
}


def make(launch=None, node=None, cluster=None):
    data = {
        "runtime": "process",
        "node": node or {"role": "single"},
        "launch": {"model": "/models/DeepSeek-V4-Flash", **(launch or {})},
    }
    if cluster:
        data["cluster"] = cluster
    return config_from_mapping(data, env={})


def test_argv_is_vllm_serve_model_and_typed_flags() -> None:
    spec = render(
        make(
            {
                "served_model_name": "ds4",
                "max_num_seqs": 8,
                "enable_prefix_caching": False,
                "trust_remote_code": True,
                "extra_args": ["--foo", "bar"],
            }
        )
    )
    assert spec.argv[:3] == ("vllm", "serve", "/models/DeepSeek-V4-Flash")
    argv = list(spec.argv)
    assert argv[argv.index("--served-model-name") + 1] == "ds4"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert "--no-enable-prefix-caching" in argv and "--trust-remote-code" in argv
    assert argv[-2:] == ["--foo", "bar"]


def test_worker_renders_headless_rank_and_master() -> None:
    spec = render(
        make(
            node={"role": "worker", "rank": 1, "address": "10.0.0.2"},
            cluster={"master_addr": "10.0.0.1", "master_port": 25000},
        )
    )
    tail = list(spec.argv[-9:])
    assert tail == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "25000",
        "--headless",
    ]
    assert spec.env["VLLM_HOST_IP"] == "10.0.0.2"


def test_environment_is_recommended_defaults_under_the_config() -> None:
    env = render(make({"env": {"OMP_NUM_THREADS": "4", "X": "y"}})).env
    plugin = {"SPARKD_PROBE_DIR": "/run/sparkd/probe", "SPARKD_DRAIN_ADMIT": "1"}
    assert env == {**RECOMMENDED_ENV, "OMP_NUM_THREADS": "4", "X": "y", **plugin}
    assert render(make({"default_env": False, "env": {"X": "y"}})).env == {"X": "y", **plugin}


def fake_vllm(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "argv.json"
    exe = tmp_path / "vllm"
    exe.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, record


@pytest.mark.parametrize(
    "wrapper",
    [
        ["bash", "{script}"],
        ["bash", "-c", "bash {script}"],
        ["sh", "-c", "bash -c 'bash {script}'"],
    ],
)
def test_json_flags_arrive_byte_for_byte_through_shells(tmp_path: Path, wrapper: list[str]) -> None:
    exe, record = fake_vllm(tmp_path)
    spec = render(make({"executable": str(exe), **TABLES, "env": {"WEIRD": "a b 'c' $d"}}))
    script = tmp_path / "launch.sh"
    script.write_text(render_script(spec))
    cmd = [part.replace("{script}", str(script)) for part in wrapper]
    subprocess.run(cmd, check=True, timeout=60, env={"PATH": os.environ["PATH"]})
    got = json.loads(record.read_text())
    assert got["argv"] == list(spec.argv[1:])
    for name, table in TABLES.items():
        flag = "--" + name.replace("_", "-")
        assert got["argv"][got["argv"].index(flag) + 1] == json.dumps(table)
    assert got["env"]["WEIRD"] == "a b 'c' $d"
    assert got["env"]["UCX_MEM_MMAP_HOOK_MODE"] == "none"


def test_script_is_strict_and_ends_in_exec() -> None:
    text = render_script(render(make(TABLES)))
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    assert lines[-1].startswith("    --") and any(line.startswith("exec vllm serve") for line in lines)


def test_user_script_is_run_with_bash_and_extra_args() -> None:
    spec = render(make({"script": "/workspace/vllm-head.sh", "extra_args": ["--port", "8001"]}))
    assert spec.argv == ("bash", "/workspace/vllm-head.sh", "--port", "8001")


def test_render_cli_prints_script_and_json(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "m"\ncompilation_config = { level = 3 }\n')
    run = [sys.executable, "-m", "sparkd.cli", "render", "--config", str(path)]
    script = subprocess.run(run, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "--compilation-config '{\"level\": 3}'" in script
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True, timeout=60).stdout)
    assert data["argv"][:3] == ["vllm", "serve", "m"] and data["env"]["OMP_NUM_THREADS"] == "8"


@pytest.mark.parametrize(
    ("launch", "health", "expected"),
    [
        ({}, {}, 1800.0),  # sparkd's default env sets VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
        ({"env": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "900"}}, {}, 900.0),
        ({"default_env": False}, {}, None),  # unset: vLLM's own default applies
        ({}, {"execute_timeout_s": 120}, 120.0),  # the config says so explicitly
        ({"env": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "soon"}}, {}, None),  # lint refuses it
    ],
)
def test_health_settings_carry_vllms_execute_timeout(launch: dict, health: dict, expected: float | None) -> None:
    """The stall check waits out what vLLM itself would survive: the timeout vLLM runs with."""
    cfg = config_from_mapping({"runtime": "process", "node": {"role": "single"},
                               "launch": {"model": "m", **launch}, "health": health}, env={})
    assert health_settings(cfg).execute_timeout_s == expected
