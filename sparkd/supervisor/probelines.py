"""sparkd's own probes in vLLM's log: how they are marked and how their access-log lines are told apart. Pure.

uvicorn logs one access line per request (``INFO:     127.0.0.1:58102 - "GET /health HTTP/1.1" 200 OK``), and sparkd's
probes — ``/health`` every few seconds, ``/metrics``, the canary — would bury vLLM's own lines and the operators'
requests (reviews/real-vllm.md: 46 of the last 50 ``sparkctl logs`` lines, a hang incident's tail ending in ~90
``GET /health 200``). Every probe carries the query ``probe=sparkd`` (vLLM and the stand-in ignore unknown query
parameters; uvicorn logs the path with its query), so the shell can leave exactly those lines out of ``vllm.log``,
``sparkctl logs``, incidents and the journal (``[log] probe_requests`` keeps them) without hiding anyone else's
``GET /health``.
"""

from __future__ import annotations

import re

from sparkd.supervisor.logline import clean

__all__ = ["PROBE_QUERY", "is_probe_line", "probe_url"]

PROBE_QUERY = "probe=sparkd"
_ACCESS = re.compile(r'"(?:GET|POST|HEAD|PUT) /[^ "?]*\?(?:[^ "]*&)?probe=sparkd(?:&[^ "]*)? HTTP/\d(?:\.\d)?"')


def probe_url(base: str, path: str) -> str:
    """The URL of one of sparkd's probes: ``path`` on ``base``, marked as sparkd's."""
    return f"{base}{path}?{PROBE_QUERY}"


def is_probe_line(raw: str) -> bool:
    """Is this raw log line uvicorn's access line for one of sparkd's own probes?"""
    return PROBE_QUERY in raw and _ACCESS.search(clean(raw)) is not None
