"""The classifier reads only the current launch's lines: an earlier instance's error never names this death."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.marks import LAUNCH_LINE, this_launch

EARLIER_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
CASES = [
    ("no launch line (an adopted instance): the whole tail", ["a", "b"], ["a", "b"]),
    ("after the last launch line", ["x", f"{LAUNCH_LINE}vllm serve", "a", f"{LAUNCH_LINE}vllm serve", "b"], ["b"]),
    ("a launch line as the last line: nothing yet", ["x", f"{LAUNCH_LINE}vllm serve"], []),
]


@pytest.mark.parametrize(("case", "tail", "want"), CASES, ids=[c[0] for c in CASES])
def test_this_launch(case: str, tail: list[str], want: list[str]) -> None:
    assert this_launch(tail) == want


def test_an_earlier_instances_oom_does_not_classify_this_sigkill() -> None:
    tail = ["INFO starting", EARLIER_OOM, f"{LAUNCH_LINE}vllm serve /m", "INFO Loading weights"]
    assert classify(None, 9, tail).cls is FailureClass.oom  # the whole tail: the old error wins (wrongly)
    assert classify(None, 9, this_launch(tail)).cls is not FailureClass.oom
