"""What every control command shares: the daemon surface it runs against, its reply, its request parsing.

A command is a :class:`~sparkd.commands.command.Command` (its shape: :mod:`sparkd.commands.command`); an
operator's is one module (circus's way) whose ``COMMAND`` names its route (``/v1/<name>``), its ``Request`` (with
``from_params``/``to_params``: the parameters both sides agree on), its ``execute(control, request)`` on the
daemon's side and its ``render``/``exit_code`` on sparkctl's. Its docstring is its protocol. Every answer is one
envelope: ``{"ok": true, "result": …}`` or ``{"ok": false, "error": "…", "result": <status or null>}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # annotations only: sparkctl imports this module and must start fast
    from sparkd.commands.statusdoc import Status
    from sparkd.supervisor import vocabulary as v


Method = Literal["GET", "POST"]


class Route(Protocol):
    """Where a command is served (``/v1/<name>``): what a caller needs to reach it."""

    @property
    def name(self) -> str: ...

    @property
    def method(self) -> Method: ...

    @property
    def path(self) -> str: ...


class BadRequest(ValueError):
    """A request the daemon cannot parse: 400, naming the parameter."""


@dataclass(frozen=True)
class NoParams:
    """The request of a command that takes no parameters."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> NoParams:
        return cls()

    def to_params(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class Reply:
    ok: bool
    result: Any = None
    error: str | None = None
    code: int = 200
    then: Callable[[], None] | None = None  # run once the answer is sent (a hand-over exits after answering)

    def envelope(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "result": self.result}
        return {"ok": False, "error": self.error, "result": self.result}


@dataclass(frozen=True)
class Stream:
    """A streamed text answer (``sparkctl logs -f``)."""

    lines: AsyncIterator[str]


def ok(result: Any = None) -> Reply:
    return Reply(True, result)


def refused(error: str, result: Any = None, code: int = 409) -> Reply:
    return Reply(False, result, error, code)


class Group(Protocol):
    """The group a node belongs to, as commands see it."""

    async def forward(self, command: Route) -> tuple[bool, dict[str, Any]]:
        """A worker's operator command, carried out by its head for the whole group: (done, the head's envelope
        with ``forwarded_to``)."""

    def on_report(self, peer: str, failure: dict[str, Any] | None) -> bool: ...

    async def reload_workers(self) -> list[str]:
        """Every worker reloads its config on disk; the problems of those that refused (none: all took it)."""


class Checks(Protocol):
    """The daemon's side of the group's checks (``sparkd.daemon.groupchecks.GroupChecks``)."""

    async def fabric_answer(self, address: str | None, size: int, master: tuple[str, int] | None,
                            timeout_s: float) -> dict[str, Any]: ...

    async def bandwidth_server(self, seconds: int, port: int) -> dict[str, Any]: ...

    async def manifest(self, *, full: bool) -> dict[str, Any]:
        """This node's manifest (``{"node", "manifest"}``)."""

    async def weights_view(self, *, full: bool) -> dict[str, Any]:
        """What ``sparkctl weights`` shows: the group's comparison on a head, this node's manifest elsewhere."""


class Control(Protocol):
    """The daemon's surface for commands (``sparkd.daemon.control.DaemonControl``)."""

    @property
    def worker(self) -> bool:
        """This node is a led rank of a group: operator commands go to the head."""

    @property
    def group(self) -> Group | None: ...

    @property
    def checks(self) -> Checks: ...

    @property
    def incidents_root(self) -> Path: ...

    @property
    def stop_timeout_s(self) -> float: ...

    def status(self) -> Status: ...

    def refusal(self, command: str) -> str | None: ...

    async def submit(self, obs: v.Observation) -> None:
        """Post ``obs`` and return once the supervising loop has applied it."""

    async def settle(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()`` holds after a change of state (or the timeout); whether it held."""

    def running(self) -> bool:
        """An instance exists on this node."""

    def stopped(self) -> bool:
        """Nothing runs here and the lifecycle rests (stopped or failed)."""

    def vllm_left(self) -> list[int]: ...

    def log_tail(self, lines: int) -> list[str]: ...

    def log_entries(self, lines: int, since: float | None) -> list[tuple[float, str]]:
        """The last lines with the wall time each came (only those since ``since``)."""

    def follow_log(self, backlog: list[str]) -> AsyncIterator[str]: ...

    async def preflight(self, *, dry_run: bool) -> Any: ...

    def last_preflight(self) -> list[dict[str, Any]]: ...

    async def reload(self) -> Any:
        """Read and validate the config on disk; take it on when valid (a ``ReloadReport``)."""

    def handover(self) -> None:
        """Exit now, leaving vLLM running for the next sparkd to adopt."""

    async def recreate(self) -> tuple[bool, str]:
        """Replace vLLM's container from the config: (done, the sentence that says what happened)."""

    async def flight_records(self, *, since: float | None, until: float | None, local: bool) -> dict[str, Any]:
        """This node's flight-recorder runs (and, with ``until``, its records in the range) and, unless ``local``,
        every peer's (``sparkd.commands.recorder``)."""


def flag(params: Mapping[str, str], name: str) -> bool:
    value = params.get(name, "")
    if value not in ("", "0", "1", "true", "false", "yes", "no"):
        raise BadRequest(f"{name}: expected 1 or 0, got {value!r}")
    return value in ("1", "true", "yes")


def number(params: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a whole number, got {raw!r}") from None
    if value < minimum:
        raise BadRequest(f"{name}: must be at least {minimum}, got {value}")
    return value

