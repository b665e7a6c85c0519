"""tests/gpu/fake_vllm.py answers sparkd's probes as vLLM does, query string or not: a daemon over it on a GPU host
left `starting` once every probe asked /health?probe=sparkd (../shared/reviews/device-2026-12.md)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fake_vllm


class Moving:
    def moving(self) -> bool:
        return True


@pytest.fixture
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_vllm.handler(Moving()))  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/health", "/health?probe=sparkd"])
def test_health_answers_with_or_without_sparkds_marker(api: str, path: str) -> None:
    assert httpx.get(api + path, timeout=5).status_code == 200


def test_metrics_and_models_answer_with_the_marker_too(api: str) -> None:
    metrics = httpx.get(api + "/metrics?probe=sparkd", timeout=5)
    assert metrics.status_code == 200 and "vllm:" not in metrics.text
    assert httpx.get(api + "/v1/models?probe=sparkd", timeout=5).json()["data"][0]["id"] == "fake"
    assert httpx.get(api + "/nothing?probe=sparkd", timeout=5).status_code == 404
