"""The container sparkd creates, rendered from ``[container]`` (sparkd/runtime/container_spec.py): pure tables."""

from __future__ import annotations

from typing import Any

from sparkd.config import Config, config_from_mapping
from sparkd.runtime.container_spec import container_options


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
