"""The outcome of the real-vLLM tier that the session started beside the other tests (tests/realvllm/beside.py):
its summary shown (in the session's summary, tests/conftest.py), its exit status checked, its output quoted when it
failed."""

from __future__ import annotations

import pytest
from beside import BUDGET_S
from childrun import Beside


@pytest.mark.timeout(BUDGET_S + 300)  # it waits for the child, which ends itself within BUDGET_S
def test_the_real_vllm_tier_beside_the_suite(realvllm_beside: Beside | None) -> None:
    assert realvllm_beside is not None, "the session did not start the real-vLLM tier (tests/conftest.py)"
    status = realvllm_beside.wait()
    output = realvllm_beside.log.read_text(errors="replace")
    lines = output.splitlines()
    shown = [line for line in lines if line.startswith(("real-vLLM tier timings", "realvllm: "))] + lines[-1:]
    print("\n".join(shown) + f"\nrealvllm: the tier's output in {realvllm_beside.log}", flush=True)
    assert status is not None, f"the real-vLLM tier did not end within {BUDGET_S:.0f} s:\n{output[-4000:]}"
    assert status == 0, f"the real-vLLM tier failed (exit {status}):\n{output[-6000:]}"
