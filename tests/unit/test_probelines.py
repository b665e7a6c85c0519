"""sparkd's own probes are told apart in uvicorn's access log, and nobody else's request is (issue 25 §5)."""

from __future__ import annotations

import pytest

from sparkd.supervisor.probelines import is_probe_line

# uvicorn's access lines as vLLM 0.32 wrote them (tests/realvllm, the tier's own vllm.log)
OURS = [
    'INFO:     127.0.0.1:58102 - "GET /health?probe=sparkd HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:58112 - "GET /metrics?probe=sparkd HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:58124 - "POST /v1/completions?probe=sparkd HTTP/1.1" 200 OK',
    '(APIServer pid=7) INFO:     127.0.0.1:1 - "GET /health?probe=sparkd HTTP/1.1" 503 Service Unavailable',
]
THEIRS = [
    'INFO:     127.0.0.1:58090 - "GET /health HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:58130 - "POST /v1/completions HTTP/1.1" 200 OK',
    'INFO:     10.0.0.9:4000 - "GET /v1/models?probe=sparkdx HTTP/1.1" 200 OK',
    "(APIServer pid=7) INFO 11-27 08:39:54 [loggers.py:335] a message that quotes probe=sparkd",
    'INFO:     10.0.0.9:4000 - "POST /v1/completions HTTP/1.1" 200 OK probe=sparkd',
]


@pytest.mark.parametrize("line", OURS)
def test_sparkds_probes_are_recognised(line: str) -> None:
    assert is_probe_line(line)


@pytest.mark.parametrize("line", THEIRS)
def test_nobody_elses_line_is(line: str) -> None:
    assert not is_probe_line(line)
