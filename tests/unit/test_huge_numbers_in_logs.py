"""A number too long for int() in a vLLM log line (Python refuses more than 4300 digits; a line holds up to 16384
characters) is a line nothing recognises, not a ValueError: before, one such `(APIServer pid=999…)` line in vllm.log
ended the daemon with a traceback."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.logline import parse
from sparkd.supervisor.progress import Startup, advance
from sparkd.supervisor.servelog import read_serve_line

BIG = "9" * 5000
LINES = [
    f"(APIServer pid={BIG}) INFO 01-01 00:00:00 [x.py:1] hi",
    f"(Worker pid=1) INFO 01-01 00:00:00 [parallel_state.py:1] world_size={BIG} rank={BIG} local_rank=0 "
    "distributed_init_method=tcp://127.0.0.1:1 backend=nccl",
    f"(Worker pid=1) INFO 01-01 00:00:00 [parallel_state.py:1] rank {BIG} in world size {BIG} is assigned as DP rank 0",
    f"Loading safetensors checkpoint shards: 50% Completed | {BIG}/{BIG} [00:01<00:01]",
    f"(EngineCore pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: {BIG} tokens",
    f"(EngineCore pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:1] Maximum concurrency for {BIG} tokens per "
    "request: 2.00x",
    f"(APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg "
    f"generation throughput: 0.0 tokens/s, Running: {BIG} reqs, Waiting: {BIG} reqs, GPU KV cache usage: 1.0%",
    f"(EngineCore pid=1) INFO 01-01 00:00:00 [shm_broadcast.py:1] No available shared memory broadcast block found "
    f"in {BIG} seconds.",
    f"NVRM: Xid (PCI:0000:01:00): {BIG}, pid=1, name=python",
    f"The client socket has timed out after {BIG}ms while trying to connect to (10.0.0.1, 29501).",
]


@pytest.mark.parametrize("line", LINES)
def test_a_huge_number_is_no_error(line: str) -> None:
    parse(line)
    advance(Startup(), line, 0.0)
    read_serve_line(line)
    assert classify(1, None, [line]).sentence
