"""``[stop]``: how a stop sparkd chooses treats the requests vLLM is serving.

vLLM drains on SIGTERM when it was started with ``--shutdown-timeout N`` (N > 0): it refuses new requests and lets
those in flight finish for up to N seconds; with 0, its default, it kills its engine at once and the streams in
flight get nothing more (measured: tests/data/vllm-drain-032.json). sparkd renders the flag from
``drain_s`` (:mod:`sparkd.launch.render`); every grace that must outlast the drain (the SIGTERM → SIGKILL grace,
the container's stop timeout, the unit's ``TimeoutStopSec``) is derived from it in one place,
:mod:`sparkd.supervisor.graces`.
"""

from __future__ import annotations

from pydantic import Field

from sparkd.config.sections import _Section

DEFAULT_DRAIN_S = 120  # an agent's long answer at a few dozen tokens a second


class StopConfig(_Section):
    drain_s: int = Field(default=DEFAULT_DRAIN_S, ge=0, le=24 * 3600, description=(
        "How long a stop sparkd chooses lets the requests in flight finish (`sparkctl stop` and `restart`, a reload "
        "that relaunches, sparkd's own shutdown): vLLM runs with `--shutdown-timeout` this many seconds, so on "
        "SIGTERM it refuses new requests and finishes those it has for up to this long; a drained stop's grace "
        "before SIGKILL is this plus `[supervisor] stop_grace_s`. 0: no drain (vLLM's default: it kills its engine "
        "at once, and the streams in flight get nothing more until vLLM is killed). "
        "The memory guard's stop, the stop of a wedged vLLM and a stop that answers a failure skip the drain. Whole "
        "seconds (vLLM reads an integer)."))
