"""The preflight runner: order, stop at the first failure (or report the rest without changing anything),
skip, the failure the supervisor gets, the JSON the CLI prints."""

from __future__ import annotations

import typing
from pathlib import Path

import anyio

from sparkd.config import PreflightCheckId, config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import Check, CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.runner import CHECK_IDS, DEFAULT_CHECKS, PreflightReport, run_preflight
from sparkd.runtime.process import ProcessRuntime
from sparkd.supervisor.failures import FailureClass


def context(tmp_path: Path, **preflight: object) -> PreflightContext:
    cfg = config_from_mapping(
        {"runtime": "process", "launch": {"model": "m"}, "preflight": preflight, "paths": {"state_dir": str(tmp_path)}},
        env={},
    )
    return PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path))


def test_check_ids_are_the_config_keys() -> None:
    assert typing.get_args(PreflightCheckId) == CHECK_IDS
    assert CHECK_IDS == (
        "container",
        "launch_target",
        "vllm_args",
        "builds",
        "stale_processes",
        "ports",
        "dev_shm",
        "page_cache",
        "memory",
        "host",
        "image",
        "rdma",
        "gpu",
    )


def recorder(seen: list[tuple[str, bool]]) -> typing.Callable[[str, Verdict], Check]:
    def make(check_id: str, verdict: Verdict) -> Check:
        @check(check_id)
        async def run(ctx: PreflightContext) -> CheckResult:
            seen.append((check_id, ctx.dry_run))
            return CheckResult(
                verdict,
                f"{check_id} found",
                failure_class=(FailureClass.port_in_use if verdict is Verdict.fail else None),
            )

        return run

    return make


def test_stops_at_the_first_failure(tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []
    make = recorder(seen)
    checks = (make("launch_target", Verdict.ok), make("ports", Verdict.fail), make("dev_shm", Verdict.fixed))
    report = anyio.run(run_preflight, context(tmp_path), checks)
    assert seen == [("launch_target", False), ("ports", False)]
    assert not report.ok
    failure = report.failure()
    assert failure is not None and failure.cls is FailureClass.port_in_use
    assert failure.sentence == "Preflight ports failed: ports found" and failure.restartable


def test_reports_the_rest_without_changing_anything(tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []
    make = recorder(seen)
    checks = (make("ports", Verdict.fail), make("dev_shm", Verdict.warn), make("gpu", Verdict.fail))

    async def run() -> PreflightReport:
        return await run_preflight(context(tmp_path), checks, report_rest=True)

    report = anyio.run(run)
    assert seen == [("ports", False), ("dev_shm", True), ("gpu", True)]  # after a failure: report-only
    failure = report.failure()
    assert failure is not None and failure.sentence.startswith("Preflight ports failed")  # the first one


def test_skip_and_durations(tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []
    make = recorder(seen)
    report = anyio.run(run_preflight, context(tmp_path, skip=["ports"]), (make("ports", Verdict.fail),))
    assert seen == [] and report.ok
    (result,) = report.results
    assert (result.id, result.verdict, result.found) == ("ports", Verdict.ok, "skipped ([preflight] skip)")
    assert result.duration_s >= 0


def test_failure_without_a_class_is_unknown_and_json() -> None:
    report = PreflightReport([CheckResult(Verdict.ok, "fine", id="host"),
                              CheckResult(Verdict.fail, "full", id="dev_shm")])
    failure = report.failure()
    assert failure is not None and failure.cls is FailureClass.unknown
    summary = report.summary()
    assert summary["ok"] is False and summary["failure"] == {
        "class": "unknown",
        "message": "Preflight dev_shm failed: full",
    }
    assert summary["results"][1] == {
        "id": "dev_shm",
        "verdict": "fail",
        "found": "full",
        "did": "",
        "duration_s": 0.0,
        "class": None,
    }


def test_default_checks_are_named_checks() -> None:
    assert all(isinstance(c, Check) for c in DEFAULT_CHECKS)


def test_a_check_that_crashes_fails_with_a_way_out(tmp_path: Path) -> None:
    @check("gpu")
    async def broken(ctx: PreflightContext) -> CheckResult:
        raise ValueError("unexpected nvidia-smi output")

    report = anyio.run(run_preflight, context(tmp_path), (broken,))
    failure = report.failure()
    assert failure is not None and failure.cls is FailureClass.unknown
    assert "the check itself failed (ValueError: unexpected nvidia-smi output)" in failure.sentence
    assert "add 'gpu' to [preflight] skip" in failure.sentence
