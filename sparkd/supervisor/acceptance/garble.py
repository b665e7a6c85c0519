"""Garble: what is wrong with one answer, whatever the golden says. Pure.

The checks, each a :class:`Kind` (the field's gates, field report 004: "direct prompts clean, no Chinese drift or
repeated junk"; the fixtures in tests/data/garble/ are real garbled outputs from public reports):

- ``empty``: nothing but white space (and no reasoning either).
- ``cut_short``: it ended for another reason than a stop or the length bound (abort, error), or it stopped with
  fewer tokens than the prompt's ``min_tokens``.
- ``loop``: a stretch repeats back to back — one visible character at least 12 times, or a longer unit two and a
  half times (the last copy cut by the length bound; a unit of 20 characters or more: two copies and a third begun)
  over at least 10 characters that make half the answer or 64 characters; markdown rules, tables and ellipses
  (``-=_*#~.|:``) are layout, not loops.
- ``broken_characters``: U+FFFD, control characters, or text decoded twice (UTF-8 read as Latin-1: ``Ã©``, ``Ð°``).
- ``foreign_script``: at least 2 letters of a writing system neither the prompt nor its ``scripts`` use (Latin is
  always allowed: code and names; Han, kana and Hangul go together).
- ``special_tokens``: a chat template's control token in the text (``<|im_end|>``, ``<｜end▁of▁sentence｜>``).

At each concurrency level of the gate every answer is checked; ``bad_outputs`` counts those with any finding.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Finding", "Kind", "LevelResult", "check", "find_loop", "level_result", "scripts_of"]


class Kind(StrEnum):
    empty = "empty"
    cut_short = "cut_short"
    loop = "loop"
    broken_characters = "broken_characters"
    foreign_script = "foreign_script"
    special_tokens = "special_tokens"


@dataclass(frozen=True)
class Finding:
    kind: Kind
    detail: str  # what was found, quoted


MIN_SINGLE = 12  # one visible character repeated this often is a loop
RULE_CHARS = frozenset("-=_*#~.|:")  # markdown rules, tables and ellipses: a long run of them is layout
MIN_REPEATS = 2.5  # copies of a unit, the last one may be partial (an answer cut by max_tokens mid-copy)
MIN_REPEATS_LONG = 2.2  # of a unit of 20 characters or more: two verbatim copies of a sentence and a third begun
LONG_UNIT = 20
MIN_LOOP_CHARS = 10
LONG_LOOP_CHARS = 64
MAX_UNIT = 200
MIN_FOREIGN = 2
_CJK = frozenset({"han", "hiragana", "katakana", "hangul"})
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_.:\-]{1,40}\|>|<｜[^｜<>\n]{1,40}｜>")
# A lead byte of a 2-byte UTF-8 sequence read as Latin-1 or cp1252, then a continuation byte read the same way.
_MOJIBAKE = re.compile("[\u00c2-\u00f4][\u0080-\u00bf\u2018-\u203a\u20ac\u0152\u0153\u0160\u0161\u0178"
                       "\u017d\u017e\u0192\u02c6\u02dc\u2122]")
_PREFIXES = {"CJK": "han", "LATIN": "latin", "FULLWIDTH LATIN": "latin"}


def check(text: str, *, prompt: str, finish_reason: str | None, tokens: int | None = None, min_tokens: int = 1,
          scripts: Iterable[str] = ()) -> tuple[Finding, ...]:
    """Every finding on one answer (empty: a clean answer)."""
    if not text.strip():
        return (Finding(Kind.empty, f"no text (finish reason {finish_reason})"),)
    found = [f for f in (_cut_short(finish_reason, tokens, min_tokens), find_loop(text), _broken(text),
                         _foreign(text, prompt, scripts), _special(text)) if f is not None]
    return tuple(found)


def _cut_short(finish_reason: str | None, tokens: int | None, min_tokens: int) -> Finding | None:
    if finish_reason not in ("stop", "length"):
        return Finding(Kind.cut_short, f"it ended with finish reason {finish_reason}")
    if finish_reason == "stop" and tokens is not None and tokens < min_tokens:
        return Finding(Kind.cut_short, f"it stopped after {tokens} tokens (the prompt needs at least {min_tokens})")
    return None


def find_loop(text: str) -> Finding | None:
    """The longest back-to-back repetition that counts as a loop, or None."""
    best: tuple[int, int, int] | None = None  # (covered chars, start, unit)
    for unit in range(1, min(MAX_UNIT, len(text) // 2) + 1):
        run = 0
        for i in range(len(text) - unit + 1):
            if i + unit < len(text) and text[i] == text[i + unit]:
                run += 1
                continue
            covered, start = run + unit, i - run
            if run and _is_loop(text, start, unit, covered) and (best is None or covered > best[0]):
                best = (covered, start, unit)
            run = 0
    if best is None:
        return None
    covered, start, unit = best
    piece = text[start:start + unit]
    copies = f"{covered / unit:.1f}".removesuffix(".0")
    return Finding(Kind.loop, f"{piece!r} repeated {copies} times ({covered} of {len(text)} characters)")


def _is_loop(text: str, start: int, unit: int, covered: int) -> bool:
    piece = text[start:start + unit]
    if not piece.strip() or set(piece.strip()) <= RULE_CHARS:
        return False
    if unit == 1:
        return covered >= MIN_SINGLE
    copies = MIN_REPEATS_LONG if unit >= LONG_UNIT else MIN_REPEATS
    return (covered / unit >= copies and covered >= MIN_LOOP_CHARS
            and (covered >= LONG_LOOP_CHARS or 2 * covered >= len(text)))


def _broken(text: str) -> Finding | None:
    if "\ufffd" in text:
        return Finding(Kind.broken_characters, f"{text.count(chr(0xFFFD))} replacement characters (U+FFFD)")
    controls = [c for c in text if unicodedata.category(c) == "Cc" and c not in "\n\r\t"]
    if controls:
        return Finding(Kind.broken_characters, f"{len(controls)} control characters ({controls[0]!r})")
    twice = _MOJIBAKE.findall(text)
    if len(twice) >= 3:
        return Finding(Kind.broken_characters, f"text decoded twice (UTF-8 read as Latin-1): {' '.join(twice[:4])}")
    return None


def script_of(char: str) -> str | None:
    """The writing system of a letter (``latin``, ``han``, ``cyrillic``, ``hiragana``, ...); None for a non-letter."""
    if not unicodedata.category(char).startswith("L"):
        return None
    name = unicodedata.name(char, "")
    for prefix, script in _PREFIXES.items():
        if name.startswith(prefix):
            return script
    return name.split(" ", 1)[0].lower() or None


def scripts_of(text: str) -> dict[str, int]:
    """Letters per writing system."""
    out: dict[str, int] = {}
    for char in text:
        script = script_of(char)
        if script is not None:
            out[script] = out.get(script, 0) + 1
    return out


def _foreign(text: str, prompt: str, scripts: Iterable[str]) -> Finding | None:
    allowed = {"latin", *scripts_of(prompt), *(s.lower() for s in scripts)}
    if allowed & _CJK:
        allowed |= _CJK
    foreign = {s: n for s, n in scripts_of(text).items() if s not in allowed and n >= MIN_FOREIGN}
    if not foreign:
        return None
    sample = "".join(c for c in text if script_of(c) in foreign)[:12]
    said = ", ".join(f"{n} {s}" for s, n in sorted(foreign.items(), key=lambda kv: -kv[1]))
    return Finding(Kind.foreign_script, f"letters the prompt did not ask for: {said} ({sample!r})")


def _special(text: str) -> Finding | None:
    found = _SPECIAL.findall(text)
    return Finding(Kind.special_tokens, f"{', '.join(sorted(set(found))[:3])} in the text") if found else None


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level of the gate: how many answers came back and which were bad (by answer key)."""

    level: int
    answers: int
    bad: tuple[tuple[str, tuple[Finding, ...]], ...] = ()
    errors: tuple[str, ...] = ()  # requests that got no answer (a sentence each)

    @property
    def bad_outputs(self) -> int:
        return len(self.bad) + len(self.errors)

    def first(self) -> str:
        """The first bad output, said: its answer, the kind and what was found (or the request that failed)."""
        if self.bad:
            key, findings = self.bad[0]
            return f"{key.split('#')[0]} at concurrency {self.level}: {findings[0].kind} — {findings[0].detail}"
        return self.errors[0] if self.errors else "none"


def level_result(level: int, checked: Sequence[tuple[str, tuple[Finding, ...]]],
                 errors: Sequence[str] = ()) -> LevelResult:
    return LevelResult(level, len(checked), tuple((k, f) for k, f in checked if f), tuple(errors))
