"""The daemon's reach into the host, each part the real one unless a test hands its stand-in: time, systemd's
notify socket, vLLM's HTTP surface (its probes, the acceptance gate's answers), the GPUs (NVML), the jitter's draws,
the memory guard, the checks before every launch and the sweep after every stop, the webhooks' HTTP."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock, SystemClock
from sparkd.host.gpu.model import GpuView
from sparkd.host.gpu.reading import read_gpus
from sparkd.host.notify import Notifier
from sparkd.preflight.base import Check
from sparkd.preflight.runner import DEFAULT_CHECKS, check_shm, check_stale_processes
from sparkd.supervisor.healthsignal import Probes

if TYPE_CHECKING:
    from sparkd.config import Config
    from sparkd.daemon.effects.accepting import AnswerSource


@dataclass(frozen=True)
class Adapters:
    clock: Clock = field(default_factory=SystemClock)
    notifier: Notifier = field(default_factory=Notifier)
    probes: Callable[[], Probes] | None = None  # None: vLLM's own HTTP API, as the config names it
    answers: Callable[[Config], AnswerSource] | None = None  # the acceptance gate's; None: vLLM's own API
    rand: Callable[[], float] = random.random
    gpus: Callable[[], Awaitable[GpuView]] = read_gpus
    guard: Guard | None = None  # a stand-in for the memory guard (the daemon does not run it); None: its own
    checks: tuple[Check, ...] = DEFAULT_CHECKS  # before every launch
    sweep: tuple[Check, ...] = (check_stale_processes, check_shm)  # after every stop
    # (url, body, headers, timeout_s) → the HTTP status: the webhooks' endpoint ([notify]); None: sparkd's own client
    webhooks: Callable[[str, bytes, Mapping[str, str], float], Awaitable[int]] | None = None
