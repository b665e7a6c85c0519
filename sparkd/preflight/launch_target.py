"""Check: the launch target is there where vLLM runs (the launch script or the vLLM executable, the device, a
local model's config.json and weight shards); what it reads and how it judges the listing is :mod:`.target`."""

from __future__ import annotations

from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.target import LIST_SCRIPT, local_model, model_problem, parse_listing
from sparkd.runtime.base import TargetUnavailable
from sparkd.supervisor.failures import FailureClass


def _fail(text: str) -> CheckResult:
    return CheckResult(Verdict.fail, text, failure_class=FailureClass.config_error)


@check
async def check_launch_target(ctx: PreflightContext) -> CheckResult:
    cfg, runtime = ctx.cfg, ctx.runtime
    if ctx.dry_run:  # checking the target may create or start the place vLLM runs: say so instead
        pending = await runtime.pending_preparation()
        if pending:
            return CheckResult(Verdict.warn, pending + " (dry run: the target is checked then)")
    problem = await runtime.missing_target(ctx.spec)
    if problem:
        return _fail(problem)
    target = ctx.spec.argv[1] if ctx.spec.argv[0] == "bash" and len(ctx.spec.argv) > 1 else ctx.spec.argv[0]
    where = runtime.where
    found = [f"the launch target {target} is there {where}"]
    path = local_model(cfg.launch.model)
    if path is None:
        found.append(f"model {cfg.launch.model} is a hub id")
    else:
        try:
            result = await runtime.exec(["sh", "-c", LIST_SCRIPT, "sparkd-model", path])
        except TargetUnavailable as exc:
            return CheckResult(Verdict.warn, "; ".join(found) + f"; model path {path} not "
                               f"checked: {exc}")
        problem, seen = model_problem(path, parse_listing(result.exit_code, result.stdout), where)
        if problem:
            return _fail(problem)
        found.append(seen)
    return CheckResult(Verdict.ok, "; ".join(found))
