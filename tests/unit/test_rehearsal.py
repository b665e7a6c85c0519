"""What a rehearsal is (sparkd.launch.rehearsal): the configured launch with the installed stand-in as the program, and
the preflight checks it skips, passed through the context."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from sparkd.config import config_from_mapping
from sparkd.launch.rehearsal import (
    REHEARSAL_SKIPS,
    SKIP_REASON,
    STANDIN,
    rehearsal,
    rehearsal_skips,
    standin_executable,
    standin_source_root,
)
from sparkd.launch.render import LaunchSpec, render
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.runner import CHECK_IDS, run_preflight
from sparkd.runtime.process import ProcessRuntime


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("vllm", "serve", "/models/m", "--port", "8000"), ("SI", "serve", "/models/m", "--port", "8000")),
        (("/opt/venv/bin/vllm", "serve", "m"), ("SI", "serve", "m")),
        (("bash", "/workspace/vllm-head.sh", "--x"), ("SI", "--x")),
    ],
)
def test_rehearsal_swaps_the_program_and_keeps_the_rest(argv: tuple[str, ...], expected: tuple[str, ...]) -> None:
    spec = LaunchSpec(argv=argv, env={"VLLM_HOST_IP": "10.0.0.1"}, config_hash="h1")
    rehearsed = rehearsal(spec, executable="SI")
    assert rehearsed.argv == expected
    assert (rehearsed.env, rehearsed.config_hash) == ({"VLLM_HOST_IP": "10.0.0.1"}, "h1")
    assert rehearsed.env is not spec.env  # the rehearsal's environment is its own copy


def test_the_rehearsal_runs_the_installed_standin() -> None:
    """``make setup`` installs sparkd-standin next to this interpreter; the rehearsal runs that program."""
    program = standin_executable()
    assert program == str(Path(sys.executable).parent / STANDIN) and os.access(program, os.X_OK)
    assert rehearsal(LaunchSpec(argv=("vllm", "serve", "m"))).argv[0] == program
    root = standin_source_root()
    assert root is not None and (Path(root) / "sparkd_standin" / "__main__.py").is_file()


def test_rehearsal_skips_are_check_ids_with_a_reason() -> None:
    assert {"memory", "page_cache", "vllm_args"} == REHEARSAL_SKIPS and set(CHECK_IDS) >= REHEARSAL_SKIPS
    assert rehearsal_skips() == {"memory": SKIP_REASON, "page_cache": SKIP_REASON, "vllm_args": SKIP_REASON}


def test_the_context_skips_checks_without_running_them(tmp_path: Path) -> None:
    """A check the context names is reported skipped, with its reason, and never runs."""
    ran: list[str] = []

    def make(check_id: str) -> object:
        @check(check_id)
        async def run(ctx: PreflightContext) -> CheckResult:
            ran.append(check_id)
            return CheckResult(Verdict.fail, "would refuse the launch")

        return run

    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "m"},
                               "paths": {"state_dir": str(tmp_path)}}, env={})
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path), skip=rehearsal_skips())
    report = anyio.run(run_preflight, ctx, (make("page_cache"), make("memory")))
    assert ran == [] and report.ok
    assert [(r.id, r.verdict, r.found) for r in report.results] == [
        ("page_cache", Verdict.ok, f"skipped ({SKIP_REASON})"),
        ("memory", Verdict.ok, f"skipped ({SKIP_REASON})"),
    ]
    unskipped = dataclasses.replace(ctx, skip={})
    assert not anyio.run(run_preflight, unskipped, (make("memory"),)).ok and ran == ["memory"]


def test_sparkd_standin_passes_everything_to_the_installed_standin() -> None:
    """`sparkd standin ...` is `sparkd-standin ...`: its help, its parser's errors and exit statuses."""
    sparkd = str(Path(sys.executable).parent / "sparkd")
    shown = subprocess.run([sparkd, "standin", "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: vllm [-h] [-v]")
    refused = subprocess.run([sparkd, "standin", "serve", "m", "--bogus"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == "vllm: error: unrecognized arguments: --bogus"


def test_sparkd_standin_names_what_is_missing_when_it_is_not_installed(tmp_path: Path) -> None:
    """Without sparkd-standin beside the interpreter or on PATH: one sentence naming it and how to install it."""
    program = (
        "import sys; sys.executable = sys.argv[1]; from sparkd.cli.sparkd import main; main(['standin', '--help'])"
    )
    env = {"PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", program, str(tmp_path / "python")], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        f"sparkd: the vLLM stand-in is not installed: no `sparkd-standin` next to {tmp_path / 'python'} or on "
        "PATH (install the sparkd-standin distribution: `pip install ./standin` in a checkout, or `make setup`)"
    )
