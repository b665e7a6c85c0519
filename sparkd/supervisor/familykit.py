"""The pieces the failure families (`families.py`) are made of: a sign, a family, the reading of one event. Pure.

A :class:`Sign` holds for an event when every part it names holds:

- ``terms``: concepts of the failure vocabulary (`lexicon.py`) that must all be in the event — the co-occurrence that
  says what the failure is in any wording (memory + could not be had; an architecture + not supported) — and
  ``unless_terms`` none of which may be;
- ``types``: the exception's type, without its module (fullmatch), a pattern over the type names (``\\w*OutOfMemory``);
- ``raised_in``: the subsystem the exception was raised in (the frames'), ``not_raised_in`` one it was not raised in,
  ``imported``: raised while importing;
- ``message``: searched in the exception's message (with ``types``) or the event's `subject`; its named groups feed a
  sign's own sentence (``what``), ``unless`` must not be found;
- ``kinds``: the kinds of line it applies to; ``any_level``: it reads a line logged below ERROR too (only a few
  lines state a failure at INFO: a negative KV-cache budget), when its line holds one of its ``needles`` (a cheap
  test: every INFO line of a long tail is offered to these signs).

Each sign says why it means its family (``reason``), and may say more than the family does: ``what`` builds the "what
happened" from the match and the `ClassifyContext` (the port, the sizes, the module), ``do`` what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkd.supervisor.events import Event, Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.rulekit import Tier, What
from sparkd.supervisor.sentences import quote
from sparkd.supervisor.subsystems import Subsystem

if TYPE_CHECKING:
    from sparkd.supervisor.context import ClassifyContext

__all__ = ["Family", "FamilyHit", "Sign", "sign"]


@dataclass(frozen=True)
class Sign:
    reason: str  # why this sign means the family
    terms: frozenset[str] = frozenset()  # vocabulary concepts that must all occur in the event
    types: re.Pattern[str] | None = None  # the exception's type, without its module (fullmatch)
    message: re.Pattern[str] | None = None  # searched in the exception's message (with `types`) or the subject
    raised_in: frozenset[Subsystem] | None = None  # the subsystem the exception was raised in
    not_raised_in: frozenset[Subsystem] = frozenset()  # nor raised in these
    imported: bool = False  # raised while a module was being imported
    kinds: frozenset[Kind] | None = None  # the kinds of line it applies to (None: any)
    tier: Tier = Tier.CAUSE
    unless: re.Pattern[str] | None = None  # the message or subject must not hold this
    unless_terms: frozenset[str] = frozenset()  # nor any of these concepts
    any_level: bool = False  # reads a line logged below ERROR too
    needles: tuple[str, ...] = ()  # with any_level: lower-case words one of which such a line must hold (cheap)
    what: What | None = None  # its own "what happened", from the match's groups and the context
    do: str | None = None  # its own "what to do"

    def reads(self, event: Event) -> re.Match[str] | bool:
        """The match of `message` (True where the sign has none) when the sign holds for the event, else False."""
        exc = event.exception
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if (self.terms and not self.terms <= event.terms) or (self.unless_terms and self.unless_terms & event.terms):
            return False
        if self.types is not None and (exc is None or not self.types.fullmatch(exc.name)):
            return False
        if self.raised_in is not None and (exc is None or exc.subsystem not in self.raised_in):
            return False
        if self.not_raised_in and exc is not None and exc.subsystem in self.not_raised_in:
            return False
        if self.imported and (exc is None or exc.imported is None):
            return False
        subject = exc.message if exc is not None and self.types is not None else event.subject
        found: re.Match[str] | bool = True
        if self.message is not None:
            m = self.message.search(subject)
            if m is None:
                return False
            found = m
        if self.unless is not None and self.unless.search(subject) is not None:
            return False
        return found


def sign(reason: str, types: str | None = None, message: str | None = None, *, terms: str = "",
         raised_in: set[Subsystem] | None = None, not_raised_in: set[Subsystem] | None = None,
         imported: bool = False, kinds: set[Kind] | None = None,
         tier: Tier = Tier.CAUSE, flags: int = 0, unless: str | None = None, unless_terms: str = "",
         any_level: bool = False, needles: tuple[str, ...] = (), what: What | None = None, do: str | None = None
         ) -> Sign:
    """A sign; `terms` and `unless_terms` are concept names separated by spaces."""
    return Sign(reason, frozenset(terms.split()), re.compile(types) if types else None,
                re.compile(message, flags) if message else None, frozenset(raised_in) if raised_in else None,
                frozenset(not_raised_in or ()), imported, frozenset(kinds) if kinds else None, tier,
                re.compile(unless, flags) if unless else None, frozenset(unless_terms.split()), any_level, needles,
                what, do)


@dataclass(frozen=True)
class Family:
    cls: FailureClass
    what: str  # what happened, before the quoted evidence
    signs: tuple[Sign, ...]


@dataclass(frozen=True)
class FamilyHit:
    cls: FailureClass
    tier: Tier
    what: str  # the "what happened" clause
    sign: Sign
    by_kind: bool = False  # decided by `BY_KIND`, only where nothing else speaks
    quoted: str | None = None  # the line it read, quoted, when `what` does not carry it
    do: str | None = None


def what_of(family: Family, s: Sign, event: Event, found: re.Match[str] | bool, ctx: ClassifyContext
            ) -> tuple[str, str | None]:
    """The "what happened" clause of a hit, and the line quoted beside it when the clause does not carry it: a sign's
    own words with the line quoted after them, or the family's words with the quoted error and where it was raised."""
    exc = event.exception
    if s.what is not None and isinstance(found, re.Match):
        what = s.what(found, ctx)
        return what, _quoted_beside(what, event, found)
    if exc is not None and exc.imported is not None and s.imported:
        return f"{family.what}: importing {exc.imported} failed with {quote(exc.told)}", None
    where = f" (raised in {exc.where})" if exc is not None and exc.where is not None else ""
    return f"{family.what}: {quote(_from_the_sign(s, event, found))}{where}", None


def _quoted_beside(what: str, event: Event, found: re.Match[str]) -> str | None:
    """The line a sign read, quoted, when its own words do not already carry it: the operator sees the cause as vLLM
    (or torch, NCCL, the kernel) put it."""
    exc = event.exception
    stated = event.said
    head = (exc.message if exc is not None and exc.message else stated)[:40].strip()
    if not head or head in what:
        return None
    return quote(_from_where_it_holds(stated, found))


_QUOTE_FROM = 100  # a sign that holds further into a long line is quoted from (near) where it holds
_SENTENCE, _CLAUSE = re.compile(r"[.?!;] "), re.compile(r": |, ")


def _from_the_sign(s: Sign, event: Event, found: re.Match[str] | bool) -> str:
    said = event.said
    if not isinstance(found, re.Match):
        return said
    return _from_where_it_holds(said, found)


def _from_where_it_holds(said: str, found: re.Match[str]) -> str:
    """`said`, or — where the sign holds far into a long line — from the sentence or clause it holds in (its `said`
    group, else the last break of a sentence before the match, else of a clause), after an ellipsis. The match may be
    in a longer text than `said` (the exception's message with its continuation): there the words matched say
    where."""
    if "said" in found.groupdict() and found.group("said") is not None:
        start = found.start("said")
    else:
        start = found.start()
        if found.string is not said:
            start = said.find(found.group(0)[:40]) if found.group(0) else -1
    if start < _QUOTE_FROM or start >= len(said) or len(said) <= 200:
        return said
    for brk in (_SENTENCE, _CLAUSE):
        breaks = [m.end() for m in brk.finditer(said, max(0, start - 80), start)]
        if breaks:
            return "…" + said[breaks[-1]:]
    return "…" + said[start:]

