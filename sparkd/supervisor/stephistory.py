"""How long one identity's engine steps take (issue 38): the step probe's yardstick for "far longer than usual". Pure.

An identity is one launch as vLLM runs it: image, model and argv (the shell makes the key). Its history keeps the
longest step seen per size — the log2 bucket of the step's scheduled tokens, so a decode step (a few tokens) is not
measured against a 32K-token prefill chunk when steps of its own size were seen — learned from the probe's records
(each process keeps its longest step and its last one). It is a small JSON value the shell persists per identity;
:func:`learn` is its update.

A step's limit (:func:`limit_s`) is ``margin`` times the longest step of its size or smaller that the identity has
seen, at least ``floor_s`` and at most ``cap_s`` (vLLM's own execute timeout: past it vLLM fails the step itself).
A size not seen is bounded by the next bigger size seen (the last, shorter chunk of a prefill after full ones); a
step bigger than any seen is measured against the biggest seen, scaled by the ratio of tokens (a 16K-token chunk
after 8-token decode steps gets 2048 times their longest); with nothing seen, or a size unknown, the limit is the
cap. The margin is wide on purpose: a chunk of a 1M-token prefill takes about 3.6
times as long at the end of the context as at its start (attention over what came before: a + b·x per token,
tests/bench/wedge_worlds.py), and that growth must never read as a wedge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

__all__ = ["StepHistory", "StepLimits", "bucket", "completed_steps", "learn", "limit_s"]

MAX_BUCKET = 40


@dataclass(frozen=True)
class StepLimits:
    floor_s: float = 5.0  # no step is called stuck sooner
    margin: float = 8.0  # how many times the longest step of its size a step may take
    cap_s: float = 300.0  # vLLM's execute timeout: no limit beyond it
    schedule_s: float = 5.0  # an engine holding requests that begins no step for this long has stopped scheduling


@dataclass(frozen=True)
class StepHistory:
    """The longest step seen per size bucket (seconds), and how many step records taught it."""

    longest: Mapping[int, float] = field(default_factory=dict)  # bucket → seconds
    learned: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"longest": {str(b): round(s, 6) for b, s in sorted(self.longest.items())}, "learned": self.learned}

    @classmethod
    def from_json(cls, data: Any) -> StepHistory:
        """The value :meth:`to_json` wrote; anything else (a bad or foreign file) is an empty history."""
        if not isinstance(data, Mapping) or not isinstance(data.get("longest"), Mapping):
            return cls()
        longest: dict[int, float] = {}
        for key, value in data["longest"].items():
            if str(key).isdigit() and int(key) <= MAX_BUCKET and isinstance(value, int | float) and value >= 0:
                longest[int(key)] = float(value)
        learned = data.get("learned")
        return cls(longest, learned if isinstance(learned, int) and learned >= 0 else 0)


def bucket(tokens: int) -> int | None:
    """The size bucket of a step of ``tokens`` scheduled tokens: its bit length (1 token: 1, 2-3: 2, 4-7: 3, ...);
    None when the count is unknown (an engine's record)."""
    if tokens < 0:
        return None
    return min(int(tokens).bit_length(), MAX_BUCKET)


def learn(history: StepHistory, steps: Iterable[tuple[float, int]], limits: StepLimits) -> StepHistory:
    """``history`` having seen the completed steps ``(seconds, tokens)``. A step of unknown size teaches nothing, nor
    does one that outlasted its limit: a rank stopped for a while and let go again is no yardstick (each process
    reports its longest step as long as it lives)."""
    longest = dict(history.longest)
    taught = 0
    for seconds, tokens in steps:
        b = bucket(tokens)
        if b is None or seconds <= 0 or seconds > limit_s(history, tokens, limits):
            continue
        taught += 1
        if seconds > longest.get(b, 0.0):
            longest[b] = seconds
    if not taught:
        return history
    return replace(history, longest=longest, learned=history.learned + taught)


def completed_steps(records: Iterable[StepRecord]) -> list[tuple[float, int]]:
    """What a reading teaches: each worker's last completed step and its longest, as ``(seconds, tokens)``."""
    return [(ns / 1e9, tokens) for r in records if r.role == "worker"
            for ns, tokens in ((r.last_ns, r.last_tokens), (r.longest_ns, r.longest_tokens)) if ns > 0]


def expected_s(history: StepHistory, tokens: int) -> float | None:
    """The longest a step of ``tokens`` should take by what the identity has seen (before the margin); None: no
    yardstick (unknown size, or nothing seen). Steps of its own size seen: the longest of those and of smaller ones.
    Else the next bigger size seen bounds it (a step takes no longer than a bigger one); bigger than anything seen,
    the biggest seen scaled by the ratio of sizes."""
    b = bucket(tokens)
    seen = history.longest
    if b is None or not seen:
        return None
    bigger = [k for k in seen if k > b]
    if b in seen or bigger:
        bound = b if b in seen else min(bigger)
        return max(s for k, s in seen.items() if k <= bound)
    top = max(seen)
    return max(max(seen.values()), seen[top] * 2.0 ** (b - top))


def limit_s(history: StepHistory, tokens: int, limits: StepLimits) -> float:
    """How long a step of ``tokens`` may run before the probe's rules call it stuck (see the module's doc)."""
    seen = expected_s(history, tokens)
    if seen is None:
        return max(limits.floor_s, limits.cap_s)
    return min(max(limits.floor_s, limits.margin * seen), max(limits.cap_s, limits.floor_s))
