"""The health signals of a serving vLLM: what its watch asks it now and then, each judged by a pure rule.

:class:`~sparkd.daemon.watch.instance.InstanceWatch` runs every signal of :data:`SIGNALS` through one loop: sleep
``every_s`` (read from the config in force each round), and while vLLM serves, probe, then fold the reading into
the health tracker (what a signal is: :mod:`sparkd.supervisor.healthsignal`). A new signal is one module here (its
probe, its rule and its ``Signal``) and one line in :data:`SIGNALS`.

``/health`` and vLLM's ``/metrics`` are not signals of this list: they are the readiness loop, which also runs
before vLLM serves (every 0.5 s until the first 200) and counts the clients connected before each scrape.
"""

from __future__ import annotations

from typing import Any

from sparkd.supervisor.healthsignal import Signal
from sparkd.supervisor.signals.canary import CANARY

SIGNALS: tuple[Signal[Any], ...] = (
    CANARY,
)
