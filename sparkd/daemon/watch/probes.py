"""HTTP probes against vLLM's API server: `/health`, a one-token generation canary, `/metrics`. I/O only.

Each probe makes one request through a shared :class:`sparkd.host.plainhttp.Client` (:func:`make_client`) and maps what
happened to a :class:`~sparkd.supervisor.health.ProbeResult`; the verdict is the pure tracker's job
(:mod:`sparkd.supervisor.health`). The mapping (kubelet's "could not probe is not unhealthy"):

- an answer: 200 → `ok`; `/health` 503 → `engine_dead`; a canary 500 whose body says "EngineCore encountered
  an issue" (or EngineDeadError) → `engine_dead`; any other status → `error`;
- connection refused → `refused` (nothing listens: vLLM is still loading, or its API server is gone);
- no complete answer within `timeout_s` (one deadline over connect, send and read) → `timeout`;
- anything else (reset, protocol error, a malformed canary body, another connect error) → `error`.

Probes never raise for what the server does; they raise only when cancelled.

Probes go to the loopback address when vLLM listens on all addresses, and never through an HTTP proxy from
the environment: an `http_proxy` meant for downloads would swallow every probe. Every probe's path carries the query
``probe=sparkd`` (`sparkd.supervisor.probelines`): the shell leaves their access-log lines out of vLLM's log.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Mapping

import anyio

from sparkd import __version__
from sparkd.config import HealthConfig
from sparkd.host.plainhttp import Client, ProtocolError, Response
from sparkd.supervisor.health import MetricsOff, ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.healthsignal import Answer
from sparkd.supervisor.probelines import probe_url

__all__ = [
    "HttpProbes",
    "MetricsOff",
    "ProbeOutcome",
    "ProbeResult",
    "VllmMetrics",
    "make_client",
    "parse_vllm_metrics",
    "probe_base_url",
    "probe_canary",
    "probe_health",
    "read_metrics_page",
    "scrape_metrics",
    "scrape_vllm_metrics",
]

_ENGINE_DEAD_MARKS = ("EngineCore encountered an issue", "EngineDeadError")
_MAX_DETAIL = 160  # characters of a response body kept in a probe's detail


def probe_base_url(host: str, port: int) -> str:
    """The URL to probe vLLM at, for its configured `--host` and `--port`.

    A wildcard host (0.0.0.0, ::, empty) is probed on the matching loopback address.
    """
    host = host.strip().strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_client() -> Client:
    """The client all probes of one daemon share; close it with `aclose()` (or `async with`).

    No connection is kept alive between probes (uvicorn drops idle connections after 5 s, which races a 5 s probe
    interval; a fresh connection to loopback costs nothing), no proxy from the environment, no TLS. Timeouts are
    set per probe.
    """
    return Client(headers={"User-Agent": f"sparkd/{__version__} (probe)"})


def _is_refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or getattr(current, "errno", None) == errno.ECONNREFUSED:
            return True
        current = current.__cause__ or current.__context__
    return False


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"


async def _request(
    client: Client, method: str, url: str, timeout_s: float, *,
    json_body: object = None, headers: Mapping[str, str] | None = None,
) -> tuple[Response, float] | ProbeResult:
    """One request under one overall deadline: (response, latency), or the failed ProbeResult."""
    start = time.monotonic()

    def failed(outcome: ProbeOutcome, detail: str) -> ProbeResult:
        return ProbeResult(outcome, time.monotonic() - start, detail)

    connected = False
    try:
        with anyio.fail_after(timeout_s):
            response = await client.request(method, url, json=json_body, headers=headers, timeout=timeout_s)
            connected = True
    except TimeoutError:
        return failed(ProbeOutcome.timeout, f"no answer in {timeout_s:g} s")
    except ProtocolError as exc:
        return failed(ProbeOutcome.error, f"ProtocolError: {_short(str(exc))}")
    except OSError as exc:  # refused, unreachable, reset (anyio's own stream errors are OSErrors too)
        if _is_refused(exc):
            return failed(ProbeOutcome.refused, "connection refused")
        what = "connect error" if not connected else type(exc).__name__
        return failed(ProbeOutcome.error, f"{what}: {_short(str(exc) or type(exc).__name__)}")
    return response, time.monotonic() - start


async def probe_health(client: Client, base_url: str, timeout_s: float) -> ProbeResult:
    """GET /health: 200 → ok, 503 → engine_dead, refused, timeout, else error."""
    answer = await _request(client, "GET", probe_url(base_url, "/health"), timeout_s)
    if isinstance(answer, ProbeResult):
        return answer
    response, latency = answer
    if response.status_code == 200:
        return ProbeResult(ProbeOutcome.ok, latency, "HTTP 200")
    if response.status_code == 503:
        return ProbeResult(ProbeOutcome.engine_dead, latency, "HTTP 503")
    return ProbeResult(ProbeOutcome.error, latency, f"HTTP {response.status_code}")


async def probe_canary(
    client: Client, base_url: str, model: str, timeout_s: float, *, api_key: str | None = None
) -> ProbeResult:
    """POST /v1/completions for one greedy token of "ping" as `model` (the served name).

    200 with choices → ok; 500 saying "EngineCore encountered an issue" → engine_dead; refused; timeout;
    any other answer (a 400/404 for a wrong model name, a 401 for a missing API key, a body without
    choices) → error.
    """
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    answer = await _request(client, "POST", probe_url(base_url, "/v1/completions"), timeout_s, json_body=body,
                            headers=headers)
    if isinstance(answer, ProbeResult):
        return answer
    response, latency = answer
    status = response.status_code
    if status == 200:
        try:
            choices = response.json().get("choices")
        except (ValueError, AttributeError):
            choices = None
        if isinstance(choices, list) and choices:
            return ProbeResult(ProbeOutcome.ok, latency, "HTTP 200")
        return ProbeResult(ProbeOutcome.error, latency, f"HTTP 200 without choices: {_short(response.text)}")
    message = _error_message(response.text)
    if status >= 500 and any(mark in response.text for mark in _ENGINE_DEAD_MARKS):
        return ProbeResult(ProbeOutcome.engine_dead, latency, f"HTTP {status}: {message}")
    return ProbeResult(ProbeOutcome.error, latency, f"HTTP {status}: {message}")


def _error_message(text: str) -> str:
    """vLLM's error JSON `{"error": {"message": ...}}` → the message; anything else, shortened."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return _short(text)
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return _short(error["message"])
    return _short(text)


async def scrape_vllm_metrics(client: Client, base_url: str, timeout_s: float) -> VllmMetrics | None:
    """GET /metrics and parse the series the health checks need; None if the scrape failed in any way."""
    answer = await _request(client, "GET", probe_url(base_url, "/metrics"), timeout_s)
    if isinstance(answer, ProbeResult) or answer[0].status_code != 200:
        return None
    return parse_vllm_metrics(answer[0].text)


async def scrape_metrics(
    client: Client, base_url: str, timeout_s: float
) -> VllmMetrics | MetricsOff | None:
    """GET /metrics for the health tracker: the series, `MetricsOff` when the page answered without any `vllm:*`
    family (vLLM runs with --disable-log-stats), or None if the scrape failed in any way."""
    answer = await _request(client, "GET", probe_url(base_url, "/metrics"), timeout_s)
    if isinstance(answer, ProbeResult) or answer[0].status_code != 200:
        return None
    return read_metrics_page(answer[0].text)


def read_metrics_page(text: str) -> VllmMetrics | MetricsOff | None:
    """`parse_vllm_metrics`, telling a page with no `vllm:*` family at all (`MetricsOff`) from one that lacks
    the series the tracker needs (None)."""
    parsed = parse_vllm_metrics(text)
    if parsed is not None:
        return parsed
    if any(line.startswith("vllm:") for line in text.splitlines()):
        return None
    return MetricsOff()


_SUMMED = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:iteration_tokens_total_count": "engine_steps_total",  # one per engine step with outputs (a heartbeat)
}
_MAXED = {"vllm:kv_cache_usage_perc": "kv_cache_usage_perc"}
_WANTED = tuple(_SUMMED) + tuple(_MAXED)  # the prefixes worth a look: most of a page is series nobody reads


def parse_vllm_metrics(text: str) -> VllmMetrics | None:
    """The needed series from a Prometheus text exposition; None without running requests and tokens.

    Reads only samples of the wanted names (a full vLLM page is mostly histogram buckets): gauges and
    counters are summed over label sets (one per engine), the KV cache usage takes the highest.
    """
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        sample = _sample(line)
        if sample is None:
            continue
        name, value = sample
        if name in _SUMMED:
            key = _SUMMED[name]
            values[key] = values.get(key, 0.0) + value
        elif name in _MAXED:
            key = _MAXED[name]
            values[key] = max(values.get(key, value), value)
    if "num_requests_running" not in values or "generation_tokens_total" not in values:
        return None
    return VllmMetrics(
        num_requests_running=values["num_requests_running"],
        generation_tokens_total=values["generation_tokens_total"],
        num_requests_waiting=values.get("num_requests_waiting"),
        prompt_tokens_total=values.get("prompt_tokens_total"),
        kv_cache_usage_perc=values.get("kv_cache_usage_perc"),
        engine_steps_total=values.get("engine_steps_total"),
    )


def _sample(line: str) -> tuple[str, float] | None:
    """`name{labels} value [timestamp]` → (name, value), if the name is wanted; label values may hold
    spaces, braces and escaped quotes."""
    brace = line.find("{")
    space = line.find(" ")
    labelled = brace != -1 and (space == -1 or brace < space)
    name = line[:brace] if labelled else line[:space] if space != -1 else line
    if name not in _SUMMED and name not in _MAXED:
        return None  # before the labels are walked: most of a page is histogram buckets nobody reads
    rest = _after_labels(line, brace) if labelled else line[space:] if space != -1 else None
    if rest is None:
        return None
    fields = rest.split()
    if not fields:
        return None
    try:
        return name, float(fields[0])
    except ValueError:
        return None


def _after_labels(line: str, brace: int) -> str | None:
    in_quotes = escaped = False
    for i in range(brace + 1, len(line)):
        char = line[i]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_quotes = not in_quotes
        elif char == "}" and not in_quotes:
            return line[i + 1:]
    return None


class HttpProbes:
    """The three probes of one instance's API server, over one client (``aclose`` closes it): where it listens and
    what it serves are the launch's; the timeouts are ``[health]``'s in force, read at every probe."""

    def __init__(self, *, host: str, port: int, model: str, api_key: str | None,
                 settings: Callable[[], HealthConfig]) -> None:
        self.base = probe_base_url(host, port)
        self.model = model
        self.api_key = api_key
        self.settings = settings
        self._client = make_client()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def health(self) -> ProbeResult:
        return await probe_health(self._client, self.base, self.settings().timeout_s)

    async def metrics(self) -> VllmMetrics | MetricsOff | None:
        return await scrape_metrics(self._client, self.base, self.settings().timeout_s)

    async def canary(self) -> ProbeResult:
        return await probe_canary(self._client, self.base, self.model, self.settings().canary_timeout_s,
                                  api_key=self.api_key)

    async def fetch(self, path: str) -> Answer | ProbeResult:
        """``GET path``, the API key sent when there is one: a health signal's own question."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        answer = await _request(self._client, "GET", probe_url(self.base, path), self.settings().timeout_s,
                                headers=headers)
        if isinstance(answer, ProbeResult):
            return answer
        response, latency = answer
        return Answer(response.status_code, response.text, latency)
