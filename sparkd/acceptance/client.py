"""The gate's client: the fixed prompts asked through vLLM's two APIs, and its ``/metrics`` page. I/O only; what the
answers mean is :mod:`sparkd.supervisor.acceptance`.

Every request: temperature 0, the configured seed and ``max_tokens``, ``return_token_ids`` (vLLM's own token ids;
the fingerprint compares them), ``logprobs`` with the configured top log-probabilities. Chat requests go through
the model's chat template with ``chat_template_kwargs`` (thinking off by default: the answer is in the content);
completions send the prompt as it is. The path carries ``probe=sparkd`` (:mod:`sparkd.supervisor.probelines`): the
access-log lines stay out of vLLM's log, as the probes' do. A request that gets no answer raises :class:`AskFailed`
with a sentence; nothing else is raised but a cancellation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from sparkd import __version__
from sparkd.host.plainhttp import Client, ProtocolError
from sparkd.supervisor.acceptance.answers import Answer, Shape
from sparkd.supervisor.probelines import probe_url

__all__ = ["AnswerClient", "AskFailed", "Target", "answer_from", "request_body"]


class AskFailed(Exception):
    """A gate request that got no usable answer; the message is the sentence."""


@dataclass(frozen=True)
class Target:
    base_url: str  # http://127.0.0.1:8000
    model: str  # the served name
    api_key: str | None = None


def request_body(api: str, model: str, prompt: str, shape: Shape,
                 chat_template_kwargs: Mapping[str, object] | None = None) -> dict[str, Any]:
    common: dict[str, Any] = {"model": model, "max_tokens": shape.max_tokens, "temperature": 0, "seed": shape.seed,
                              "return_token_ids": True}
    if api == "chat":
        body = {**common, "messages": [{"role": "user", "content": prompt}], "logprobs": True,
                "top_logprobs": shape.top_logprobs}
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        return body
    return {**common, "prompt": prompt, "logprobs": shape.top_logprobs}


def answer_from(api: str, prompt_name: str, body: Any) -> Answer:
    """vLLM's response body as an :class:`Answer`; ValueError (a sentence) when it is not one."""
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"an answer without choices: {_short(body)}") from None
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError("an answer without token_ids (a vLLM older than return_token_ids?)")
    if api == "chat":
        message = choice.get("message") or {}
        text = message.get("content") or message.get("reasoning") or message.get("reasoning_content") or ""
        tokens, top = _chat_logprobs(choice.get("logprobs"))
    else:
        text = choice.get("text") or ""
        tokens, top = _completion_logprobs(choice.get("logprobs"))
    return Answer(prompt_name, api, tuple(ids), str(text), choice.get("finish_reason"), tokens, top)


def _chat_logprobs(logprobs: Any) -> tuple[tuple[str, ...], tuple[tuple[tuple[str, float], ...], ...]]:
    content = (logprobs or {}).get("content") or []
    tokens = tuple(str(entry.get("token", "")) for entry in content)
    top = tuple(tuple((str(t["token"]), float(t["logprob"])) for t in entry.get("top_logprobs") or ())
                for entry in content)
    return tokens, top


def _completion_logprobs(logprobs: Any) -> tuple[tuple[str, ...], tuple[tuple[tuple[str, float], ...], ...]]:
    logprobs = logprobs or {}
    tokens = tuple(str(t) for t in logprobs.get("tokens") or ())
    top = tuple(tuple(sorted(((str(t), float(lp)) for t, lp in (entry or {}).items()), key=lambda kv: -kv[1]))
                for entry in logprobs.get("top_logprobs") or ())
    return tokens, top


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AnswerClient:
    """Asks one vLLM; one plain HTTP/1.1 request per question (:mod:`sparkd.host.plainhttp`)."""

    def __init__(self, target: Target, *, timeout_s: float, http: Client | None = None) -> None:
        self.target, self.timeout_s = target, timeout_s
        self.http = http or Client(headers={"User-Agent": f"sparkd/{__version__} (acceptance)"})
        self.headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else None

    async def ask(self, prompt_name: str, prompt: str, api: str, shape: Shape,
                  chat_template_kwargs: Mapping[str, object] | None = None) -> Answer:
        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        body = request_body(api, self.target.model, prompt, shape, chat_template_kwargs)
        what = f"prompt {prompt_name!r} ({api})"
        started = time.monotonic()
        try:
            with anyio.fail_after(self.timeout_s):
                response = await self.http.request("POST", probe_url(self.target.base_url, path), json=body,
                                                   headers=self.headers, timeout=self.timeout_s)
        except TimeoutError:
            raise AskFailed(f"{what} got no answer in {self.timeout_s:g} s") from None
        except (OSError, ProtocolError) as exc:
            raise AskFailed(f"{what}: {type(exc).__name__}: {_short(str(exc) or type(exc).__name__)}") from None
        if response.status_code != 200:
            raise AskFailed(f"{what}: HTTP {response.status_code}: {_short(response.text)}")
        try:
            return answer_from(api, prompt_name, response.json())
        except ValueError as exc:
            raise AskFailed(f"{what} after {time.monotonic() - started:.1f} s: {exc}") from None

    async def aclose(self) -> None:
        await self.http.aclose()

    async def awake(self) -> bool:
        """vLLM's engine is awake (``GET /is_sleeping``, a route of vLLM's sleep mode): a gate after a wake asks once
        it is. A vLLM without the route, or one that does not answer it, counts as awake (its answers tell)."""
        try:
            with anyio.fail_after(self.timeout_s):
                response = await self.http.request("GET", probe_url(self.target.base_url, "/is_sleeping"),
                                                   headers=self.headers, timeout=self.timeout_s)
            return response.status_code != 200 or response.json().get("is_sleeping") is not True
        except (TimeoutError, OSError, ProtocolError, ValueError, AttributeError):
            return True

    async def metrics(self) -> str | None:
        """vLLM's ``/metrics`` page, or None when it cannot be read."""
        try:
            with anyio.fail_after(self.timeout_s):
                response = await self.http.request("GET", probe_url(self.target.base_url, "/metrics"),
                                                   timeout=self.timeout_s)
        except (TimeoutError, OSError, ProtocolError):
            return None
        return response.text if response.status_code == 200 else None
