"""The GPU-host runs (tests/gpu/README.md), checked: skipped where there is no NVIDIA GPU (CI), with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_all import WHY_TWO, no_gpu_reason

HERE = Path(__file__).resolve().parent
REASON = no_gpu_reason()

pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a host with an NVIDIA GPU and torch: {REASON}")


def test_the_gpu_runs_hold_what_the_readme_says(tmp_path: Path) -> None:
    """SPARKD_GPU_OUT keeps the run's files; SPARKD_GPU_MAIN_SRC adds the old memory rule's case."""
    out = Path(os.environ.get("SPARKD_GPU_OUT") or tmp_path)
    old = os.environ.get("SPARKD_GPU_MAIN_SRC")
    subprocess.run([sys.executable, str(HERE / "run_all.py"), "--out", str(out),
                    *(["--main-src", old] if old else [])], check=True, timeout=900)
    s = json.loads((out / "summary.json").read_text())
    assert not [k for k in s if k.endswith(".error")], s
    g = s["gpus"] - 1  # the launch's GPU
    for case in (f"foreign_on_gpu{g}", f"stale_on_gpu{g}_dry"):  # a holder on the launch's GPU is refused, named
        assert s[f"preflight.{case}"]["memory"][0] == "fail" and s[f"preflight.{case}"]["memory_names_holder"]
    if g > 0:
        assert s[f"preflight.foreign_on_gpu0_launch_on_gpu{g}"]["memory"][0] == "ok"  # not the launch's GPU
    else:
        assert s["survivor.skipped"] == f"1 GPU here: {WHY_TWO}"
    assert s["preflight.host_smaller_new_rule"]["memory"][0] == "ok"
    stop = s["daemon.hung.stop"]["last_stop"]
    assert stop["sigkilled"] and stop["grace_s"] == 5.0 and stop["seconds"] <= 5.0 + 2.0 and stop["released"]
    assert s["daemon.hung.restarted"]["launches"] >= 2
    probe = s["daemon.hung.probe"]
    assert probe["readings"] > 10 and probe["before_fault"] == [], probe  # no verdict on the healthy ranks
    if g == 0:  # the lone rank SIGSTOPped inside a step (10 ms of each on the CPU): the daemon's probe names it
        verdict = probe["verdict"]
        assert verdict is not None and "stopped (SIGSTOP)" in verdict["sentence"], probe
        failure = s["daemon.hung.failure"]
        assert failure["message"].startswith(f"rank 0 (worker) on gpu-host, PID {verdict['pid']}, stopped (SIGSTOP)"), \
            failure
        assert " step " in failure["message"] and failure["after_fault_s"] <= 15, failure
