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
from sparkd.supervisor.failures import FailureClass

MISSING = 3
# cat the file; exit 3 when it is not there.
CAT_SCRIPT = '[ -f "$1" ] || exit 3\nexec cat -- "$1"\n'


def count_lines(text: str, pattern: str) -> int:
    """Lines of ``text`` matching ``pattern`` anywhere (``grep -c``)."""
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line))


def problem(rule: ImageAssert, status: int, text: str, where: str) -> str | None:
    """Pure: why the assertion does not hold, or None."""
    if status == MISSING:
        return f"{rule.path} does not exist {where} (asserted {rule.count} line(s) matching {rule.pattern!r})"
    if status != 0:
        return f"{rule.path} cannot be read {where} (exit {status})"
    seen = count_lines(text, rule.pattern)
    if seen != rule.count:
        return (f"{rule.path} has {seen} line(s) matching {rule.pattern!r} {where}, expected {rule.count}: "
                "the image is not the known-good one (a patch applied twice, or missing)")
    return None


@check("image")
async def check_image(ctx: PreflightContext) -> CheckResult:
    from sparkd.preflight import container as containers  # the docker SDK only when needed

    rules = ctx.cfg.preflight.asserts
    if not rules:
        return CheckResult("image", Verdict.ok, "no [[preflight.assert]] configured")
    where = containers.where(ctx.cfg)
    runner = containers.resolve(ctx.cfg, ctx.runtime, ctx.container)
    problems = []
    for rule in rules:
        try:
            status, text = await runner.exec_in_container(["sh", "-c", CAT_SCRIPT, "sparkd-assert", rule.path])
        except containers.ContainerUnavailable as exc:
            return CheckResult("image", Verdict.warn, f"{len(rules)} assertion(s) not checked: {exc}")
        why = problem(rule, status, text, where)
        if why:
            problems.append(why)
    if problems:
        return CheckResult("image", Verdict.fail, "; ".join(problems), failure_class=FailureClass.config_error)
    return CheckResult("image", Verdict.ok, f"{len(rules)} assertion(s) hold {where}")
