"""Lint rules from the field reports: each known-bad setting is refused unless allowed, by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.config import config_from_mapping
from sparkd.lint import Level, lint

GOOD_ENV = {"UCX_MEM_MMAP_HOOK_MODE": "none", "UCX_RCACHE_MAX_UNRELEASED": "1024", "OMP_NUM_THREADS": "8"}


def cfg(node=None, launch=None, cluster=None, allow=()):
    data = {
        "runtime": "process",
        "node": node or {"role": "single"},
        "launch": {"model": "m", **(launch or {})},
        "lint": {"allow": list(allow)},
    }
    if cluster:
        data["cluster"] = cluster
    return config_from_mapping(data, env={})


def rules(findings, level=Level.error):
    return {(f.rule, f.key) for f in findings if f.level is level}


PAIR = {"master_addr": "10.0.0.1"}


@pytest.mark.parametrize(
    ("config", "rule", "key"),
    [
        (
            cfg(launch={"env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}}),
            "multiproc-fork",
            "launch.env.VLLM_WORKER_MULTIPROC_METHOD",
        ),
        (
            cfg(node={"role": "worker", "rank": 1}, launch={"headless": False}, cluster=PAIR),
            "worker-not-headless",
            "launch.headless",
        ),
        (cfg(node={"role": "head"}, launch={"headless": True}, cluster=PAIR), "head-headless", "launch.headless"),
        (cfg(node={"role": "head", "rank": 1}, cluster=PAIR), "rank-role-mismatch", "node.rank"),
        (cfg(node={"role": "worker", "rank": 0}, cluster=PAIR), "rank-role-mismatch", "node.rank"),
        (
            cfg(node={"role": "worker", "rank": 1}, launch={"node_rank": 0}, cluster=PAIR),
            "rank-role-mismatch",
            "launch.node_rank",
        ),
        (cfg(node={"role": "head"}), "missing-master-addr", "cluster.master_addr"),
        (cfg(launch={"nnodes": 2}), "single-multinode", "node.role"),
        (cfg(launch={"extra_args": ["--max-num-seqs", "4"]}), "extra-arg-duplicates-field", "launch.extra_args[0]"),
        (
            cfg(launch={"env": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30m"}}),
            "execute-timeout-not-integer",
            "launch.env.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
        ),
    ],
)
def test_known_bad_settings_are_errors_naming_the_key(config, rule: str, key: str) -> None:
    assert (rule, key) in rules(lint(config))


def test_an_allowed_rule_is_accepted() -> None:
    config = cfg(launch={"env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}}, allow=["multiproc-fork"])
    assert "multiproc-fork" not in {f.rule for f in lint(config)}


def test_good_pair_configs_are_clean() -> None:
    head = cfg(node={"role": "head"}, cluster=PAIR)
    worker = cfg(node={"role": "worker", "rank": 1}, cluster=PAIR)
    assert lint(head) == [] and lint(worker) == []


@pytest.mark.parametrize("name", sorted(GOOD_ENV))
def test_missing_recommended_env_is_a_warning(name: str) -> None:
    env = {k: v for k, v in GOOD_ENV.items() if k != name}
    findings = lint(cfg(launch={"default_env": False, "env": env}))
    assert rules(findings, Level.warning) == {(f"missing-{name.lower().replace('_', '-')}", f"launch.env.{name}")}
    assert rules(findings) == set()
    assert lint(cfg(launch={"default_env": False, "env": GOOD_ENV})) == []


def test_ucx_hook_mode_other_than_none_is_a_warning() -> None:
    findings = lint(cfg(launch={"env": {"UCX_MEM_MMAP_HOOK_MODE": "reloc"}}))
    assert ("missing-ucx-mem-mmap-hook-mode", "launch.env.UCX_MEM_MMAP_HOOK_MODE") in rules(findings, Level.warning)


def test_enforce_eager_on_a_cuda_graph_profile_is_a_warning() -> None:
    findings = lint(cfg(launch={"profile": "balanced", "enforce_eager": True}))
    assert ("enforce-eager-cuda-graphs", "launch.enforce_eager") in rules(findings, Level.warning)
    assert lint(cfg(launch={"enforce_eager": True})) == []


def test_script_ending_in_a_comment_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "vllm-head.sh"
    script.write_text("#!/bin/bash\nvllm serve /models/m \\\n  --port 8000\n# --max-num-seqs 8\n\n")
    findings = lint(cfg(launch={"script": str(script)}))
    assert ("script-ends-in-comment", "launch.script") in rules(findings)
    script.write_text("#!/bin/bash\nvllm serve /models/m --port 8000\n")
    assert lint(cfg(launch={"script": str(script)})) == []


def test_check_config_prints_warnings_and_exits_0(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "c.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "m"\ndefault_env = false\n')
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "warning: launch.env.UCX_MEM_MMAP_HOOK_MODE" in result.stderr
    path.write_text('runtime = "process"\n[launch]\nmodel = "m"\n[launch.env]\nVLLM_WORKER_MULTIPROC_METHOD = "fork"\n')
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "error: launch.env.VLLM_WORKER_MULTIPROC_METHOD" in result.stderr


def test_a_pair_needs_the_peer_token() -> None:
    data = {"runtime": "process", "node": {"role": "head"}, "launch": {"model": "m"},
            "cluster": {"master_addr": "10.0.0.1", "peers": ["10.0.0.2"]}}
    findings = lint(config_from_mapping(data, env={}))
    assert ("peers-without-token", "api.token_file") in rules(findings)
    data["api"] = {"token_file": "/etc/sparkd/peer.token"}
    assert lint(config_from_mapping(data, env={})) == []


def test_disable_log_stats_is_a_warning_naming_what_it_blinds() -> None:
    """--disable-log-stats removes the vllm:* metrics and the throughput line the stall check reads."""
    findings = lint(cfg(launch={"env": GOOD_ENV, "extra_args": ["--disable-log-stats"]}))
    warnings = [f for f in findings if f.rule == "disable-log-stats"]
    assert len(warnings) == 1 and warnings[0].level is Level.warning
    assert warnings[0].key == "launch.extra_args[0]" and "vllm:* metric" in warnings[0].message
    assert not [f for f in lint(cfg(launch={"env": GOOD_ENV})) if f.rule == "disable-log-stats"]
