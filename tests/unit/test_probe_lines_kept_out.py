"""sparkd's own probes do not bury vLLM's log (issue 25 §5): their access lines never reach vllm.log, the ring that
`sparkctl logs` and incidents read, or the journal; another client's request does; `[log] probe_requests` keeps
them."""

from __future__ import annotations

from pathlib import Path

import pytest
from loop_harness import config, running

from sparkd.testing import FakeClock, FakeRuntime

OURS = 'INFO:     127.0.0.1:58102 - "GET /health?probe=sparkd HTTP/1.1" 200 OK'
THEIRS = 'INFO:     127.0.0.1:58130 - "POST /v1/completions HTTP/1.1" 200 OK'
VLLM = "(APIServer pid=7) INFO 11-27 08:39:54 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s"


@pytest.mark.anyio
@pytest.mark.parametrize(("keep", "kept"), [(False, [THEIRS, VLLM]), (True, [OURS, THEIRS, VLLM])],
                         ids=["by default", "with probe_requests"])
async def test_probe_access_lines_are_left_out(tmp_path: Path, keep: bool, kept: list[str]) -> None:
    cfg = config(tmp_path, log={"probe_requests": keep})
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        runtime.say(OURS, THEIRS, VLLM)
        await node.until(lambda: VLLM in node.daemon.vllm_log.tail)
        assert [line for line in node.daemon.vllm_log.tail if line in (OURS, THEIRS, VLLM)] == kept
        await node.settled()
    on_disk = (tmp_path / "state" / "logs" / "vllm.log").read_text()
    assert (OURS in on_disk) is keep and THEIRS in on_disk
