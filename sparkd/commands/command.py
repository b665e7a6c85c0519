"""The one shape of a control command, the operator's and the ranks' alike: a :class:`Command`.

A command is a route both ends agree on (its ``name``, so its path ``/v1/<name>``, and its ``method``), a request
type (``from_params`` on the daemon's side, ``to_params`` on the caller's), what the daemon does
(``execute(control, request)``, answering a ``Reply`` or a ``Stream``) and, for an operator's command, how sparkctl
offers it (:class:`Cli`, data only: the daemon imports this module, click is sparkctl's) and shows its answer
(``render``, ``exit_code``). The server (:mod:`sparkd.api.server`) serves every ``Command`` the same way; sparkctl
(:mod:`sparkd.api.client`) and the peer link (:mod:`sparkd.cluster.peers`) call one with its typed request and get
its typed result. Light on purpose: sparkctl imports it on every call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from sparkd.commands.base import Method, Route

if TYPE_CHECKING:
    from sparkd.commands.base import Control, Reply, Stream


class Params(Protocol):
    """A command's request: read from the query string and the JSON body (``from_params``, which raises
    ``BadRequest`` naming the parameter), written for the wire (``to_params``: strings, or a boolean that a query
    string carries as ``1``/``0``)."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self: ...

    def to_params(self) -> Mapping[str, object]: ...


R = TypeVar("R", bound=Params)
T = TypeVar("T")


class Served(Route, Protocol):
    """What the server needs of a command, whatever its request and result types."""

    @property
    def root_only(self) -> bool: ...

    def answer(self, control: Control, params: Mapping[str, Any]) -> Awaitable[Reply | Stream]: ...


@dataclass(frozen=True)
class Flag:
    """A sparkctl ``--flag`` that sets the boolean field ``field`` of the request (``--dry-run``: ``dry_run``)."""

    field: str
    help: str
    warning: str | None = None  # said on stderr when the flag is given


@dataclass(frozen=True)
class Cli:
    """How sparkctl offers an operator's command (:mod:`sparkd.cli.sparkctl` builds the subcommand from it): its
    one-paragraph help, its boolean flags, how long sparkctl waits for the answer (``timeout_s``, or
    ``long_timeout_s`` when ``long_flag`` is given) and, for a lifecycle command, the state ``--wait`` follows it
    to (``waits_for``)."""

    help: str
    flags: tuple[Flag, ...] = ()
    waits_for: str | None = None
    timeout_s: float = 10.0
    long_flag: str | None = None
    long_timeout_s: float | None = None

    def timeout_for(self, flags: Mapping[str, bool]) -> float:
        if self.long_flag is not None and self.long_timeout_s is not None and flags.get(self.long_flag):
            return self.long_timeout_s
        return self.timeout_s


@dataclass(frozen=True)
class Command(Generic[R, T]):
    """One control command; ``T`` is its result (the envelope's ``result`` when it is ``ok``)."""

    name: str
    method: Method
    request: type[R]
    execute: Callable[[Control, R], Awaitable[Reply | Stream]]
    render: Callable[[T], str] | None = None
    exit_code: Callable[[T], int] | None = None
    cli: Cli | None = None  # None: not a sparkctl subcommand of its own (a rank's, or read by another tool)
    root_only: bool = False  # the control socket, uid 0 only, never over TCP

    @property
    def path(self) -> str:
        return f"/v1/{self.name}"

    def answer(self, control: Control, params: Mapping[str, Any]) -> Awaitable[Reply | Stream]:
        """Parse ``params`` (``BadRequest`` names the one that is wrong) and run the command."""
        return self.execute(control, self.request.from_params(params))


def query(params: Mapping[str, object]) -> dict[str, str]:
    """A request's parameters as a query string carries them: a boolean as ``1``/``0``."""
    return {k: ("1" if v else "0") if isinstance(v, bool) else str(v) for k, v in params.items()}
