"""The lifecycle's vocabulary: what the shell observes (observations in) and what it must do (actions out).

Everything that changes the lifecycle travels as one of these values — no side channel: the guard's grace
rides on the stop, "this incident is written already" rides on the failure's observation, jitter rides on the
observation that needs it. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.supervisor.failures import Failure

__all__ = [
    "Action", "Adopted", "BecameReady", "Exited", "HealthDegraded", "HealthFailed", "HealthRecovered", "Launch",
    "LaunchFailed", "Launched", "Observation", "PreflightDone", "Progress", "RecordIncident", "ResetRequested",
    "RestartRequested", "RunPreflight", "ShutdownRequested", "StartRequested", "Stop", "StopDone",
    "StopRequested", "Tick",
]


# ---- observations: the world, as the shell saw it
@dataclass(frozen=True)
class Adopted:
    """The boot-time search is over: ``found`` an instance this node launched earlier, now watched."""

    found: bool


@dataclass(frozen=True)
class StartRequested:
    """The operator (or, on a pair's worker, the head) wants vLLM running."""


@dataclass(frozen=True)
class StopRequested:
    """The operator wants vLLM stopped, and stopped it stays — also across daemon restarts."""


@dataclass(frozen=True)
class RestartRequested:
    """Operator restart: closes the breaker and forgets the failures (like reset), then starts afresh."""


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


@dataclass(frozen=True)
class Launched:
    """The launch's main process exists (the machine already counts the launch at PreflightDone)."""


@dataclass(frozen=True)
class LaunchFailed:
    failure: Failure


@dataclass(frozen=True)
class Progress:
    """A log line that means the start is moving (a shard loaded, KV cache sized, graphs captured)."""


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
    """

    failure: Failure
    grace_s: float | None = None
    recorded: bool = False
    hung: bool = False


@dataclass(frozen=True)
class Exited:
    """The instance's main process ended; the shell classified it."""

    failure: Failure


@dataclass(frozen=True)
class StopDone:
    """The stop finished: the tree is gone and the node swept. ``rand`` feeds backoff jitter."""

    rand: float = 0.5


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines (startup budget, backoff) are checked against ``now``."""


Observation = (
    Adopted | StartRequested | StopRequested | RestartRequested | ResetRequested | ShutdownRequested
    | PreflightDone | Launched | LaunchFailed | Progress | BecameReady | HealthDegraded | HealthRecovered
    | HealthFailed | Exited | StopDone | Tick
)
OBSERVATIONS: tuple[type, ...] = (
    Adopted, StartRequested, StopRequested, RestartRequested, ResetRequested, ShutdownRequested, PreflightDone,
    Launched, LaunchFailed, Progress, BecameReady, HealthDegraded, HealthRecovered, HealthFailed, Exited,
    StopDone, Tick,
)


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


@dataclass(frozen=True)
class RecordIncident:
    """Count the failure and keep its evidence. ``written``: the folder exists already (the guard wrote it)."""

    failure: Failure
    written: bool = False


Action = RunPreflight | Launch | Stop | RecordIncident
