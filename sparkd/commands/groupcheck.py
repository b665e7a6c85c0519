"""What the head asks of each worker before a start, beside the rank commands (``/v1/rank/<name>``, peer link):

- ``POST /v1/rank/fabric`` ``{address, size, master, timeout_s}``: this node's fabric link and GID now, a small
  and a ``size``-byte don't-fragment echo to the head's ``address``, a connect to ``master`` (``[host, port]``).
- ``POST /v1/rank/bandwidth`` ``{seconds, port}``: one ``ib_write_bw`` server run where vLLM runs.
- ``POST /v1/rank/weights`` ``{full}``: this node's manifest of the model directory.

Each is answered by the daemon's ``Checks`` (``control.checks``, :mod:`sparkd.commands.base`); the head compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkd.commands.base import BadRequest, Control, Reply, ok, refused


def _int(params: Mapping[str, Any], name: str, low: int, high: int, default: int | None = None) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadRequest(f"{name}: expected a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{name}: expected a whole number, got {value!r}") from None
    if not low <= number <= high:
        raise BadRequest(f"{name}: must be between {low} and {high}, got {number}")
    return number


@dataclass(frozen=True)
class FabricRequest:
    address: str | None
    size: int
    master: tuple[str, int] | None
    timeout_s: float

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> FabricRequest:
        address = params.get("address")
        if address is not None and not isinstance(address, str):
            raise BadRequest("address: expected a string")
        master = params.get("master")
        if master is not None and not (isinstance(master, list) and len(master) == 2 and isinstance(master[0], str)):
            raise BadRequest("master: expected [host, port]")
        timeout = params.get("timeout_s", 1.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 10:
            raise BadRequest("timeout_s: expected a number of seconds up to 10")
        return cls(address, _int(params, "size", 68, 65535),
                   (master[0], _int({"port": master[1]}, "port", 1, 65535)) if master else None, float(timeout))

    def to_params(self) -> dict[str, Any]:
        return {"address": self.address, "size": self.size, "master": list(self.master) if self.master else None,
                "timeout_s": self.timeout_s}


@dataclass(frozen=True)
class BandwidthRequest:
    seconds: int
    port: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BandwidthRequest:
        return cls(_int(params, "seconds", 1, 30), _int(params, "port", 1, 65535))

    def to_params(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "port": self.port}


@dataclass(frozen=True)
class WeightsRequest:
    full: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> WeightsRequest:
        full = params.get("full", False)
        if full in ("1", "true", "yes"):
            full = True
        elif full in ("", "0", "false", "no"):
            full = False
        if not isinstance(full, bool):
            raise BadRequest(f"full: expected true or false, got {full!r}")
        return cls(full)

    def to_params(self) -> dict[str, str]:
        return {"full": "1" if self.full else "0"}


class RankFabric:
    NAME, METHOD, Request = "rank/fabric", "POST", FabricRequest

    @staticmethod
    async def execute(control: Control, request: FabricRequest) -> Reply:
        return ok(await control.checks.fabric_answer(request.address, request.size, request.master,
                                                     request.timeout_s))


class RankBandwidth:
    NAME, METHOD, Request = "rank/bandwidth", "POST", BandwidthRequest

    @staticmethod
    async def execute(control: Control, request: BandwidthRequest) -> Reply:
        if control.running():
            return refused("its rank is running: the bandwidth run would compete with NCCL")
        return ok(await control.checks.bandwidth_server(request.seconds, request.port))


class RankWeights:
    NAME, METHOD, Request = "rank/weights", "POST", WeightsRequest

    @staticmethod
    async def execute(control: Control, request: WeightsRequest) -> Reply:
        return ok(await control.checks.manifest(full=request.full))


GROUP_CHECKS = (RankFabric, RankBandwidth, RankWeights)
