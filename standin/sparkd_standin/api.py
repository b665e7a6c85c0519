"""The OpenAI-compatible HTTP app (starlette), with vLLM's routes, bodies and status codes (0.13's shapes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkd_standin import logfmt
from sparkd_standin.answers import Token
from sparkd_standin.args import ServeConfig
from sparkd_standin.client import EngineClient, EngineDeadError
from sparkd_standin.drain import REFUSAL
from sparkd_standin.generate import (
    GenRequest,
    RequestError,
    TokenSource,
    full_response,
    parse_request,
    random_uuid,
    stream_events,
)
from sparkd_standin.knobs import Knobs
from sparkd_standin.metrics import StatsLogger, VllmMetrics

# What 0.13 prints after "Available routes are:" (a representative subset, in its order).
ROUTES = (
    ("/openapi.json", "HEAD, GET"),
    ("/docs", "HEAD, GET"),
    ("/docs/oauth2-redirect", "HEAD, GET"),
    ("/redoc", "HEAD, GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/load", "GET"),
    ("/version", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/ping", "GET"),
    ("/ping", "POST"),
    ("/v1/models", "GET"),
    ("/v1/responses", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/embeddings", "POST"),
    ("/pooling", "POST"),
    ("/classify", "POST"),
    ("/score", "POST"),
    ("/v1/score", "POST"),
    ("/rerank", "POST"),
    ("/v1/rerank", "POST"),
    ("/invocations", "POST"),
)
DEV_ROUTES = (
    ("/server_info", "GET"),
    ("/reset_prefix_cache", "POST"),
    ("/sleep", "POST"),
    ("/wake_up", "POST"),
    ("/is_sleeping", "GET"),
    ("/collective_rpc", "POST"),
)


def dev_mode() -> bool:
    return os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("0", "", "false", "False")


@dataclass
class AppState:
    config: ServeConfig
    knobs: Knobs
    engine: EngineClient
    metrics: VllmMetrics
    source: TokenSource
    created: int = field(default_factory=lambda: int(time.time()))
    background: list[Callable[[AppState], Coroutine[Any, Any, None]]] = field(default_factory=list)
    stopping: bool = False  # 0.32: SIGTERM came; HTTP serves on while the engine drains, new requests are refused


class AuthenticationMiddleware:
    """``--api-key``: every /v1 path needs ``Authorization: Bearer <key>``; 401 ``{"error":"Unauthorized"}``."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...]) -> None:
        self.app = app
        self.tokens = {f"Bearer {key}" for key in api_keys}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith("/v1") and Headers(scope=scope).get("authorization") not in self.tokens:
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _state(request: Request) -> AppState:
    return request.app.state.standin


async def health(request: Request) -> Response:
    return Response(status_code=503 if _state(request).engine.errored else 200)


async def version(request: Request) -> Response:
    return JSONResponse({"version": _state(request).knobs.vllm_version})


async def load(request: Request) -> Response:
    return JSONResponse({"server_load": 0})


async def models(request: Request) -> Response:
    state = _state(request)
    cfg = state.config
    cards = [
        {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.resolved_max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{random_uuid()}",
                    "object": "model_permission",
                    "created": state.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for name in cfg.served_model_names
    ]
    return JSONResponse({"object": "list", "data": cards})


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _completion(request: Request, kind: str) -> Response:
    state = _state(request)
    try:
        body = await request.json()
    except ValueError:
        body = None
    try:
        req = parse_request(
            kind,
            body,
            state.config.served_model_names,
            state.config.resolved_max_model_len,
            request.headers.get("x-request-id"),
        )
    except RequestError as exc:
        return JSONResponse(exc.body, status_code=exc.code)
    if state.stopping:  # vLLM 0.32's renderer has shut down its thread pool: plain or streamed, a 500 at once
        return JSONResponse(REFUSAL, status_code=500)
    if req.stream:
        return StreamingResponse(stream_events(state.source, req), media_type="text/event-stream")
    generation = asyncio.ensure_future(_collect(state, req))
    disconnect = asyncio.ensure_future(_client_gone(request))
    await asyncio.wait({generation, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    for task in (generation, disconnect):
        task.cancel()
    if not generation.done() or generation.cancelled():
        return Response(status_code=499)  # vLLM's with_cancellation: the client is gone, nobody reads this
    try:
        tokens = generation.result()
    except EngineDeadError as exc:
        error = RequestError(str(exc), "Internal Server Error", 500)
        return JSONResponse(error.body, status_code=500)
    return JSONResponse(full_response(req, tokens))


async def _collect(state: AppState, req: GenRequest) -> list[Token]:
    return [token async for token in state.source.tokens(req)]


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def chat_completions(request: Request) -> Response:
    return await _completion(request, "chat")


async def completions(request: Request) -> Response:
    return await _completion(request, "completion")


async def sleep(request: Request) -> Response:
    return Response(status_code=200)


async def wake_up(request: Request) -> Response:
    logfmt.info("api_router.py:63", f"wake up the engine with tags: {request.query_params.getlist('tags') or None}")
    return Response(status_code=200)


async def is_sleeping(request: Request) -> Response:
    logfmt.info("api_router.py:71", "check whether the engine is sleeping")
    return JSONResponse({"is_sleeping": False})


async def server_info(request: Request) -> Response:
    return JSONResponse({"vllm_config": str(_state(request).config)})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


def _routes() -> list[Route]:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/version", version, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    if dev_mode():
        routes += [
            Route("/sleep", sleep, methods=["POST"]),
            Route("/wake_up", wake_up, methods=["POST"]),
            Route("/is_sleeping", is_sleeping, methods=["GET"]),
            Route("/server_info", server_info, methods=["GET"]),
            Route("/reset_prefix_cache", sleep, methods=["POST"]),
        ]
    return routes


def build_app(state: AppState) -> ASGIApp:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(job(state)) for job in state.background]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()

    app = Starlette(routes=_routes(), lifespan=lifespan, exception_handlers={404: _http_error, 405: _http_error})
    app.state.standin = state
    if state.config.api_keys:
        return AuthenticationMiddleware(app, state.config.api_keys)
    return app


async def log_stats_forever(state: AppState) -> None:
    interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))
    stats = StatsLogger(state.metrics, state.knobs.dialect.at("stats"), state.knobs.dialect.device)
    while True:
        await asyncio.sleep(interval)
        stats.log()


def route_lines() -> list[str]:
    listed = ROUTES + (DEV_ROUTES if dev_mode() else ())
    return [f"Route: {path}, Methods: {methods}" for path, methods in listed]
