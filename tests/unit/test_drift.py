"""Drift of an existing container from ``[container]`` (sparkd/runtime/drift.py): pure, over ``docker inspect``
data as the engine returns it (the shapes below are copied from dockerd 26's output)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.runtime.drift import container_drift

IMAGE = {"Id": "sha256:" + "a" * 64, "Config": {"Env": ["PATH=/usr/bin", "VLLM_USE_V1=1"], "User": ""}}
CONTAINER = {
    "Image": "sha256:" + "a" * 64,
    "Config": {"Image": "img:1", "Env": ["PATH=/usr/bin", "VLLM_USE_V1=1", "HF_HOME=/cache"], "User": ""},
    "Mounts": [{"Type": "bind", "Source": "/home/milo/models", "Destination": "/models", "RW": False},
               {"Type": "volume", "Name": "vllm-cache", "Source": "/var/lib/docker/volumes/vllm-cache/_data",
                "Destination": "/root/.cache/vllm", "RW": True}],
    "HostConfig": {
        "Privileged": True, "NetworkMode": "host", "IpcMode": "host", "ShmSize": 67108864,
        "Devices": [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband",
                     "CgroupPermissions": "rwm"}],
        "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}],
        "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}],
        "CapAdd": None, "Memory": 0, "OomScoreAdj": 0, "Runtime": "runc", "SecurityOpt": None,
        "MemorySwap": 0,
    },
}
SPEC: dict[str, Any] = {
    "name": "vllm_ds4", "image": "img:1", "privileged": True, "host_network": True, "host_ipc": True,
    "gpus": "all", "devices": ["/dev/infiniband"], "ulimits": {"memlock": -1}, "env": {"HF_HOME": "/cache"},
    "mounts": [{"source": "/home/milo/models", "target": "/models", "read_only": True},
               {"source": "vllm-cache", "target": "/root/.cache/vllm"}],
}


def config(probe: bool = False, **changes: Any) -> Config:
    return config_from_mapping({"runtime": "docker-exec", "container": {**SPEC, **changes},
                                "launch": {"model": "m"}, "health": {"step_probe": probe}}, env={})


def inspect(**host: Any) -> dict[str, Any]:
    data = copy.deepcopy(CONTAINER)
    data["HostConfig"].update(host)
    return data


def keys(cfg: Config, attrs: dict[str, Any], image: dict[str, Any] | None = IMAGE) -> dict[str, tuple[Any, Any]]:
    return {d.key: (d.configured, d.actual) for d in container_drift(cfg, attrs, image)}


def test_a_container_made_as_configured_has_no_drift() -> None:
    assert keys(config(), inspect()) == {}


@pytest.mark.parametrize(
    ("changes", "host", "key", "configured", "actual"),
    [
        ({"privileged": False}, {}, "container.privileged", False, True),
        ({}, {"Devices": []}, "container.devices", ["/dev/infiniband:/dev/infiniband:rwm"], []),
        ({}, {"Ulimits": None}, "container.ulimits", ["memlock=-1:-1"], []),
        ({"ulimits": {"memlock": -1, "stack": 67108864}}, {}, "container.ulimits", ["stack=67108864:67108864"], []),
        ({}, {"NetworkMode": "bridge"}, "container.host_network", True, False),
        ({}, {"IpcMode": "private"}, "container.host_ipc", True, False),
        ({"host_ipc": False, "shm_size": "64g"}, {"IpcMode": "private"}, "container.shm_size", 64 << 30, 67108864),
        ({"gpus": None}, {}, "container.gpus", [], ["count=-1 ids="]),
        ({"cap_add": ["IPC_LOCK"]}, {}, "container.cap_add", ["IPC_LOCK"], []),
        ({"memory": "100g"}, {}, "container.memory", 100 << 30, 0),
        ({"oom_score_adj": 500}, {}, "container.oom_score_adj", 500, 0),
        ({"runtime": "nvidia"}, {}, "container.runtime", "nvidia", "runc"),
        ({"security_opt": ["seccomp=unconfined"]}, {}, "container.security_opt", ["seccomp=unconfined"], []),
        ({"mounts": [{"source": "/home/milo/models", "target": "/models", "read_only": True}]}, {},
         "container.mounts", [], ["vllm-cache:/root/.cache/vllm"]),
        ({"env": {"HF_HOME": "/cache", "NCCL_IB_DISABLE": "0"}}, {}, "container.env", ["NCCL_IB_DISABLE=0"], []),
        ({"env": {}}, {}, "container.env", [], ["HF_HOME=/cache"]),
    ],
)
def test_each_difference_is_named_by_its_key(changes: dict[str, Any], host: dict[str, Any], key: str,
                                             configured: Any, actual: Any) -> None:
    assert keys(config(**changes), inspect(**host)) == {key: (configured, actual)}


def test_the_image_is_compared_by_id_and_by_name_when_it_is_not_here() -> None:
    moved = {**IMAGE, "Id": "sha256:" + "b" * 64}
    assert keys(config(), inspect(), moved) == {
        "container.image": ("img:1 (bbbbbbbbbbbb)", "img:1 (aaaaaaaaaaaa)")}
    assert keys(config(image="img:2"), inspect(), None) == {
        "container.image": ("img:2 (not on this node)", "img:1 (aaaaaaaaaaaa)")}
    assert keys(config(), inspect(), None) == {}  # the same name, the image gone: nothing to tell


def test_the_images_env_is_not_drift_but_a_changed_value_of_it_is() -> None:
    changed = inspect()
    changed["Config"]["Env"] = ["PATH=/usr/bin", "VLLM_USE_V1=0", "HF_HOME=/cache"]
    assert keys(config(), changed) == {"container.env": ([], ["VLLM_USE_V1=0"])}


def test_str_names_the_key_and_both_values() -> None:
    [difference] = container_drift(config(privileged=False), inspect(), IMAGE)
    assert str(difference) == "container.privileged: the config says False, the container has True"


def test_the_step_probes_mounts_are_wanted_while_it_is_on() -> None:
    """A container made before the probe (or with it off) lacks its mounts: drift names them, so that `sparkctl
    recreate` adds them; one made with them has no drift, and with the probe off they are no longer wanted."""
    from sparkd.vllm_probe import PLUGIN_DIR

    cfg = config(probe=True)
    missing = keys(cfg, inspect())["container.mounts"]
    assert (sorted(missing[0]), missing[1]) == (sorted(["/run/sparkd/probe:/run/sparkd/probe",
                                                        f"{PLUGIN_DIR}:{PLUGIN_DIR}:ro"]), [])
    made = inspect()
    made["Mounts"] += [{"Type": "bind", "Source": str(PLUGIN_DIR), "Destination": str(PLUGIN_DIR), "RW": False},
                       {"Type": "bind", "Source": "/run/sparkd/probe", "Destination": "/run/sparkd/probe", "RW": True}]
    assert keys(cfg, made) == {}
    assert sorted(keys(config(), made)["container.mounts"][1]) == sorted(missing[0])
