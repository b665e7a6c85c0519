"""Startup progress from vLLM's log: the phase a rank is in and the facts it reported. Pure.

vLLM has no loading state on the wire (its port does not listen until "Application startup complete."), so
the log is the only view into a cold start of 8–10 minutes. `advance(progress, line, now)` folds one raw log
line (head or worker; colour, process prefix and tqdm `\\r` frames are handled) into a `Startup`.

Rules:

- Phases only move forward: launching → waiting_for_peer → loading_weights → kv_cache → graph_capture →
  api_starting → ready. A line that belongs to an earlier phase still counts as progress.
- Every recognised line is progress and sets `last_progress_at = now`; a supervisor extends its startup
  deadline while progress continues and calls a startup stall when it stops. Unrecognised lines (warnings,
  the TCPStore client's retries, stats lines) change nothing, and `advance` returns the same object.
- `distributed_ready` turns on when the rank is past torch.distributed init: the `rank N in world size M is
  assigned as` line, or any line that only comes after init (weights loading, `Loading weights took`,
  `Model loading took`). That is what a headless worker's readiness rests on.

The line formats are vLLM's own (reference/vllm-runtime-surface.md §3.2, community-recipes.md §12 "Boot
progress"), across 0.11.1–0.33: both the separate and the merged (≥0.28) KV-cache/concurrency lines, both
"Starting vLLM API server 0 on" (≤0.16) and "Starting vLLM server on" (≥0.18). vLLM's CPU build (0.32, the real
vLLM of the test tier, tests/realvllm) logs no "Model loading took": its compile is "Warming up model for the
compilation...", its KV cache "Explicitly set (X/Y) GiB for KV cache" and "CPU KV cache size". A world of one
(``world_size=1``) never waits for a peer, so its rank line does not enter `waiting_for_peer`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from sparkd.supervisor.logline import clean

__all__ = ["PHASE_ORDER", "Phase", "Startup", "advance", "is_progress"]


class Phase(StrEnum):
    launching = "launching"  # process started; version, args, engine config lines
    waiting_for_peer = "waiting_for_peer"  # in torch.distributed init, blocked until the other rank joins
    loading_weights = "loading_weights"  # past distributed init, reading checkpoint shards
    compiling = "compiling"  # weights loaded: torch.compile and the memory profile run
    kv_cache = "kv_cache"  # profiling done, KV cache sized
    graph_capture = "graph_capture"  # capturing CUDA graphs
    api_starting = "api_starting"  # engine up; API server starting (head only)
    ready = "ready"  # "Application startup complete." (head only)

    @property
    def order(self) -> int:
        """Position in the startup sequence; phases only move to a higher order."""
        return PHASE_ORDER.index(self)


PHASE_ORDER: tuple[Phase, ...] = tuple(Phase)


@dataclass(frozen=True)
class Startup:
    phase: Phase = Phase.launching
    shards_loaded: int | None = None
    shards_total: int | None = None
    kv_cache_gib: float | None = None  # "Available KV cache memory: X GiB"
    kv_cache_tokens: int | None = None  # "GPU KV cache size: N tokens" ("CPU KV cache size" on the CPU build)
    max_concurrency: float | None = None  # "Maximum concurrency for T tokens per request: Xx"
    max_concurrency_tokens: int | None = None  # T in that line
    model_loading_gib: float | None = None  # "Model loading took X GiB memory and Y seconds"
    model_loading_s: float | None = None  # Y in that line
    world_size: int | None = None
    rank: int | None = None  # this process's global rank, once logged
    last_progress_at: float | None = None  # monotonic time of the last line that meant progress
    distributed_ready: bool = False  # the rank is past torch.distributed init


def _int(s: str) -> int:
    return int(s.replace(",", ""))


_Facts = Callable[[re.Match[str]], dict[str, Any]]


_PhaseOf = Callable[[re.Match[str]], "Phase | None"]


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    # the phase this line proves we reached (or a function of the match saying so); None: progress within the phase
    phase: Phase | _PhaseOf | None
    facts: _Facts | None = None
    distributed: bool = False  # the line proves the rank is past torch.distributed init

    def reached(self, m: re.Match[str]) -> Phase | None:
        return self.phase(m) if callable(self.phase) else self.phase


def _rule(
    pattern: str, phase: Phase | _PhaseOf | None, facts: _Facts | None = None, *, distributed: bool = False
) -> _Rule:
    return _Rule(re.compile(pattern), phase, facts, distributed)


def _world(m: re.Match[str]) -> dict[str, Any]:
    return {"world_size": int(m.group("world")), "rank": int(m.group("rank"))}


def _shards(m: re.Match[str]) -> dict[str, Any]:
    return {"shards_loaded": int(m.group("n")), "shards_total": int(m.group("total"))}


def _model_loading(m: re.Match[str]) -> dict[str, Any]:
    return {"model_loading_gib": float(m.group("gib")), "model_loading_s": float(m.group("secs"))}


def _kv_gib(m: re.Match[str]) -> dict[str, Any]:
    return {"kv_cache_gib": float(m.group("gib"))}


def _kv_tokens(m: re.Match[str]) -> dict[str, Any]:
    return {"kv_cache_tokens": _int(m.group("tokens"))}


def _concurrency(m: re.Match[str]) -> dict[str, Any]:
    return {"max_concurrency_tokens": _int(m.group("tokens")), "max_concurrency": float(m.group("x"))}


def _peer_wait(m: re.Match[str]) -> Phase | None:
    """torch.distributed init waits for the other ranks only when there are others: a world of one waits for none."""
    return Phase.waiting_for_peer if int(m.group("world")) > 1 else None


P = Phase
# Every rule is tried on every line: the ≥0.28 KV line matches both the size and the concurrency rule.
_RULES: tuple[_Rule, ...] = (
    # launching
    _rule(r"vLLM (?:API )?server version \S+", P.launching),
    _rule(r"Initializing a V1 LLM engine", P.launching),
    # waiting for the peer (torch.distributed init blocks until every rank joins the TCPStore)
    _rule(r"world_size=(?P<world>\d{1,18}) rank=(?P<rank>\d{1,18}) local_rank=\d+ distributed_init_method=",
          _peer_wait, _world),
    _rule(r"Launching vLLM \(v[^)]*\) headless multiproc executor", P.waiting_for_peer),
    # past distributed init
    _rule(r"rank (?P<rank>\d{1,18}) in world size (?P<world>\d{1,18}) is assigned as", P.loading_weights, _world,
          distributed=True),
    _rule(r"vLLM is using nccl==", None),
    _rule(r"Starting to load model ", P.loading_weights, distributed=True),
    _rule(r"Loading [^:]*:\s*\d+% Completed \| (?P<n>\d{1,18})/(?P<total>\d{1,18})\b", P.loading_weights, _shards,
          distributed=True),
    _rule(r"Loading weights took [\d.]+ seconds", P.loading_weights, distributed=True),
    _rule(r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<secs>[\d.]+) seconds",
          P.compiling, _model_loading, distributed=True),
    _rule(r"Loading drafter model", None),
    # torch.compile and the memory profile (between the weights and the KV cache); vLLM's CPU build (0.32) warms the
    # model up for its compile instead, and logs no "Model loading took"
    _rule(r"Dynamo bytecode transform time|Compiling a graph for|torch\.compile takes", P.compiling),
    _rule(r"Warming up model for the compilation|Warming up done\.|saved AOT compiled function|"
          r"Initial profiling/warmup run took", P.compiling, distributed=True),
    # KV cache (the device word is the platform's: GPU on CUDA, CPU on vLLM's CPU build)
    _rule(r"Available KV cache memory: (?P<gib>[\d.]+) GiB", P.kv_cache, _kv_gib, distributed=True),
    _rule(r"Explicitly set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache", P.kv_cache, _kv_gib, distributed=True),
    _rule(r"\b[A-Z]{2,4} KV cache size: (?P<tokens>[\d,]{1,24}) tokens", P.kv_cache, _kv_tokens),
    _rule(r"Maximum concurrency for (?P<tokens>[\d,]{1,24}) tokens per request: (?P<x>[\d.]+)x", P.kv_cache,
          _concurrency),
    # CUDA graphs
    _rule(r"Capturing CUDA graphs", P.graph_capture, distributed=True),
    _rule(r"Graph capturing finished", P.graph_capture, distributed=True),
    # engine up, API server starting
    _rule(r"init engine \(profile, create kv cache, warmup model\) took", P.api_starting),
    _rule(r"Supported tasks: ", P.api_starting),
    _rule(r"Starting vLLM (?:API )?server(?: \d+)? on https?://", P.api_starting),
    _rule(r"Available routes are:", P.api_starting),
    _rule(r"Started server process \[\d+\]|Waiting for application startup\.", P.api_starting),
    # ready
    _rule(r"Application startup complete\.", P.ready),
)
del P

_ANY = re.compile("|".join(f"(?:{re.sub(r'[(][?]P<[a-z]+>', '(?:', r.pattern.pattern)})" for r in _RULES))


def is_progress(line: str) -> bool:
    """Does this raw log line mean startup moved on?"""
    return _ANY.search(clean(line)) is not None


def advance(progress: Startup, line: str, now: float) -> Startup:
    """Fold one raw log line into `progress`; the same object when the line changes nothing."""
    text = clean(line)
    if not text or _ANY.search(text) is None:
        return progress
    changes: dict[str, Any] = {"last_progress_at": now}
    phase = progress.phase
    for rule in _RULES:
        m = rule.pattern.search(text)
        if m is None:
            continue
        reached = rule.reached(m)
        if reached is not None and reached.order > phase.order:
            phase = reached
        if rule.facts is not None:
            changes.update(rule.facts(m))
        if rule.distributed:
            changes["distributed_ready"] = True
    changes["phase"] = phase
    if all(getattr(progress, name) == value for name, value in changes.items()):
        return progress
    return replace(progress, **changes)
