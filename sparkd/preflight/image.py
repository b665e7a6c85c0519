"""Check: integrity assertions on files where vLLM runs (inside the container for the Docker runtimes).

``[[preflight.assert]]`` tables name a file, a regular expression and the number of lines that must match it
(what ``grep -c`` prints). The field's case: a non-idempotent patch to ``mxfp4.py`` applied twice leaves
``empty_cache`` on 3 lines instead of 2 and vLLM dies at load with ``UnboundLocalError``::

    [[preflight.assert]]
    path = "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/quantization/mxfp4.py"
    pattern = "empty_cache"
    count = 2

A failed assertion is a ``config_error``: the image is wrong, and no restart fixes an image.
"""

from __future__ import annotations

import re

from sparkd.config import ImageAssert
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.runtime.base import TargetUnavailable
from sparkd.supervisor.failures import FailureClass


def count_lines(text: str, pattern: str) -> int:
    """Lines of ``text`` matching ``pattern`` anywhere (``grep -c``)."""
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line))


def problem(rule: ImageAssert, text: str | None, where: str) -> str | None:
    """Pure: why the assertion does not hold, or None. ``text`` is None when the file is not there."""
    if text is None:
        return f"{rule.path} does not exist {where} (asserted {rule.count} line(s) matching {rule.pattern!r})"
    seen = count_lines(text, rule.pattern)
    if seen != rule.count:
        return (f"{rule.path} has {seen} line(s) matching {rule.pattern!r} {where}, expected {rule.count}: "
                "the image is not the known-good one (a patch applied twice, or missing)")
    return None


@check
async def check_image(ctx: PreflightContext) -> CheckResult:
    rules = ctx.cfg.preflight.asserts
    if not rules:
        return CheckResult(Verdict.ok, "no [[preflight.assert]] configured")
    where = ctx.runtime.where
    problems = []
    for rule in rules:
        try:
            text = await ctx.runtime.read_file(rule.path)
        except TargetUnavailable as exc:
            return CheckResult(Verdict.warn, f"{len(rules)} assertion(s) not checked: {exc}")
        except OSError as exc:
            problems.append(str(exc))
            continue
        why = problem(rule, text, where)
        if why:
            problems.append(why)
    if problems:
        return CheckResult(Verdict.fail, "; ".join(problems), failure_class=FailureClass.config_error)
    return CheckResult(Verdict.ok, f"{len(rules)} assertion(s) hold {where}")
