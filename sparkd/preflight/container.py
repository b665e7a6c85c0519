"""Check: the container vLLM runs in is the one the config describes.

- An existing container (docker-exec adopts one by name, hand-made or from an older config) is compared with
  ``[container]`` key by key (the runtime's ``drift``: image, mounts, devices, privileged, ulimits, env, shm size,
  network and IPC mode, ...). ``[preflight] drift``: ``fail`` (default) refuses the launch with class
  ``config_error`` naming every difference, ``warn`` reports them and launches, ``off`` skips the comparison.
  ``sparkctl recreate`` (the runtime's ``recreate``) replaces the container from the config.
- The image's own ENV is linted with the rest of the environment: ``VLLM_WORKER_MULTIPROC_METHOD=fork`` baked
  into an image fails like the same line in ``[launch.env]``.
- The lint rules that judge by what this node measured run here too, on the starts it timed
  (:mod:`sparkd.state.starttimes`): ``VLLM_ENGINE_READY_TIMEOUT_S`` shorter than one of them fails the launch before
  a cold start dies at the timeout.
"""

from __future__ import annotations

from sparkd.launch.lint import Level, lint
from sparkd.launch.traps import NodeFacts
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.runtime.base import Difference
from sparkd.state.starttimes import measured_starts
from sparkd.supervisor.failures import FailureClass

MEASURED = frozenset({"engine-ready-timeout-below-cold-start"})  # rules that judge by what this node measured
RECREATE = ("`sparkctl recreate` replaces it from the config (what was installed into it by hand is lost), or "
            "change [container] to match")


def describe(differences: list[Difference], where: str) -> str:
    return f"the container vLLM runs {where} differs from the config: " + "; ".join(map(str, differences))


@check
async def check_container(ctx: PreflightContext) -> CheckResult:
    image_env = dict(ctx.image.env) if ctx.image else {}
    node = NodeFacts(cold_starts_s=measured_starts(ctx.cfg.paths.state_dir))
    image_findings = [f for f in lint(ctx.cfg, image_env=image_env, read_script=lambda _: None, node=node)
                      if f.level is Level.error and (f.key.startswith("the ENV of image") or f.rule in MEASURED)]
    if image_findings:
        return CheckResult(Verdict.fail, "; ".join(f"{f.key}: {f.message}" for f in image_findings),
                           failure_class=FailureClass.config_error)
    mode = ctx.cfg.preflight.drift
    differences = [] if mode == "off" else await ctx.runtime.drift()
    where = ctx.runtime.where
    if not differences:
        skipped = " (not compared: [preflight] drift = 'off')" if mode == "off" else ""
        return CheckResult(Verdict.ok, f"nothing {where} differs from the config{skipped}")
    text = describe(differences, where)
    if mode == "warn":
        return CheckResult(Verdict.warn, text, RECREATE)
    return CheckResult(Verdict.fail, f"{text}; {RECREATE}", failure_class=FailureClass.config_error)
