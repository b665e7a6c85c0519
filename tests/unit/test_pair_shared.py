"""What the ranks of a pair must share (sparkd/cluster/shared.py): the launch settings and environment, and the
image under each ``[cluster] image_match`` mode. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from sparkd.cluster.shared import (
    differences,
    image_difference,
    rank_gone,
    rank_waiting_or_later,
    shared_env,
    shared_settings,
)
from sparkd.config import config_from_mapping
from sparkd.runtime.base import ImageIdentity


def config(launch: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
           container_env: dict[str, str] | None = None) -> Any:
    data = {"runtime": "docker-exec", "node": node or {"role": "head"},
            "container": {"image": "img", "env": container_env or {}},
            "cluster": {"master_addr": "10.0.0.1", "nnodes": 2}, "launch": {"model": "m", **(launch or {})}}
    return config_from_mapping(data, env={})


HEAD = config({"env": {"VLLM_HOST_IP": "10.0.0.1", "NCCL_SOCKET_IFNAME": "bond0"}})
WORKER = config({"env": {"VLLM_HOST_IP": "10.0.0.2", "NCCL_SOCKET_IFNAME": "enp1"}},
                node={"role": "worker", "rank": 1})


def test_the_ranks_own_settings_are_not_compared() -> None:
    assert differences(shared_settings(HEAD), shared_settings(WORKER), peer="spark2") == []


@pytest.mark.parametrize(
    ("launch", "container_env", "key"),
    [
        ({"enable_expert_parallel": True}, None, "enable_expert_parallel"),
        ({"speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 3}}, None, "speculative_config"),
        ({"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, None, "compilation_config"),
        ({"block_size": 64}, None, "block_size"),
        ({"max_num_seqs": 16}, None, "max_num_seqs"),
        ({"max_num_batched_tokens": 4096}, None, "max_num_batched_tokens"),
        ({"kv_cache_dtype": "fp8"}, None, "kv_cache_dtype"),
        ({"max_model_len": 65536}, None, "max_model_len"),
        ({"env": {"VLLM_USE_B12X_MOE": "1"}}, None, "env.VLLM_USE_B12X_MOE"),
        ({"env": {"UCX_RCACHE_MAX_UNRELEASED": "inf"}}, None, "env.UCX_RCACHE_MAX_UNRELEASED"),
        ({}, {"VLLM_DSPARK_LOCAL_ARGMAX": "1"}, "env.VLLM_DSPARK_LOCAL_ARGMAX"),
    ],
)
def test_a_setting_that_must_match_is_named(launch: dict[str, Any], container_env: dict[str, str] | None,
                                            key: str) -> None:
    other = config(launch, node={"role": "worker", "rank": 1}, container_env=container_env)
    [phrase] = differences(shared_settings(HEAD), shared_settings(other), peer="spark2")
    assert phrase.startswith(f"{key} is ") and phrase.endswith("on spark2")


def test_shared_env_patterns() -> None:
    env = {"VLLM_HOST_IP": "a", "VLLM_X": "1", "NCCL_IB_HCA": "h", "NCCL_IB_DISABLE": "0", "PATH": "/bin"}
    assert shared_env(env, ["VLLM_*", "NCCL_IB_DISABLE", "!VLLM_HOST_IP"]) == {"NCCL_IB_DISABLE": "0", "VLLM_X": "1"}


A = ImageIdentity("sha256:aaa", ("vllm@sha256:111",), {"org.opencontainers.image.revision": "r1"}).to_json()
B = ImageIdentity("sha256:bbb", ("vllm@sha256:111", "mirror/vllm@sha256:111"),
                  {"org.opencontainers.image.revision": "r1"}).to_json()
LOADED = ImageIdentity("sha256:bbb", (), {"org.opencontainers.image.revision": "r2"}).to_json()


@pytest.mark.parametrize(
    ("mode", "local", "remote", "words"),
    [
        ("id", A, A, None),
        ("id", A, B, "the image is sha256:aaa here but sha256:bbb on spark2"),
        ("id", "sha256:aaa", "sha256:aaa", None),  # a bare id, as status reported it before
        ("repo-digest", A, B, None),  # pulled from one manifest: ids may differ per node
        ("repo-digest", A, LOADED, "the image has no repo digest on spark2 (built or loaded locally)"),
        ("label", A, B, None),  # built on each node from one revision (field report 004)
        ("label", A, LOADED, "the image's label org.opencontainers.image.revision is 'r1' here but 'r2' on spark2"),
        ("label", A, {"id": "sha256:ccc"}, "the image has no label org.opencontainers.image.revision on spark2"),
        ("off", A, LOADED, None),
        ("id", None, A, None),  # nothing to compare (a process runtime)
    ],
)
def test_image_match_modes(mode: str, local: Any, remote: Any, words: str | None) -> None:
    got = image_difference(local, remote, peer="spark2", mode=mode)
    assert got == words if words is None else (got or "").startswith(words), got


@pytest.mark.parametrize(("status", "gone", "waiting"), [
    ({"state": "ready", "pid": 7, "phase": "ready"}, False, True),
    ({"state": "starting", "pid": 7, "phase": "waiting_for_peer"}, False, True),
    ({"state": "starting", "pid": 7, "phase": "launching"}, False, False),  # not at the rendezvous yet
    ({"state": "starting", "pid": None, "phase": None}, False, False),
    ({"state": "preflight", "pid": None}, False, False),  # the head is preparing it: not a failed rank
    ({"state": "adopting", "pid": 7}, False, False),  # its sparkd restarted and is finding the rank
    ({"state": "stopping", "pid": 7}, True, False),
    ({"state": "backoff"}, True, False),
    ({"state": "failed"}, True, False),
    ({"state": "stopped"}, True, False),
    ({}, True, False),
], ids=lambda x: str(x) if not isinstance(x, dict) else x.get("state", "empty") + "-" + str(x.get("phase")))
def test_what_a_workers_status_says_about_its_rank(status: dict[str, Any], gone: bool, waiting: bool) -> None:
    assert rank_gone(status) is gone
    assert rank_waiting_or_later(status) is waiting
