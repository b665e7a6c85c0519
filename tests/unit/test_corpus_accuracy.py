"""How the classifier generalises (issue 39): measured on the held-out part of the real-log corpus
(tests/data/vllm-logs-heldout/, never tuned on) beside the development part (tests/data/vllm-logs/, which
test_vllm_corpus.py holds at 100 %). The suite prints one line with the figures (tests/conftest.py gathers it), and
every held-out miss must be listed with its reason in tests/data/heldout-misses.md: no miss is dropped in silence, and
a miss that is fixed leaves the list.

The blind figure comes in rounds: each gathering of new excerpts carries its number in SPLIT.csv's `round` column. A
round heldout-misses.md records (`### Round N (commit C): R of T right`) is reported as recorded then; a round it does
not record yet is measured now, on its held-out excerpts, with the classifier that has never met them — reported as
such in the line, and failing `test_every_round_is_recorded` with the heading to add (heldout-misses.md, "Recording a
round", says how)."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllmcorpus import (
    CORPUS,
    HELDOUT,
    MISSES,
    SPLIT,
    Excerpt,
    added_under_issue_39,
    load_all,
    recorded_rounds,
    split_rows,
)

from sparkd.cli.explain import explain
from sparkd.supervisor.failures import Failure, FailureClass

LINE_PREFIX = "classifier: "  # tests/conftest.py prints the lines that start so at the end of the run
TARGET = 95.0  # percent right on logs the classifier has not met (issue 39): reported, not asserted
_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<labelled>\w+) \| (?P<classified>\w+) \| (?P<why>.*?) \|\s*$")


@dataclass(frozen=True)
class Outcome:
    excerpt: Excerpt
    failure: Failure

    @property
    def right(self) -> bool:
        return self.failure.cls is self.excerpt.cls

    @property
    def quotes_the_cause(self) -> bool:
        return self.excerpt.header["cause"] in self.failure.sentence


@dataclass(frozen=True)
class Round:
    """One gathering measured blind: as heldout-misses.md recorded it, or (not recorded yet) measured now."""

    n: int
    right: int
    total: int
    commit: str | None  # the commit it was recorded at; None: measured now, not recorded yet
    held: tuple[str, ...]  # its excerpts in the held-out part now
    moved: tuple[str, ...]  # its excerpts the record lists as moved to the development part after it

    @property
    def recorded(self) -> bool:
        return self.commit is not None

    def __str__(self) -> str:
        said = f"round {self.n} {self.right}/{self.total}"
        return said if self.recorded else f"{said} (not recorded yet: measured now, blind)"


def _outcomes(excerpts: list[Excerpt]) -> list[Outcome]:
    return [Outcome(e, e.classify()) for e in excerpts]


def _share(outcomes: list[Outcome]) -> str:
    right = sum(o.right for o in outcomes)
    return f"{right}/{len(outcomes)} ({100 * right / len(outcomes):.1f} %)" if outcomes else "0/0"


def held_out_by_round(rows: list[dict[str, str]]) -> dict[int, list[str]]:
    """The held-out excerpts of each round (SPLIT.csv's `round`); a held-out row without a round is an error."""
    by_round: dict[int, list[str]] = defaultdict(list)
    unnumbered = [r["excerpt"] for r in rows if r["part"] == "heldout" and not (r.get("round") or "").isdigit()]
    assert not unnumbered, f"held-out excerpts in {SPLIT.name} without a round number: {unnumbered}"
    for r in rows:
        if r["part"] == "heldout":
            by_round[int(r["round"])].append(r["excerpt"])
    return by_round


def rounds(held: list[Outcome], rows: list[dict[str, str]], text: str) -> list[Round]:
    """Every round, recorded or (from SPLIT.csv alone) measured now on its held-out excerpts."""
    by_round, recorded = held_out_by_round(rows), recorded_rounds(text)
    right_now = {o.excerpt.name: o.right for o in held}
    found = []
    for n in sorted(set(by_round) | set(recorded)):
        names = tuple(by_round.get(n, ()))
        if n in recorded:
            head, moved = recorded[n]
            found.append(Round(n, int(head.group("right")), int(head.group("total")), head.group("commit"), names,
                               moved))
        else:
            found.append(Round(n, sum(right_now.get(name, False) for name in names), len(names), None, names, ()))
    return found


def _blind(found: list[Round]) -> str:
    """The rounds together, each as measured blind, and the target read against them."""
    if not found:
        return "not measured blind yet"
    right, total = sum(r.right for r in found), sum(r.total for r in found)
    share = 100 * right / total if total else 0.0
    met = "met" if share >= TARGET else "not met"
    return (f"measured blind {right}/{total} ({share:.1f} %; target {TARGET:.0f} % {met}) over {len(found)} round(s): "
            + ", ".join(str(r) for r in found))


def listed_misses() -> dict[str, tuple[str, str, str]]:
    """The rows of heldout-misses.md: excerpt → (labelled, classified, why)."""
    rows = {}
    for line in MISSES.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m is not None:
            rows[m.group("name")] = (m.group("labelled"), m.group("classified"), m.group("why").strip())
    return rows


def _head() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=False, cwd=Path(__file__).parent)
    except OSError:
        return "<commit>"
    return done.stdout.strip() or "<commit>"


DEV, HELD = _outcomes(load_all(CORPUS)), _outcomes(load_all(HELDOUT))


def test_held_out_accuracy() -> None:
    """The one line `make test` prints — the blind rounds, the held-out part as it is now, the development part — and
    the misses file kept true: every held-out miss is listed with the class it was labelled, the class it got and why;
    nothing else is listed. The target (95 % on logs the classifier has not met) is read from the blind rounds, so it
    is reported, not asserted: a miss fixed after it was measured leaves the held-out part."""
    added = added_under_issue_39()
    before = [o for o in DEV if o.excerpt.name not in added]
    quoted = sum(o.quotes_the_cause for o in HELD)
    found = rounds(HELD, split_rows(), MISSES.read_text(encoding="utf-8"))
    moved = sum(len(r.moved) for r in found)
    print(f"{LINE_PREFIX}held-out {_blind(found)}; {_share(HELD)} of those held out now (not a blind figure: the "
          f"{moved} misses a change was made for moved to development), the cause quoted in {quoted}; "
          f"development {_share(DEV)}, the {len(before)} excerpts before issue 39 {_share(before)}")
    misses = {o.excerpt.name: (o.excerpt.cls.value, o.failure.cls.value) for o in HELD if not o.right}
    listed = listed_misses()
    unlisted = sorted(set(misses) - set(listed))
    assert not unlisted, f"held-out misses not in {MISSES.name} (add a row each to its table, with why):\n" + "\n".join(
        f"| `{name}` | {misses[name][0]} | {misses[name][1]} | <why it missed> |" for name in unlisted)
    fixed = sorted(set(listed) - set(misses))
    assert not fixed, f"{MISSES.name} lists excerpts that are no longer misses: {fixed}"
    for name, (labelled, classified, why) in listed.items():
        assert (labelled, classified) == misses[name], f"{name}: listed as {labelled} → {classified}, is {misses[name]}"
        assert len(why) >= 20, f"{name}: the reason for the miss is missing"


def test_every_round_is_recorded() -> None:
    """Each round of SPLIT.csv is recorded in heldout-misses.md with what it measured, and a recorded round adds up:
    its excerpts still held out and those its section lists as moved to development make its total, and every one
    it lists as moved is in the development part now, of that round."""
    rows = split_rows()
    found = rounds(HELD, rows, MISSES.read_text(encoding="utf-8"))
    unrecorded = [r for r in found if not r.recorded]
    assert not unrecorded, "\n".join(
        f"round {r.n} of {SPLIT.name} is not recorded in {MISSES.name}: add under '## Measurements', above the "
        f"earlier rounds, the heading\n### Round {r.n} (commit {_head()}): {r.right} of {r.total} right "
        f"({100 * r.right / r.total if r.total else 0:.1f} %)\nwith a paragraph on what it measured, and a row in "
        "the table of misses for each miss (test_held_out_accuracy names them)" for r in unrecorded)
    part = {row["excerpt"]: (row["part"], row.get("round")) for row in rows}
    for r in found:
        assert len(r.held) + len(r.moved) == r.total, (
            f"round {r.n}: {len(r.held)} held out now + {len(r.moved)} listed as moved ≠ {r.total} measured")
        astray = [name for name in r.moved if part.get(name) != ("dev", str(r.n))]
        assert not astray, f"round {r.n} lists as moved to development excerpts that are not (of that round): {astray}"


@pytest.mark.parametrize("excerpt", [o.excerpt for o in HELD], ids=[o.excerpt.name for o in HELD])
def test_explain_names_what_happened_on_held_out_logs(excerpt: Excerpt) -> None:
    """`sparkd explain` on a log it was never tuned on still gives a class and a sentence that says what happened:
    where the log has a Python exception and the class is unknown, the sentence names it."""
    failure = explain(list(excerpt.lines), excerpt.exit_code, excerpt.signal)
    what, _, do = failure.sentence.partition("; ")
    assert failure.cls in FailureClass and what and do, failure.sentence
    if failure.cls is FailureClass.unknown and failure.evidence is not None:
        message = failure.evidence.split("] ", 1)[-1]  # the line without vLLM's "ERROR 02-20 ... file.py:N]" prefix
        # compared with its whitespace collapsed, as a sentence quotes a line (a runtime's indented lines)
        assert " ".join(message.split())[:40] in " ".join(failure.sentence.split()), failure.sentence


# The machinery above on a made-up round 3: what the lead sees when a new gathering is merged, and after recording it.
_RECORD = """### Round 2 (commit b): 1 of 2 right (50.0 %)

- `m2` (labelled oom, classified unknown): moved

### Round 1 (commit a): 2 of 2 right (100.0 %)
"""
_ROWS = [{"excerpt": name, "part": part, "round": n} for name, part, n in (
    ("a1", "heldout", "1"), ("a2", "heldout", "1"), ("m2", "dev", "2"), ("b2", "heldout", "2"),
    ("c3", "heldout", "3"), ("d3", "heldout", "3"), ("e3", "dev", "3"))]


def _made_up(name: str, right: bool) -> Outcome:
    excerpt = Excerpt(name, {"class": "oom", "cause": "x"}, ("x",))
    return Outcome(excerpt, Failure(FailureClass.oom if right else FailureClass.unknown, "s.", 1, None, None))


def test_a_new_round_is_measured_blind_until_recorded() -> None:
    """A round SPLIT.csv has and heldout-misses.md does not is measured now on its held-out excerpts only (not its
    development part) and said to be unrecorded; once recorded, its recorded figure stands."""
    held = [_made_up("a1", True), _made_up("a2", True), _made_up("b2", True), _made_up("c3", True),
            _made_up("d3", False)]
    found = rounds(held, _ROWS, _RECORD)
    assert [(r.n, r.right, r.total, r.recorded) for r in found] == [(1, 2, 2, True), (2, 1, 2, True), (3, 1, 2, False)]
    line = _blind(found)
    assert "4/6 (66.7 %; target 95 % not met) over 3 round(s)" in line, line
    assert "round 3 1/2 (not recorded yet: measured now, blind)" in line, line
    recorded = rounds(held, _ROWS, "### Round 3 (commit c): 2 of 2 right (100.0 %)\n\n" + _RECORD)
    assert [(r.n, r.right, r.recorded) for r in recorded][-1] == (3, 2, True)
    with pytest.raises(AssertionError, match="without a round number"):
        held_out_by_round([{"excerpt": "z", "part": "heldout", "round": ""}])
