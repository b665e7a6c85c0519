"""Chat and text completions: validation, token production at a fixed rate, and vLLM 0.13's JSON/SSE shapes.

Every request first runs one engine step (the prefill: an RPC through the EngineCore to the workers), then
produces up to ``max_tokens`` tokens at ``tokens_per_s``, each only while no engine step is in flight. While
stalled, a new request is counted by the scheduler (running or waiting) but never published nor answered. What the
tokens are is :mod:`sparkd_standin.answers` (the prompt's own answer, or a broken engine's); ``return_token_ids``
and ``logprobs`` (``top_logprobs`` for chat) are answered in vLLM 0.32's shapes.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sparkd_standin.answers import Token, answer_tokens, prompt_text
from sparkd_standin.client import EngineClient, EngineDeadError
from sparkd_standin.metrics import VllmMetrics

DEFAULT_MAX_TOKENS = 16


class RequestError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, message: str, err_type: str, code: int) -> None:
        super().__init__(message)
        self.body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
        self.code = code


def random_uuid() -> str:
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


def count_words(value: Any) -> int:
    """Prompt tokens, counted as whitespace-separated words (strings, content parts, token-id lists)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int):
        return 1
    if isinstance(value, dict):
        return count_words(value.get("text", value.get("content", "")))
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    return 0


@dataclass
class GenRequest:
    kind: str  # "chat" | "completion"
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    prompt: str = ""  # what is asked (the answer depends on it)
    logprobs: int | None = None  # top log-probabilities per token (chat: top_logprobs when logprobs is true)
    return_token_ids: bool = False


def parse_request(kind: str, body: Any, served: tuple[str, ...], max_len: int, header_id: str | None) -> GenRequest:
    if not isinstance(body, dict) or (kind == "chat" and not isinstance(body.get("messages"), list)):
        field_name = "messages" if kind == "chat" else "prompt"
        raise RequestError(f"1 validation error: field required: {field_name}", "Bad Request", 400)
    model = body.get("model") or served[0]
    if model not in served:
        raise RequestError(f"The model `{model}` does not exist.", "NotFoundError", 404)
    prompt = count_words(body.get("messages") if kind == "chat" else body.get("prompt", ""))
    if prompt >= max_len:
        raise RequestError(
            f"This model's maximum context length is {max_len} tokens. However, your request has {prompt} "
            "input tokens. Please reduce the length of the input messages.",
            "BadRequestError",
            400,
        )
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    if max_tokens > max_len - prompt:
        raise RequestError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_len} tokens and your request has {prompt} input tokens "
            f"({max_tokens} > {max_len} - {prompt}).",
            "BadRequestError",
            400,
        )
    options = body.get("stream_options") or {}
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return GenRequest(
        kind,
        model,
        prompt,
        int(max_tokens),
        bool(body.get("stream")),
        bool(options.get("include_usage")),
        prefix + (header_id or random_uuid()),
        prompt=prompt_text(kind, body),
        logprobs=_logprobs(kind, body),
        return_token_ids=bool(body.get("return_token_ids")),
    )


def _logprobs(kind: str, body: dict[str, Any]) -> int | None:
    if kind == "chat":
        return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
    value = body.get("logprobs")
    return None if value is None else int(value)


class TokenSource:
    """Produces tokens for requests at a fixed rate, between engine steps, honouring the stall fault."""

    def __init__(self, engine: EngineClient, metrics: VllmMetrics, tokens_per_s: float) -> None:
        self.engine = engine
        self.metrics = metrics
        self.interval_s = 1.0 / max(tokens_per_s, 1e-3)
        self.stalled = False
        self.answers = "normal"  # what the engine answers (sparkd_standin.answers.ANSWER_MODES)
        self.in_flight = 0  # requests the engine holds: a drain waits for them

    async def tokens(self, req: GenRequest) -> AsyncIterator[Token]:
        if self.stalled:
            await self._held(req)
        started = time.monotonic()
        self.in_flight += 1
        try:
            async for token in self._generate(req, started):
                yield token
        finally:
            self.in_flight -= 1

    async def _generate(self, req: GenRequest, started: float) -> AsyncIterator[Token]:
        await self.engine.execute(req.request_id)  # the prefill step
        self.metrics.request_started(req.prompt_tokens, req.max_tokens)
        generated, reason, last = 0, "abort", started
        planned = answer_tokens(req.prompt, req.max_tokens, self.answers)
        try:
            for index, token in enumerate(planned):
                await self._step(req.request_id)
                now = time.monotonic()
                if index == 0:
                    self.metrics.first_token(now - started)
                self.metrics.token_generated(None if index == 0 else now - last)
                generated, last = generated + 1, now
                yield token
            reason = "length" if generated == req.max_tokens else "stop"
        except EngineDeadError:
            reason = "error"
            raise
        finally:
            self.metrics.request_finished(reason, req.prompt_tokens, generated, time.monotonic() - started)

    async def _held(self, req: GenRequest) -> None:
        """A request arriving at the stalled engine: held until the engine dies (then EngineDeadError)."""
        scheduled = self.metrics.running == 0
        self.metrics.request_held(scheduled=scheduled)
        # No try/finally: a client that gives up cannot take its request back from a wedged engine (the abort
        # waits for the engine loop), so it stays counted, running or waiting, until the engine dies.
        await self.engine.execute(f"{req.request_id}-held")
        self.metrics.request_released(scheduled=scheduled)
        if self.engine.errored:
            raise EngineDeadError

    async def _step(self, request_id: str) -> None:
        await asyncio.sleep(self.interval_s)
        if self.engine.frozen:
            await asyncio.Event().wait()  # nobody answers a request of a killed engine any more
        if self.stalled:
            await self.engine.execute(f"{request_id}-step")  # held by the stalled engine until it dies
        await self.engine.steps_flow()  # a step in flight (a JIT compile, a hung collective) holds every token
        if self.engine.errored:
            raise EngineDeadError


def usage(req: GenRequest, generated: int) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + generated,
        "completion_tokens": generated,
        "prompt_tokens_details": None,
    }


def finish_reason(req: GenRequest, generated: int) -> str:
    return "length" if generated == req.max_tokens else "stop"


def token_logprobs(req: GenRequest, tokens: list[Token]) -> dict[str, Any] | None:
    """vLLM 0.32's ``logprobs`` of a whole answer: chat's ``content`` list, or the completion's four lists."""
    if req.logprobs is None:
        return None
    k = req.logprobs
    if req.kind == "chat":
        def entry(text: str, logprob: float) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [{**entry(t.text, t.logprob), "top_logprobs": [entry(x, lp) for x, lp in t.top[:k]]}
                            for t in tokens]}
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t.text)
    return {"text_offset": offsets, "token_logprobs": [t.logprob for t in tokens], "tokens": [t.text for t in tokens],
            "top_logprobs": [dict(t.top[:max(k, 1)]) for t in tokens]}


def full_response(req: GenRequest, tokens: list[Token]) -> dict[str, Any]:
    text = "".join(t.text for t in tokens)
    ids = [t.id for t in tokens] if req.return_token_ids else None
    logprobs = token_logprobs(req, tokens)
    if req.kind == "chat":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning": None,
            "reasoning_content": None,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(req, len(tokens)),
            "stop_reason": None,
            "token_ids": ids,
        }
        return {
            "id": req.request_id,
            "object": "chat.completion",
            "created": req.created,
            "model": req.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(req, len(tokens)),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason(req, len(tokens)),
        "stop_reason": None,
        "token_ids": ids,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
    }
    return {
        "id": req.request_id,
        "object": "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(req, len(tokens)),
        "kv_transfer_params": None,
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _chunk(req: GenRequest, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {
        "id": req.request_id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": [choice],
        **extra,
    }


def _token_chunk(req: GenRequest, token: str, last: bool, reason: str = "length") -> dict[str, Any]:
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": token},
            "logprobs": None,
            "finish_reason": reason if last else None,
        }
        if last:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        return _chunk(req, choice)
    choice = {
        "index": 0,
        "text": token,
        "logprobs": None,
        "finish_reason": reason if last else None,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    return _chunk(req, choice, usage=None)


async def stream_events(source: TokenSource, req: GenRequest) -> AsyncIterator[str]:
    """SSE events: (chat) a role chunk, one chunk per token, optional usage chunk, then ``[DONE]``."""
    generated = 0
    try:
        pending: str | None = None
        async for token in source.tokens(req):
            if generated == 0 and req.kind == "chat":
                role = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield _sse(_chunk(req, role, prompt_token_ids=None))
            if pending is not None:
                yield _sse(_token_chunk(req, pending, last=False))
            pending, generated = token.text, generated + 1
        if pending is not None:
            yield _sse(_token_chunk(req, pending, last=True, reason=finish_reason(req, generated)))
        if req.include_usage:
            final = {
                "id": req.request_id,
                "object": _chunk(req, {})["object"],
                "created": req.created,
                "model": req.model,
                "choices": [],
                "usage": usage(req, generated),
            }
            final["usage"].pop("prompt_tokens_details")
            yield _sse(final)
    except EngineDeadError as exc:
        error = {"message": str(exc), "type": "BadRequestError", "param": None, "code": 400}
        yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"
