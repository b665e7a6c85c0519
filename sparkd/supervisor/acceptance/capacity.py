"""Capacity: the KV cache and the maximum concurrency vLLM logged at startup, against the band the config (or its
profile) expects and against the golden's. Pure.

Rules:

1. Unknown (no "KV cache size" line was read: an adopted instance, a log that said none): no verdict, said so.
2. Below the band's low end, or above its high end (a changed ``max_model_len`` or KV dtype), is a verdict; so is a
   KV cache more than ``tolerance`` smaller than the golden's (a leaked GiB, a lower ``gpu_memory_utilization``).
3. The sentence says how much was lost: tokens, the share, and the GiB they are (from vLLM's "Available KV cache
   memory" line, tokens per GiB) — "a leaked GiB" is read as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.supervisor.acceptance.answers import Capacity

__all__ = ["CapacityResult", "judge_capacity"]


@dataclass(frozen=True)
class CapacityResult:
    ok: bool | None  # None: not known
    sentence: str
    lost_tokens: int | None = None  # fewer than the golden's (or than the band's low end), when lost
    lost_share: float | None = None
    lost_gib: float | None = None


def judge_capacity(now: Capacity, *, band_tokens: Sequence[float] = (), band_concurrency: Sequence[float] = (),
                   golden: Capacity | None = None, tolerance: float = 0.03,
                   source: str = "the config") -> CapacityResult:
    """The capacity verdict; ``source`` names where the band comes from (``profile 1m-context``)."""
    tokens = now.kv_cache_tokens
    if tokens is None:
        return CapacityResult(None, "vLLM logged no KV cache size this start: capacity not checked.")
    said = f"vLLM's KV cache holds {tokens:,} tokens"
    if now.max_concurrency is not None:
        said += f" (maximum concurrency {now.max_concurrency:g}x for {now.max_concurrency_tokens or 0:,} tokens)"
    problems: list[str] = []
    lost: int | None = None
    reference = golden.kv_cache_tokens if golden is not None else None
    if reference and tokens < reference * (1 - tolerance):
        lost = reference - tokens
        problems.append(f"{lost:,} ({lost / reference:.1%}){_gib(lost, now)} fewer than the golden's {reference:,}")
    if band_tokens and not band_tokens[0] <= tokens <= band_tokens[1]:
        side = "below" if tokens < band_tokens[0] else "above"
        problems.append(f"{side} {source}'s band of {band_tokens[0]:,.0f}–{band_tokens[1]:,.0f} tokens")
        if side == "below" and lost is None:
            lost = int(band_tokens[0] - tokens)
    concurrency = now.max_concurrency
    if band_concurrency and concurrency is not None and not band_concurrency[0] <= concurrency <= band_concurrency[1]:
        problems.append(f"maximum concurrency {concurrency:g}x is outside {source}'s band "
                        f"{band_concurrency[0]:g}–{band_concurrency[1]:g}x")
    if not problems:
        within = [f"{source}'s band" for band in (band_tokens, band_concurrency) if band][:1]
        against = (["the golden's"] if reference else []) + within
        return CapacityResult(True, f"{said}: as expected{' (' + ', '.join(against) + ')' if against else ''}.")
    share = lost / (reference or (band_tokens[0] if band_tokens else tokens)) if lost else None
    return CapacityResult(False, f"{said}: {'; '.join(problems)}.", lost, share,
                          _gib_of(lost, now) if lost else None)


def _gib_of(tokens: int, now: Capacity) -> float | None:
    if not now.kv_cache_gib or not now.kv_cache_tokens:
        return None
    return tokens * now.kv_cache_gib / now.kv_cache_tokens


def _gib(tokens: int, now: Capacity) -> str:
    gib = _gib_of(tokens, now)
    return "" if gib is None else f", about {gib:.2f} GiB of KV cache,"
