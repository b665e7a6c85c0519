"""The HTTP probes against real servers on 127.0.0.1 (ephemeral ports): a stub HTTP server in a thread that
answers what each test scripts, and a bound port nobody listens on. No mocks of the HTTP client."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest

from sparkd.daemon.watch import probes
from sparkd.daemon.watch.probes import ProbeOutcome, VllmMetrics
from sparkd.host.plainhttp import Client

SLOW_S = 10.0  # how long a "hanging" reply waits (released at teardown)
TIMEOUT_S = 0.3  # probe timeout against a hanging reply
ANSWER_S = 10.0  # probe timeout where the stub answers: on a loaded machine its answer may take over TIMEOUT_S

ENGINE_DEAD_JSON = json.dumps(
    {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "type": "Internal Server Error",
            "param": None,
            "code": 500,
        }
    }
).encode()
COMPLETION_JSON = json.dumps(
    {
        "id": "cmpl-1f2e3d4c5b6a7980",
        "object": "text_completion",
        "created": 1732580000,
        "model": "my-model",
        "choices": [
            {
                "index": 0,
                "text": " pong",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": None},
        "kv_transfer_params": None,
    }
).encode()

METRICS_TEXT = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="my model {v2}"} 2.0
vllm:num_requests_running{engine="1",model_name="my model {v2}"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="my model {v2}"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="my model {v2}"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="my model {v2}"} 0.5
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="my model {v2}"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="my \\"quoted\\" } model"} 24.0 1732580000000
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="my model {v2}"} 1.7956537991774004e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="my model {v2}"} 5000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="my model {v2}"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="my model {v2}"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="my model {v2}"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="my model {v2}"} 0.002
"""


# ---------------------------------------------------------------------------------------------------------
# A stub HTTP server


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay_s: float = 0.0  # wait this long (or until teardown) before answering
    raw: bytes | None = None  # write these bytes instead of an HTTP response, then close the connection


def deadline(reply: Reply) -> float:
    """The probe's timeout for a table case: short where the reply hangs, generous where it answers."""
    return TIMEOUT_S if reply.delay_s else ANSWER_S


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""


@dataclass
class Stub:
    url: str
    routes: dict[tuple[str, str], Reply] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stub: Stub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        stub = self.server.stub
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        stub.seen.append(Seen(method, path, {k.lower(): v for k, v in self.headers.items()}, body, query))
        reply = stub.routes.get((method, path), Reply(404, b'{"detail":"Not Found"}'))
        if reply.delay_s:
            stub.release.wait(reply.delay_s)
        try:
            if reply.raw is not None:
                self.wfile.write(reply.raw)
                self.close_connection = True
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the probe gave up first

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(address: tuple[str, int], family: socket.AddressFamily) -> Generator[Stub, None, None]:
    server_cls = type("_ServerV6", (_Server,), {"address_family": family}) if family == socket.AF_INET6 else _Server
    server = server_cls(address, _Handler)
    host, port = server.server_address[:2]
    stub = Stub(url=probes.probe_base_url(str(host), int(port)))
    server.stub = stub
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="stub-http", daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def stub() -> Iterator[Stub]:
    yield from _serve(("127.0.0.1", 0), socket.AF_INET)


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback port that is bound but not listening: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with probes.make_client() as c:
        yield c


# ---------------------------------------------------------------------------------------------------------
# /health

HEALTH_CASES = {
    "200 is ok": (Reply(200), ProbeOutcome.ok, "HTTP 200"),
    "503 is engine_dead": (Reply(503), ProbeOutcome.engine_dead, "HTTP 503"),
    "500 is a probe error": (Reply(500, b"oops"), ProbeOutcome.error, "HTTP 500"),
    "404 is a probe error": (Reply(404), ProbeOutcome.error, "HTTP 404"),
    "no answer in time is a timeout": (Reply(200, delay_s=SLOW_S), ProbeOutcome.timeout, "no answer in 0.3 s"),
    "a dropped connection is a probe error": (Reply(raw=b""), ProbeOutcome.error, "ProtocolError"),
    "a malformed answer is a probe error": (Reply(raw=b"garbage\r\n\r\n"), ProbeOutcome.error, "ProtocolError"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(HEALTH_CASES))
async def test_health(case: str, stub: Stub, client: Client) -> None:
    reply, outcome, detail = HEALTH_CASES[case]
    stub.routes["GET", "/health"] = reply
    result = await probes.probe_health(client, stub.url, deadline(reply))
    assert result.outcome is outcome
    assert result.detail.startswith(detail)
    assert result.latency_s >= 0
    assert [(s.method, s.path) for s in stub.seen] == [("GET", "/health")]


@pytest.mark.anyio
async def test_health_timeout_takes_about_the_timeout(stub: Stub, client: Client) -> None:
    """The deadline covers the whole request; the probe does not wait for the slow answer."""
    stub.routes["GET", "/health"] = Reply(200, delay_s=SLOW_S)
    result = await probes.probe_health(client, stub.url, TIMEOUT_S)
    assert result.outcome is ProbeOutcome.timeout
    assert TIMEOUT_S * 0.9 <= result.latency_s < SLOW_S / 2


@pytest.mark.anyio
async def test_health_refused(refused_url: str, client: Client) -> None:
    result = await probes.probe_health(client, refused_url, ANSWER_S)
    assert result.outcome is ProbeOutcome.refused
    assert result.detail == "connection refused"


@pytest.mark.anyio
async def test_health_ignores_proxies_from_the_environment(
    stub: Stub, refused_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy in the environment (here one that refuses) must not see loopback probes."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, refused_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    stub.routes["GET", "/health"] = Reply(200)
    async with probes.make_client() as client:
        result = await probes.probe_health(client, stub.url, ANSWER_S)
    assert result.outcome is ProbeOutcome.ok


@pytest.mark.anyio
async def test_health_over_ipv6_loopback(client: Client) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python build")
    try:
        gen = _serve(("::1", 0), socket.AF_INET6)
        stub6 = next(gen)
    except OSError as exc:
        pytest.skip(f"cannot listen on ::1 here: {exc}")
    try:
        stub6.routes["GET", "/health"] = Reply(200)
        assert stub6.url.startswith("http://[::1]:")
        assert (await probes.probe_health(client, stub6.url, ANSWER_S)).outcome is ProbeOutcome.ok
    finally:
        gen.close()


@pytest.mark.anyio
async def test_a_slow_canary_does_not_hold_up_health(stub: Stub, client: Client) -> None:
    """One shared client: /health answers while a canary is stuck in flight."""
    stub.routes["GET", "/health"] = Reply(200)
    stub.routes["POST", "/v1/completions"] = Reply(200, COMPLETION_JSON, delay_s=SLOW_S)
    results: dict[str, probes.ProbeResult] = {}

    async def canary() -> None:
        results["canary"] = await probes.probe_canary(client, stub.url, "my-model", 1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(canary)
        with anyio.fail_after(5):
            while not any(s.method == "POST" for s in stub.seen):  # the canary is in flight
                await anyio.sleep(0.01)
        for i in range(3):
            results[f"health{i}"] = await probes.probe_health(client, stub.url, 1.0)
    assert all(results[f"health{i}"].outcome is ProbeOutcome.ok for i in range(3))
    assert results["canary"].outcome is ProbeOutcome.timeout


# ---------------------------------------------------------------------------------------------------------
# canary

CANARY_CASES = {
    "a completion is ok": (Reply(200, COMPLETION_JSON), ProbeOutcome.ok, "HTTP 200"),
    "engine dead 500 is engine_dead": (
        Reply(500, ENGINE_DEAD_JSON),
        ProbeOutcome.engine_dead,
        "HTTP 500: EngineCore encountered an issue.",
    ),
    "another 500 is a probe error": (
        Reply(500, b'{"error":{"message":"boom","type":"Internal Server Error","param":null,"code":500}}'),
        ProbeOutcome.error,
        "HTTP 500: boom",
    ),
    "an unknown model is a probe error": (
        Reply(
            404, b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}}'
        ),
        ProbeOutcome.error,
        "HTTP 404: The model `x` does not exist.",
    ),
    "a 200 that is not a completion is a probe error": (
        Reply(200, b"<html>hi</html>", "text/html"),
        ProbeOutcome.error,
        "HTTP 200 without choices",
    ),
    "no answer in time is a timeout": (
        Reply(200, COMPLETION_JSON, delay_s=SLOW_S),
        ProbeOutcome.timeout,
        "no answer in 0.3 s",
    ),
    "a dropped connection is a probe error": (Reply(raw=b""), ProbeOutcome.error, "ProtocolError"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(CANARY_CASES))
async def test_canary(case: str, stub: Stub, client: Client) -> None:
    reply, outcome, detail = CANARY_CASES[case]
    stub.routes["POST", "/v1/completions"] = reply
    result = await probes.probe_canary(client, stub.url, "my-model", deadline(reply))
    assert result.outcome is outcome
    assert result.detail.startswith(detail)


@pytest.mark.anyio
async def test_canary_request(stub: Stub, client: Client) -> None:
    """One greedy token of "ping" for the served name, as JSON; a bearer token only when given."""
    stub.routes["POST", "/v1/completions"] = Reply(200, COMPLETION_JSON)
    await probes.probe_canary(client, stub.url, "my-model", ANSWER_S)
    await probes.probe_canary(client, stub.url, "my-model", ANSWER_S, api_key="s3cret")
    first, second = stub.seen
    assert (first.method, first.path) == ("POST", "/v1/completions")
    assert json.loads(first.body) == {"model": "my-model", "prompt": "ping", "max_tokens": 1, "temperature": 0}
    assert first.headers["content-type"] == "application/json"
    assert "authorization" not in first.headers
    assert second.headers["authorization"] == "Bearer s3cret"


@pytest.mark.anyio
async def test_canary_refused(refused_url: str, client: Client) -> None:
    result = await probes.probe_canary(client, refused_url, "my-model", ANSWER_S)
    assert result.outcome is ProbeOutcome.refused


# ---------------------------------------------------------------------------------------------------------
# /metrics

EXPECTED = VllmMetrics(
    num_requests_running=3.0,
    generation_tokens_total=1024.0,
    num_requests_waiting=4.0,
    prompt_tokens_total=5000.0,
    kv_cache_usage_perc=0.5,
)


@pytest.mark.anyio
async def test_scrape_metrics(stub: Stub, client: Client) -> None:
    """Summed over engines (label values with spaces, braces and quotes), the KV usage at its highest."""
    stub.routes["GET", "/metrics"] = Reply(200, METRICS_TEXT.encode(), "text/plain; version=0.0.4")
    assert await probes.scrape_vllm_metrics(client, stub.url, ANSWER_S) == EXPECTED


SCRAPE_FAILURES = {
    "500": Reply(500, b"oops"),
    "a page without vLLM series": Reply(200, b"python_info 1.0\n", "text/plain"),
    "no answer in time": Reply(200, METRICS_TEXT.encode(), delay_s=SLOW_S),
    "a dropped connection": Reply(raw=b""),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(SCRAPE_FAILURES))
async def test_scrape_failure_is_none(case: str, stub: Stub, client: Client) -> None:
    stub.routes["GET", "/metrics"] = SCRAPE_FAILURES[case]
    assert await probes.scrape_vllm_metrics(client, stub.url, deadline(SCRAPE_FAILURES[case])) is None


@pytest.mark.anyio
async def test_scrape_refused_is_none(refused_url: str, client: Client) -> None:
    assert await probes.scrape_vllm_metrics(client, refused_url, ANSWER_S) is None


def test_parse_agrees_with_prometheus_client() -> None:
    """The small parser reads the same sums as prometheus_client's full parser."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(METRICS_TEXT):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    parsed = probes.parse_vllm_metrics(METRICS_TEXT)
    assert parsed is not None
    assert parsed.num_requests_running == sums["vllm:num_requests_running"]
    assert parsed.generation_tokens_total == sums["vllm:generation_tokens_total"]
    assert parsed.num_requests_waiting == sums["vllm:num_requests_waiting"]
    assert parsed.prompt_tokens_total == sums["vllm:prompt_tokens_total"]


def test_parse_optional_series_missing() -> None:
    text = "vllm:num_requests_running 0\nvllm:generation_tokens_total 7\n"
    assert probes.parse_vllm_metrics(text) == VllmMetrics(num_requests_running=0.0, generation_tokens_total=7.0)


def test_parse_skips_broken_lines() -> None:
    text = (
        'vllm:num_requests_running{engine="0" 3\nvllm:num_requests_running{engine="0"} x\n'
        "vllm:num_requests_running 1\nvllm:generation_tokens_total 2\nvllm:generation_tokens_total\n"
    )
    assert probes.parse_vllm_metrics(text) == VllmMetrics(num_requests_running=1.0, generation_tokens_total=2.0)


# ---------------------------------------------------------------------------------------------------------
# where to probe

BASE_URLS = {
    ("0.0.0.0", 8000): "http://127.0.0.1:8000",
    ("", 8000): "http://127.0.0.1:8000",
    ("::", 8000): "http://[::1]:8000",
    ("[::]", 8000): "http://[::1]:8000",
    ("127.0.0.1", 9000): "http://127.0.0.1:9000",
    ("10.0.0.2", 8000): "http://10.0.0.2:8000",
    ("fe80::1", 8000): "http://[fe80::1]:8000",
    ("spark-a", 8000): "http://spark-a:8000",
}


@pytest.mark.parametrize(("host", "port"), list(BASE_URLS))
def test_probe_base_url(host: str, port: int) -> None:
    assert probes.probe_base_url(host, port) == BASE_URLS[host, port]


@pytest.mark.anyio
async def test_scrape_tells_metrics_off_from_a_failure(stub: Stub, client: Client) -> None:
    """With --disable-log-stats vLLM's /metrics has only the process and HTTP families: `MetricsOff`, which the
    tracker reports; a failed scrape stays None."""
    stub.routes["GET", "/metrics"] = Reply(200, b"# HELP python_info x\npython_info 1.0\nhttp_requests_total 3\n",
                                           "text/plain")
    assert await probes.scrape_metrics(client, stub.url, ANSWER_S) == probes.MetricsOff()
    stub.routes["GET", "/metrics"] = Reply(200, METRICS_TEXT.encode(), "text/plain; version=0.0.4")
    assert await probes.scrape_metrics(client, stub.url, ANSWER_S) == EXPECTED
    stub.routes["GET", "/metrics"] = Reply(500, b"oops")
    assert await probes.scrape_metrics(client, stub.url, ANSWER_S) is None


def test_a_page_with_vllm_families_but_not_the_needed_ones_is_no_metrics_off() -> None:
    assert probes.read_metrics_page("vllm:cache_config_info 1\n") is None


@pytest.mark.anyio
async def test_every_probe_is_marked_as_sparkds(stub: Stub, client: Client) -> None:
    """/health, /metrics and the canary carry ?probe=sparkd: the shell leaves their access lines out of vLLM's log."""
    stub.routes["GET", "/health"] = Reply(200)
    stub.routes["GET", "/metrics"] = Reply(200, b"vllm:num_requests_running 0\nvllm:generation_tokens_total 1\n")
    stub.routes["POST", "/v1/completions"] = Reply(200, b'{"choices": [{"text": "x"}]}')
    await probes.probe_health(client, stub.url, ANSWER_S)
    await probes.scrape_metrics(client, stub.url, ANSWER_S)
    await probes.probe_canary(client, stub.url, "m", ANSWER_S)
    assert [(s.path, s.query) for s in stub.seen] == [
        ("/health", "probe=sparkd"), ("/metrics", "probe=sparkd"), ("/v1/completions", "probe=sparkd")]
