"""The container sparkd creates, from ``[container]`` (sparkd/config/container.py, sparkd/runtime/container_spec.py):
every new key validated at load naming the key, size spellings normalised, and the engine's create keywords."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from docker.types import Ulimit

from sparkd.config import Config, ConfigError, config_from_mapping
from sparkd.runtime.container_spec import container_options, missing_devices

GIB = 1024**3


def config(**container: Any) -> Config:
    data = {"runtime": "docker-exec", "container": {"name": "vllm", "image": "img", **container},
            "launch": {"model": "m"}}
    return config_from_mapping(data, env={})


def options(**container: Any) -> dict[str, Any]:
    return container_options(config(**container), entrypoint=["sleep", "infinity"], labels={}, rehearse=False,
                             name="x")


def test_gpus_are_requested_only_when_configured() -> None:
    assert options(gpus=None).get("device_requests") is None
    assert options(gpus="all")["device_requests"] == [
        {"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]
    assert options(gpus="2")["device_requests"][0]["Count"] == 2
    assert options(gpus="device=0,1")["device_requests"][0]["DeviceIDs"] == ["0", "1"]


@pytest.mark.parametrize("spelling", ["64gb", "64g", "64G", "64 GiB", "64GB", 64 * GIB, "68719476736"])
def test_size_spellings_are_one_size(spelling: Any) -> None:
    assert config(shm_size=spelling).container.shm_size == 64 * GIB
    assert config(memory=spelling).container.memory == 64 * GIB


@pytest.mark.parametrize(
    ("given", "soft", "hard"),
    [(-1, -1, -1), ("unlimited", -1, -1), (67108864, 67108864, 67108864), ("64m", 64 << 20, 64 << 20),
     ("1024:4096", 1024, 4096), ({"soft": 1024, "hard": 4096}, 1024, 4096), ({"hard": -1}, -1, -1)],
)
def test_ulimit_spellings(given: Any, soft: int, hard: int) -> None:
    limit = config(ulimits={"memlock": given}).container.ulimits["memlock"]
    assert (limit.soft, limit.hard) == (soft, hard)


def test_devices_and_mounts_are_normalised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cc = config(devices=["/dev/infiniband", "/dev/a:/dev/b", "/dev/c:r", "/dev/d/:/dev/e:rw"],
                mounts=[{"source": "~/.cache/vllm/", "target": "/root/.cache/vllm/"},
                        {"source": "hf-cache", "target": "/cache"}]).container
    assert cc.devices == ["/dev/infiniband:/dev/infiniband:rwm", "/dev/a:/dev/b:rwm", "/dev/c:/dev/c:r",
                          "/dev/d:/dev/e:rw"]
    assert [(m.source, m.target) for m in cc.mounts] == [
        (f"{tmp_path}/.cache/vllm", "/root/.cache/vllm"), ("hf-cache", "/cache")]


@pytest.mark.parametrize(
    ("container", "key", "words"),
    [
        ({"shm_size": "64 gallons"}, "container.shm_size", "is not a size"),
        ({"memory": "lots"}, "container.memory", "is not a size"),
        ({"ulimits": {"memlock": "plenty"}}, "container.ulimits", "is not a size"),
        ({"ulimits": {"nofile": "1024:512"}}, "container.ulimits.nofile", "above the hard limit"),
        ({"ulimits": {"memlocks": -1}}, "container.ulimits.memlocks", ""),
        ({"ulimits": {"nofile": {"softly": 1}}}, "container.ulimits", "soft and hard"),
        ({"devices": ["dev/infiniband"]}, "container.devices", "must be absolute"),
        ({"devices": ["/dev/x:/dev/y:rwx"]}, "container.devices", "'rwm'"),
        ({"mounts": [{"source": "./models", "target": "/models"}]}, "container.mounts.0.source", "volume name"),
        ({"mounts": [{"source": "/m", "target": "models"}]}, "container.mounts.0.target", "absolute"),
        ({"oom_score_adj": 2000}, "container.oom_score_adj", "less than or equal to 1000"),
        ({"user": "root;rm"}, "container.user", "is not NAME"),
        ({"runtime": "nvidia runtime"}, "container.runtime", "OCI runtime"),
        ({"security_opt": ["seccomp"]}, "container.security_opt", "security option"),
        ({"cap_add": ["IPC LOCK"]}, "container.cap_add", "capability"),
        ({"memory_swap": "8g"}, "container", "memory_swap needs memory"),
        ({"privileged": "yes please"}, "container.privileged", ""),
        ({"env": {"BAD-NAME": "1"}}, "container.env", "not a valid environment variable name"),
    ],
)
def test_bad_values_fail_at_load_naming_the_key(container: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(**container)
    assert any(p.startswith(key) and words in p for p in err.value.problems), err.value.problems


def test_every_key_reaches_the_create_call() -> None:
    got = options(privileged=True, devices=["/dev/infiniband"], ulimits={"memlock": -1, "stack": 67108864},
                  memory="100g", memory_swap="120g", oom_score_adj=500, runtime="nvidia", user="1000:1000",
                  security_opt=["seccomp=unconfined"], cap_add=["cap_ipc_lock"], shm_size="64gb")
    assert got["privileged"] is True
    assert got["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert got["ulimits"] == [Ulimit(name="memlock", soft=-1, hard=-1),
                              Ulimit(name="stack", soft=67108864, hard=67108864)]
    assert (got["mem_limit"], got["memswap_limit"], got["oom_score_adj"]) == (100 * GIB, 120 * GIB, 500)
    assert (got["runtime"], got["user"], got["security_opt"]) == ("nvidia", "1000:1000", ["seccomp=unconfined"])
    assert (got["cap_add"], got["shm_size"]) == (["IPC_LOCK"], 64 * GIB)
    plain = options()
    assert not {"privileged", "devices", "ulimits", "mem_limit", "oom_score_adj", "runtime", "user"} & set(plain)


def test_missing_devices_are_named(tmp_path: Path) -> None:
    present = tmp_path / "uverbs0"
    present.write_text("")
    cfg = config(devices=[str(present), f"{tmp_path}/absent:/dev/infiniband"])
    assert missing_devices(cfg) == [f"{tmp_path}/absent"]
    assert os.path.exists(present)
