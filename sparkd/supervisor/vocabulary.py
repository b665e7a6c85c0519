"""The lifecycle's vocabulary: what the shell observes (observations in) and what it must do (actions out).

Everything that changes the node travels as one of these values — no side channel: the guard's grace rides on
the stop, "this incident is written already" rides on the failure's observation, jitter rides on the observation
that needs it, the instance rides on ``Launched`` and ``Adopted``, the startup's progress on ``Progress``, the
stop's report on ``StopDone``, a reloaded config on ``ConfigReplaced``. The lifecycle table decides on the
observations (:data:`OBSERVATIONS`); the node's facts (:data:`NODE_FACTS`) change no lifecycle state, only the
node's (``sparkd.daemon.loop.nodestate``). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkd.supervisor.failures import Failure

if TYPE_CHECKING:  # types only: a TAB's import of the commands stays light
    from sparkd.config import Config
    from sparkd.supervisor.acceptance.gate import GateResult
    from sparkd.supervisor.acceptance.gate import Progress as GateProgressValue
    from sparkd.supervisor.compilelog import CompileCache
    from sparkd.supervisor.drainlog import Drain
    from sparkd.supervisor.instance import Instance
    from sparkd.supervisor.progress import Startup
    from sparkd.supervisor.stopreport import StopReport
    from sparkd.supervisor.timing import LaunchTiming

__all__ = [
    "Action", "Adopted", "BecameReady", "CompileCacheRead", "ConfigReplaced", "CutStop", "Draining", "Exited",
    "GateDone", "GateProgress", "HealthDegraded", "HealthFailed", "HealthRecovered", "Launch", "LaunchFailed",
    "Launched", "NodeFact", "Observation", "Posted", "PreflightDone", "Progress", "RecordIncident", "ReplayDue",
    "ResetRequested", "RestartRequested", "RunGate",
    "RunPreflight", "Settling", "ShutdownRequested", "StartRequested", "Stop", "StopDone", "StopRequested", "Tick",
]


# ---- observations: the world, as the shell saw it
@dataclass(frozen=True)
class Adopted:
    """The boot-time search is over: ``instance``, one this node launched earlier, is watched again (None: none
    was found)."""

    instance: Instance | None = None

    @property
    def found(self) -> bool:
        return self.instance is not None


@dataclass(frozen=True)
class StartRequested:
    """The operator (or, on a pair's worker, the head) wants vLLM running."""


@dataclass(frozen=True)
class StopRequested:
    """The operator wants vLLM stopped, and stopped it stays — also across daemon restarts. ``now``: without
    waiting for the requests in flight (``sparkctl stop --now``; during a drain it cuts the drain short)."""

    now: bool = False


@dataclass(frozen=True)
class RestartRequested:
    """Operator restart: closes the breaker and forgets the failures (like reset), then starts afresh. ``now``: the
    stop skips the drain (``sparkctl restart --now``)."""

    now: bool = False


@dataclass(frozen=True)
class ResetRequested:
    """Close the breaker and forget the failures; start again if vLLM should run."""


@dataclass(frozen=True)
class ShutdownRequested:
    """The daemon is going down (SIGTERM): stop vLLM, but leave the operator's intent as it was."""


@dataclass(frozen=True)
class PreflightDone:
    failure: Failure | None = None  # None: the node is ready to launch
    rand: float = 0.5  # uniform in [0, 1): jitter for the backoff a failure starts
    timing: LaunchTiming | None = None  # the start's timing so far: the preflight's steps


@dataclass(frozen=True)
class Launched:
    """The launch's main process exists, now watched (the machine already counts the launch at PreflightDone);
    ``timing``: the preflight's and the launch's steps, and vLLM's exec."""

    instance: Instance
    timing: LaunchTiming


@dataclass(frozen=True)
class LaunchFailed:
    failure: Failure


@dataclass(frozen=True)
class Progress:
    """A log line that means the start is moving (a shard loaded, KV cache sized, graphs captured): ``startup``,
    the instance's startup progress now."""

    startup: Startup = field(default_factory=lambda: _startup())


@dataclass(frozen=True)
class BecameReady:
    pass


@dataclass(frozen=True)
class HealthDegraded:
    reason: str


@dataclass(frozen=True)
class HealthRecovered:
    pass


@dataclass(frozen=True)
class HealthFailed:
    """A probe, the peer watch or the memory guard found the instance failed.

    ``grace_s``: how long the stop may wait before SIGKILL (the guard's own; None: the configured grace).
    ``recorded``: the incident folder is written already (the guard writes it before it signals anything).
    ``hung``: the instance is known wedged whatever the failure's class: its peer rank died under it (the head's
    word that a worker's rank is gone), so it spins in a collective and ignores SIGTERM.
    ``wedged_for_s``: how long the wedge it names has lasted, where the verdict knows (the step probe's stuck step;
    the GPU power's evidence is read over that time); None: ``[health] stall_after_s``.
    """

    failure: Failure
    grace_s: float | None = None
    recorded: bool = False
    hung: bool = False
    wedged_for_s: float | None = None


@dataclass(frozen=True)
class Exited:
    """The instance's main process ended; the shell classified it."""

    failure: Failure


@dataclass(frozen=True)
class StopDone:
    """The stop finished: the tree is gone and the node swept. ``report``: what the stop of an instance did (None:
    none ran). ``rand`` feeds backoff jitter."""

    report: StopReport | None = None
    rand: float = 0.5


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines (startup budget, backoff, the acceptance gate's budget) are checked against ``now``."""


# -- the acceptance gate (issue 37; sparkd.supervisor.acceptance)
@dataclass(frozen=True)
class GateDone:
    """The acceptance gate ran against the instance and came to ``result``; ``kind``: which run it was (a
    ``sparkd.supervisor.acceptance.standing.GateKind`` value: start, adopted, replay, wake, accept)."""

    result: GateResult
    kind: str = "start"


@dataclass(frozen=True)
class ReplayDue:
    """While vLLM serves, its answers are to be asked again: ``why`` (the interval passed while the engine was idle,
    or ``wake``: vLLM woke from sleep)."""

    why: str
    wake: bool = False


Observation = (
    Adopted | StartRequested | StopRequested | RestartRequested | ResetRequested | ShutdownRequested
    | PreflightDone | Launched | LaunchFailed | Progress | BecameReady | HealthDegraded | HealthRecovered
    | HealthFailed | Exited | StopDone | Tick | GateDone | ReplayDue
)
OBSERVATIONS: tuple[type, ...] = (
    Adopted, StartRequested, StopRequested, RestartRequested, ResetRequested, ShutdownRequested, PreflightDone,
    Launched, LaunchFailed, Progress, BecameReady, HealthDegraded, HealthRecovered, HealthFailed, Exited,
    StopDone, Tick, GateDone, ReplayDue,
)


# ---- the node's facts: they change no lifecycle state, only the node's
@dataclass(frozen=True)
class ConfigReplaced:
    """A reload took on ``cfg`` (validated, the keys a running daemon cannot change kept): from the next
    observation on, every part reads it."""

    cfg: Config


@dataclass(frozen=True)
class Settling:
    """The start's preflight runs ``phase`` before its checks (``memory_settle``); None: it is over."""

    phase: str | None


@dataclass(frozen=True)
class Draining:
    """The stop in progress drains: vLLM's requests in flight and the time left, as its log and gauges show them
    (``sparkd.supervisor.drainlog``); None: no drain (the stop is over)."""

    drain: Drain | None


@dataclass(frozen=True)
class CompileCacheRead:
    """What the start's log says of vLLM's compile cache (``sparkd.supervisor.compilelog``): ``expected``, a hit
    was due (the last start stored the same entry); ``explained``: what explains a miss (``image changed``)."""

    cache: CompileCache
    expected: bool = False
    explained: str | None = None


@dataclass(frozen=True)
class GateProgress:
    """The acceptance gate's run moved on: its parts so far (status shows them); None: it ended without a verdict."""

    progress: GateProgressValue | None
    kind: str = "start"


NodeFact = ConfigReplaced | Settling | Draining | CompileCacheRead | GateProgress
NODE_FACTS: tuple[type, ...] = (ConfigReplaced, Settling, Draining, CompileCacheRead, GateProgress)
Posted = Observation | NodeFact  # what the loop's queue carries


def _startup() -> Startup:
    from sparkd.supervisor.progress import Startup

    return Startup()


# ---- actions: what the shell must carry out, in order
@dataclass(frozen=True)
class RunPreflight:
    pass


@dataclass(frozen=True)
class Launch:
    pass


@dataclass(frozen=True)
class Stop:
    reason: str
    grace_s: float | None = None  # None: the configured grace (hung_stop_grace_s for a wedged vLLM, else stop_grace_s)
    failure: Failure | None = None  # the failure the stop answers (a wedge verdict: the short grace)
    hung: bool = False  # known wedged whatever the failure's class (a peer rank died under it): the short grace
    now: bool = False  # the operator's stop that skips the drain (--now)
    serving: bool = True  # vLLM served when the stop was decided: requests may be in flight


@dataclass(frozen=True)
class CutStop:
    """End the stop in progress now: its drain is cut short (``sparkctl stop --now`` while vLLM drains, or a wedge
    named while it drains: a wedged engine finishes nothing)."""

    why: str = "the operator's --now"


@dataclass(frozen=True)
class RecordIncident:
    """Count the failure and keep its evidence. ``written``: the folder exists already (the guard wrote it)."""

    failure: Failure
    written: bool = False


@dataclass(frozen=True)
class RunGate:
    """Run the acceptance gate against the instance (``kind``: start, adopted, replay, wake) and post ``GateDone``."""

    kind: str = "start"
    why: str = ""


Action = RunPreflight | Launch | Stop | RecordIncident | CutStop | RunGate
