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
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import BadRequest, Reply, ok, refused
from sparkd.commands.command import Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control


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
        return {"address": self.address, "size": self.size, "timeout_s": self.timeout_s,
                "master": list(self.master) if self.master else None}


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

    def to_params(self) -> dict[str, bool]:
        return {"full": self.full}  # a query string carries it as 1 or 0


async def _fabric(control: Control, request: FabricRequest) -> Reply:
    return ok(await control.checks.fabric_answer(request.address, request.size, request.master, request.timeout_s))


async def _bandwidth(control: Control, request: BandwidthRequest) -> Reply:
    if control.running():
        return refused("its rank is running: the bandwidth run would compete with NCCL")
    return ok(await control.checks.bandwidth_server(request.seconds, request.port))


async def _weights(control: Control, request: WeightsRequest) -> Reply:
    return ok(await control.checks.manifest(full=request.full))


RANK_FABRIC: Command[FabricRequest, dict[str, Any]] = Command("rank/fabric", "POST", FabricRequest, _fabric)
RANK_BANDWIDTH: Command[BandwidthRequest, dict[str, Any]] = Command("rank/bandwidth", "POST", BandwidthRequest,
                                                                    _bandwidth)
RANK_WEIGHTS: Command[WeightsRequest, dict[str, Any]] = Command("rank/weights", "POST", WeightsRequest, _weights)

GROUP_CHECKS = (RANK_FABRIC, RANK_BANDWIDTH, RANK_WEIGHTS)
