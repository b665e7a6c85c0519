"""The GPU-host runs (tests/gpu/README.md), checked: skipped where there is no NVIDIA GPU (CI), with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_all import no_gpu_reason

HERE = Path(__file__).resolve().parent
REASON = no_gpu_reason()

pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a host with 2 NVIDIA GPUs and torch: {REASON}")


def test_the_gpu_runs_hold_what_the_readme_says(tmp_path: Path) -> None:
    """SPARKD_GPU_OUT keeps the run's files; SPARKD_GPU_MAIN_SRC adds the old memory rule's case."""
    out = Path(os.environ.get("SPARKD_GPU_OUT") or tmp_path)
    old = os.environ.get("SPARKD_GPU_MAIN_SRC")
    subprocess.run([sys.executable, str(HERE / "run_all.py"), "--out", str(out),
                    *(["--main-src", old] if old else [])], check=True, timeout=900)
    s = json.loads((out / "summary.json").read_text())
    assert not [k for k in s if k.endswith(".error")], s
    for case in ("foreign_on_gpu1", "stale_on_gpu1_dry"):  # a holder on the launch's GPU is refused, named
        assert s[f"preflight.{case}"]["memory"][0] == "fail" and s[f"preflight.{case}"]["memory_names_holder"]
    assert s["preflight.foreign_on_gpu0_launch_on_gpu1"]["memory"][0] == "ok"  # another GPU is not the launch's
    assert s["preflight.host_smaller_new_rule"]["memory"][0] == "ok"
    stop = s["daemon.hung.stop"]["last_stop"]
    assert stop["sigkilled"] and stop["grace_s"] == 5.0 and stop["seconds"] <= 5.0 + 2.0 and stop["released"]
    assert s["daemon.hung.restarted"]["launches"] >= 2
