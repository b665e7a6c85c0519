"""What the lifecycle commands (start, stop, restart, reset) share: refuse, forward, post, answer.

On a group's worker an operator command is carried out by the head for the whole group (``--local`` acts on
this rank alone, for maintenance); ``reset`` always acts locally (it only closes this node's breaker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import Reply, Value, flag, ok, refused
from sparkd.commands.command import Flag

if TYPE_CHECKING:  # the daemon's side: sparkctl imports this module for a TAB
    from sparkd.commands.port import Control, Route
    from sparkd.supervisor import vocabulary as v

LOCAL_RISK = ("--local acts on this node's rank alone: the other ranks lose their peer (a headless worker hangs, "
              "the head fails its next request) and the group restarts as a unit afterwards.")
LOCAL = Flag("local", "Act on this node's rank only (maintenance).", warning=LOCAL_RISK)


class Request(Value):
    __slots__ = ("local",)

    def __init__(self, local: bool = False) -> None:
        self.local = local

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        return cls(local=flag(params, "local"))

    def to_params(self) -> dict[str, str]:
        return {"local": "1"} if self.local else {}


NOW = Flag("now", "Do not wait for the requests in flight: skip vLLM's drain ([stop] drain_s), or cut short the "
                  "drain of a stop already running.")


class NowRequest(Value):
    """``stop`` and ``restart``: ``now`` skips the drain (or cuts short the one running)."""

    __slots__ = ("local", "now")

    def __init__(self, local: bool = False, now: bool = False) -> None:
        self.local = local
        self.now = now

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> NowRequest:
        return cls(local=flag(params, "local"), now=flag(params, "now"))

    def to_params(self) -> dict[str, str]:
        return {**({"local": "1"} if self.local else {}), **({"now": "1"} if self.now else {})}


async def act(control: Control, command: Route, observation: Callable[[], v.Observation],
              request: Request | NowRequest, *, forwardable: bool = True) -> Reply:
    if control.worker and forwardable and not request.local and control.group is not None:
        done, answer = await control.group.forward(command, request)
        if not done:
            return refused(answer.get("error") or "the head refused", control.status())
        return ok({**(answer.get("result") or {}), "forwarded_to": answer["forwarded_to"]})
    why = control.refusal(command.name)
    if why:
        return refused(why, control.status())
    await control.submit(observation())
    return ok(control.status())


def accepted(name: str, result: Mapping[str, Any]) -> str:
    where = f" by the head {result['forwarded_to']}" if result.get("forwarded_to") else ""
    state = result.get("state") or "?"
    return f"{name}: accepted{where} (state {state})"
