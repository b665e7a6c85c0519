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
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

if TYPE_CHECKING:
    from sparkd.commands.base import Method, Reply, Stream
    from sparkd.commands.port import Control


class Params(Protocol):
    """A command's request: read from the query string and the JSON body (``from_params``, which raises
    ``BadRequest`` naming the parameter), written for the wire (``to_params``: strings, or a boolean that a query
    string carries as ``1``/``0``)."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self: ...

    def to_params(self) -> Mapping[str, object]: ...


R = TypeVar("R", bound=Params)
T = TypeVar("T")


# Plain classes, not dataclasses: sparkctl imports this module on every TAB, and a dataclass costs ~1 ms to make.
class Flag:
    """A sparkctl ``--flag`` that sets the boolean field ``field`` of the request (``--dry-run``: ``dry_run``);
    ``warning`` is said on stderr when it is given."""

    __slots__ = ("field", "help", "warning")

    def __init__(self, field: str, help: str, warning: str | None = None) -> None:
        self.field, self.help, self.warning = field, help, warning


class Cli:
    """How sparkctl offers an operator's command (:mod:`sparkd.cli.sparkctl` builds the subcommand from it): its
    one-paragraph help, its boolean flags, how long sparkctl waits for the answer (``timeout_s``, or
    ``long_timeout_s`` when ``long_flag`` is given) and, for a lifecycle command, the state ``--wait`` follows it
    to (``waits_for``)."""

    __slots__ = ("flags", "help", "long_flag", "long_timeout_s", "timeout_s", "waits_for")

    def __init__(self, help: str, flags: tuple[Flag, ...] = (), waits_for: str | None = None,
                 timeout_s: float = 10.0, long_flag: str | None = None, long_timeout_s: float | None = None) -> None:
        self.help, self.flags, self.waits_for = help, flags, waits_for
        self.timeout_s, self.long_flag, self.long_timeout_s = timeout_s, long_flag, long_timeout_s

    def timeout_for(self, flags: Mapping[str, bool]) -> float:
        if self.long_flag is not None and self.long_timeout_s is not None and flags.get(self.long_flag):
            return self.long_timeout_s
        return self.timeout_s


class Command(Generic[R, T]):
    """One control command; ``T`` is its result (the envelope's ``result`` when it is ``ok``). ``cli`` None: not a
    sparkctl subcommand of its own (a rank's, or one another tool reads); ``root_only``: the control socket, uid 0
    only, never over TCP."""

    __slots__ = ("cli", "execute", "exit_code", "method", "name", "render", "request", "root_only")

    def __init__(self, name: str, method: Method, request: type[R],
                 execute: Callable[[Control, R], Awaitable[Reply | Stream]], render: Callable[[T], str] | None = None,
                 exit_code: Callable[[T], int] | None = None, cli: Cli | None = None, *,
                 root_only: bool = False) -> None:
        self.name, self.method, self.request, self.execute = name, method, request, execute
        self.render, self.exit_code, self.cli, self.root_only = render, exit_code, cli, root_only

    def __repr__(self) -> str:
        return f"Command({self.method} {self.path})"

    @property
    def path(self) -> str:
        return f"/v1/{self.name}"

    def answer(self, control: Control, params: Mapping[str, Any]) -> Awaitable[Reply | Stream]:
        """Parse ``params`` (``BadRequest`` names the one that is wrong) and run the command."""
        return self.execute(control, self.request.from_params(params))


def query(params: Mapping[str, object]) -> dict[str, str]:
    """A request's parameters as a query string carries them: a boolean as ``1``/``0``."""
    return {k: ("1" if v else "0") if isinstance(v, bool) else str(v) for k, v in params.items()}
