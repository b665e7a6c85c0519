"""A probe's verdict meets vLLM's log: a probe saw the engine dead (``/health`` 503) or wedged (the canary, the
metrics), and vLLM's log may say how it died — an outside SIGTERM to the engine core, a death it logged. Then that
line's sentence and evidence are the failure's, not the probe's. A dying engine answers no canary either, for the
seconds vLLM takes to notice: a death the log names is no wedge. Pure."""

from __future__ import annotations

from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.peerloss import WEDGES

# The probes' verdicts the log may explain better.
EXPLAINED = frozenset({FailureClass.engine_dead, *WEDGES})


def names_the_death(told: Failure) -> bool:
    """The log's classification rests on a line that says more than the class's default sentence (the classifier
    falls back to ``TREATMENT[cls].what`` when no line names more)."""
    return told.evidence is not None and not told.sentence.startswith(told.treatment.what)


def told_by_the_log(probed: Failure, told: Failure) -> Failure:
    """``probed`` (a probe's ``engine_dead`` or wedge), or ``told`` — the log's tail classified as an engine death —
    when the log names how the engine died. A wedge stays a wedge when the log's tail tells of no engine death."""
    if probed.cls not in EXPLAINED:
        return probed
    if probed.cls in WEDGES and told.cls is not FailureClass.engine_dead:
        return probed
    return told if names_the_death(told) else probed
