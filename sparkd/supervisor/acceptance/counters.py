"""Speculative decoding and numerics, over two scrapes of vLLM's ``/metrics`` (before and after the gate's requests).
Pure: text in, verdicts out.

vLLM 0.32's names (``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``); counters carry ``_total``
on the page, one series per engine (``engine``, ``model_name`` labels), summed here:

- ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` for i in 0..num_speculative_tokens-1, only
  with a speculative config; ``vllm:spec_decode_num_drafts_total`` beside it.
- ``vllm:corrupted_requests_total``, only with ``VLLM_COMPUTE_NANS_IN_LOGITS=1``: requests with NaNs in their logits.

Rules:

1. Speculative decoding is active when drafts were proposed during the gate and every position's accepted counter
   moved (the field's gate: "MTP5 accepted-token positions 0..4 active"). No per-position family at all, while the
   launch has a speculative config, is inactive too: vLLM runs without it.
2. Numerics: ``vllm:corrupted_requests`` must not move. Its family missing where the variable is set is said, not
   failed (a vLLM that predates it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CORRUPTED", "DRAFTS", "PER_POSITION", "Counters", "PartVerdict", "judge_numerics", "judge_spec_decode",
           "read_counters"]

PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
CORRUPTED = "vllm:corrupted_requests_total"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'(?:^|,)\s*position="(?P<pos>\d{1,4})"')


@dataclass(frozen=True)
class Counters:
    """The gate's counters on one page; None: the family is not on it."""

    accepted_per_position: Mapping[int, float] | None = None
    drafts: float | None = None
    corrupted: float | None = None
    families: frozenset[str] = field(default_factory=frozenset)


def read_counters(text: str) -> Counters:
    """The counters of one ``/metrics`` page (summed over engines)."""
    per_pos: dict[int, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        name = m.group("name")
        if name == PER_POSITION:
            pos = _POSITION.search(m.group("labels") or "")
            if pos is not None:
                per_pos[int(pos.group("pos"))] = per_pos.get(int(pos.group("pos")), 0.0) + value
        elif name in (DRAFTS, CORRUPTED):
            sums[name] = sums.get(name, 0.0) + value
    return Counters(per_pos if per_pos else None, sums.get(DRAFTS), sums.get(CORRUPTED),
                    frozenset([*sums, *([PER_POSITION] if per_pos else [])]))


@dataclass(frozen=True)
class PartVerdict:
    ok: bool | None  # None: cannot be judged (said why)
    sentence: str
    facts: Mapping[str, object] = field(default_factory=dict)


def judge_spec_decode(before: Counters, after: Counters, *, positions: int | None = None) -> PartVerdict:
    """Did every draft position accept tokens between the scrapes? ``positions``: the config's
    ``num_speculative_tokens`` when known (a position the page lacks is inactive)."""
    if after.accepted_per_position is None:
        return PartVerdict(False, f"vLLM exports no {PER_POSITION}: speculative decoding is not running although "
                                  "the launch configures it.")
    drafts = (after.drafts or 0.0) - (before.drafts or 0.0)
    wanted = range(positions) if positions else sorted(after.accepted_per_position)
    was = before.accepted_per_position or {}
    moved = {p: after.accepted_per_position.get(p, 0.0) - was.get(p, 0.0) for p in wanted}
    facts = {"drafts": drafts, "accepted_per_position": moved}
    if drafts <= 0:
        return PartVerdict(False, "no draft was proposed during the gate: speculative decoding is inactive.", facts)
    still = [p for p, n in moved.items() if n <= 0]
    if still:
        return PartVerdict(False, f"{len(still)} of {len(moved)} draft positions accepted no token during the gate "
                                  f"(position {', '.join(map(str, still))}; {drafts:.0f} drafts): the speculative "
                                  "decoder stopped accepting.", facts)
    counts = ", ".join(f"{p}: {n:.0f}" for p, n in moved.items())
    return PartVerdict(True, f"every draft position accepted tokens during the gate ({counts}; {drafts:.0f} drafts).",
                       facts)


def judge_numerics(before: Counters, after: Counters) -> PartVerdict:
    if after.corrupted is None:
        return PartVerdict(None, f"vLLM exports no {CORRUPTED} although VLLM_COMPUTE_NANS_IN_LOGITS=1: numerics not "
                                 "checked.")
    moved = after.corrupted - (before.corrupted or 0.0)
    if moved > 0:
        return PartVerdict(False, f"{moved:.0f} requests had NaNs in their logits during the gate "
                                  f"({CORRUPTED} moved): the engine computes garbage.", {"corrupted": moved})
    return PartVerdict(True, "no request had NaNs in its logits during the gate.", {"corrupted": 0})
