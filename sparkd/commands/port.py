"""The daemon's surface for commands (``sparkd.daemon.views.control.DaemonControl``), and what the server and the peer
link need of a command: types only, apart from :mod:`sparkd.commands.base` so that sparkctl, which imports a command
module on a TAB, never builds them (a command module imports this module for its annotations alone).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sparkd.commands.base import Method, Reply, Stream
    from sparkd.commands.statusdoc import Status
    from sparkd.supervisor import vocabulary as v


class Route(Protocol):
    """Where a command is served (``/v1/<name>``): what a caller needs to reach it."""

    @property
    def name(self) -> str: ...

    @property
    def method(self) -> Method: ...

    @property
    def path(self) -> str: ...


class Outgoing(Protocol):
    """A command's request as the wire carries it (``sparkd.commands.command.Params`` is one)."""

    def to_params(self) -> Mapping[str, object]: ...


class Served(Route, Protocol):
    """What the server needs of a command (:class:`sparkd.commands.command.Command`), whatever its request and
    result types."""

    @property
    def root_only(self) -> bool: ...

    def answer(self, control: Control, params: Mapping[str, Any]) -> Awaitable[Reply | Stream]: ...


class Group(Protocol):
    """The group a node belongs to, as commands see it."""

    async def forward(self, command: Route, request: Outgoing | None = None, *,
                      timeout_s: float | None = None) -> tuple[bool, dict[str, Any]]:
        """A worker's operator command (with ``request``'s parameters), carried out by its head for the whole group:
        (done, the head's envelope with ``forwarded_to``)."""

    def on_report(self, peer: str, failure: Mapping[str, Any] | None) -> bool: ...

    async def reload_workers(self) -> list[str]:
        """Every worker reloads its config on disk; the problems of those that refused (none: all took it)."""


class Checks(Protocol):
    """The daemon's side of the group's checks (``sparkd.daemon.effects.groupchecks.GroupChecks``)."""

    async def fabric_answer(self, address: str | None, size: int, master: tuple[str, int] | None,
                            timeout_s: float) -> dict[str, Any]: ...

    async def bandwidth_server(self, seconds: int, port: int) -> dict[str, Any]: ...

    async def manifest(self, *, full: bool) -> dict[str, Any]:
        """This node's manifest (``{"node", "manifest"}``)."""

    async def weights_view(self, *, full: bool) -> dict[str, Any]:
        """What ``sparkctl weights`` shows: the group's comparison on a head, this node's manifest elsewhere."""


class Acceptance(Protocol):
    """The daemon's side of the acceptance gate (issue 37), for ``sparkctl accept``: ``Control.acceptance`` while
    ``[acceptance]`` is on."""

    async def accept(self) -> dict[str, Any]:
        """Run the gate now against the running vLLM, its answers recorded as the model's golden whatever the golden
        held (the other parts judged as ever); the gate's result (``GateResult.to_json()``). After a refusal that
        kept the start from ready, a passing run lets it be ready."""


class Control(Protocol):
    """The daemon's surface for commands (``sparkd.daemon.views.control.DaemonControl``)."""

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
    def acceptance(self) -> Acceptance | None:
        """The acceptance gate (``sparkctl accept``); None when this daemon runs none."""

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

    def steps(self) -> Any:
        """This node's step records now, as the peer link carries them (``rank.StepsResult``)."""

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
