"""The stand-in's 0.32 flags against the real vLLM 0.32 parser of the tier's install (no daemon, no model)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sparkd_standin.flags import ACCEPTED

BATCH_PARSE = Path(__file__).resolve().parents[1] / "vllm" / "batch_parse.py"


def test_every_flag_the_standin_takes_as_032_is_a_real_032_flag(realvllm: tuple[Path, Path]) -> None:
    venv, _ = realvllm
    result = subprocess.run([str(venv / "bin" / "python"), str(BATCH_PARSE), "options"], capture_output=True,
                            text=True, timeout=600, check=True)
    real = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert not ACCEPTED["0.32"] - real, sorted(ACCEPTED["0.32"] - real)
