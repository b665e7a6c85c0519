"""Lint rules from the field reports: each known-bad setting is refused unless allowed, by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.config import config_from_mapping
from sparkd.launch.lint import Level, lint

GOOD_ENV = {"UCX_MEM_MMAP_HOOK_MODE": "none", "UCX_RCACHE_MAX_UNRELEASED": "1024", "OMP_NUM_THREADS": "8",
            "VLLM_ENGINE_READY_TIMEOUT_S": "3600"}


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
    script.write_text("#!/bin/bash\nvllm serve /models/m --port 8000 --shutdown-timeout 120\n")
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


# ---- the effective launch: every source of the environment, the user's script, the container ------------------


def docker(container=None, launch=None, node=None, cluster=None):
    data = {"runtime": "docker-run", "node": node or {"role": "single"},
            "container": {"image": "img", "mounts": [{"source": "/c/vllm", "target": "/root/.cache/vllm"},
                                                     {"source": "/c/fi", "target": "/root/.cache/flashinfer"}],
                          **(container or {})},
            "launch": {"model": "m", **(launch or {})}}
    if cluster:
        data["cluster"] = cluster
    return config_from_mapping(data, env={})


FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


def test_fork_is_an_error_wherever_it_is_set(tmp_path: Path) -> None:
    assert ("multiproc-fork", "container.env.VLLM_WORKER_MULTIPROC_METHOD") in rules(lint(docker({"env": FORK})))
    assert ("multiproc-fork", "the ENV of image img") in rules(lint(docker(), image_env=FORK))
    # [launch.env] is exported by the launch script: it wins over the image's and the container's value.
    assert "multiproc-fork" not in {f.rule for f in lint(docker(
        {"env": FORK}, {"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}), image_env=FORK)}
    script = tmp_path / "serve.sh"
    script.write_text("export VLLM_WORKER_MULTIPROC_METHOD=fork\nexec vllm serve /models/m\n")
    assert "multiproc-fork" in {f.rule for f in lint(cfg(launch={"script": str(script)}))}


def test_script_mode_still_checks_rank_and_headless(tmp_path: Path) -> None:
    script = tmp_path / "vllm-worker.sh"
    script.write_text("#!/bin/bash\nexport OMP_NUM_THREADS=8\nexec vllm serve /models/m \\\n"
                      "  --gpu-memory-utilization 0.85 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1\n")
    worker = cfg(node={"role": "worker", "rank": 1}, launch={"script": str(script)}, cluster=PAIR)
    found = {(f.rule, f.key): f.message for f in lint(worker) if f.level is Level.error}
    assert "launches --node-rank 0, but this node's rank is 1" in found[("rank-role-mismatch", "launch.script")]
    assert ("worker-not-headless", "launch.script") in found
    script.write_text("exec vllm serve /models/m --nnodes 2 --node-rank 1 ${HEADLESS:+--headless}\n")
    assert rules(lint(worker)) == set()  # an expansion may hold --headless: not judged
    head = cfg(node={"role": "head"}, launch={"script": str(script)}, cluster=PAIR)
    script.write_text('exec vllm serve /models/m --nnodes 2 --node-rank 0 --headless "$@"\n')
    assert ("head-headless", "launch.script") in rules(lint(head))


def test_compile_caches_not_on_a_mount_are_a_warning() -> None:
    assert "compile-cache-not-persisted" not in {f.rule for f in lint(docker())}
    assert "compile-cache-not-persisted" not in {f.rule for f in lint(docker({"mounts": []}))}, \
        "docker-run binds [container] compile_cache_dir there itself"
    bare = lint(docker({"mounts": [], "compile_cache_dir": False}))
    warned = [f.message for f in bare if f.rule == "compile-cache-not-persisted"]
    assert len(warned) == 2 and "/root/.cache/vllm" in warned[0] and "/root/.cache/flashinfer" in warned[1]
    moved = docker({"mounts": [{"source": "/hf", "target": "/cache"}, {"source": "/fi", "target": "/w"}],
                    "env": {"VLLM_CACHE_ROOT": "/cache/vllm", "FLASHINFER_WORKSPACE_BASE": "/w"}})
    assert "compile-cache-not-persisted" not in {f.rule for f in lint(moved)}
    assert "compile-cache-not-persisted" not in {f.rule for f in lint(cfg())}  # on the host they persist


def test_rdma_without_devices_or_memlock_is_a_warning() -> None:
    pair = {"master_addr": "10.0.0.1", "nnodes": 2}
    bare = {(f.rule, f.key) for f in lint(docker(node={"role": "head"}, cluster=pair))}
    assert {("rdma-no-devices", "container.devices"), ("rdma-memlock", "container.ulimits")} <= bare
    ready = docker({"devices": ["/dev/infiniband"], "ulimits": {"memlock": -1}}, node={"role": "head"},
                   cluster=pair)
    assert not {"rdma-no-devices", "rdma-memlock"} & {f.rule for f in lint(ready)}
    assert not {"rdma-no-devices", "rdma-memlock"} & {f.rule for f in lint(docker({"privileged": True},
                                                                                    node={"role": "head"},
                                                                                    cluster=pair))}
    off = docker({"env": {"NCCL_IB_DISABLE": "1"}}, node={"role": "head"}, cluster=pair)
    assert not {"rdma-no-devices", "rdma-memlock"} & {f.rule for f in lint(off)}


def test_a_short_engine_ready_timeout_is_a_warning() -> None:
    findings = lint(cfg(launch={"env": {"VLLM_ENGINE_READY_TIMEOUT_S": "600"}}))
    assert ("missing-vllm-engine-ready-timeout-s", "launch.env.VLLM_ENGINE_READY_TIMEOUT_S") in rules(
        findings, Level.warning)


def test_disable_log_stats_is_a_warning_naming_what_it_blinds() -> None:
    """--disable-log-stats removes the vllm:* metrics and the throughput line the stall check reads."""
    findings = lint(cfg(launch={"env": GOOD_ENV, "extra_args": ["--disable-log-stats"]}))
    warnings = [f for f in findings if f.rule == "disable-log-stats"]
    assert len(warnings) == 1 and warnings[0].level is Level.warning
    assert warnings[0].key == "launch.extra_args[0]" and "vllm:* metric" in warnings[0].message
    assert not [f for f in lint(cfg(launch={"env": GOOD_ENV})) if f.rule == "disable-log-stats"]
