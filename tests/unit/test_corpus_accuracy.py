"""How the classifier generalises (issue 39): measured on the held-out part of the real-log corpus
(tests/data/vllm-logs-heldout/, never tuned on) beside the development part (tests/data/vllm-logs/, which
test_vllm_corpus.py holds at 100 %). The suite prints one line with both figures (tests/conftest.py gathers it), and
every held-out miss must be listed with its reason in tests/data/heldout-misses.md: no miss is dropped in silence, and
a miss that is fixed leaves the list."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from vllmcorpus import CORPUS, DATA, HELDOUT, Excerpt, added_under_issue_39, load_all

from sparkd.cli.explain import explain
from sparkd.supervisor.failures import Failure, FailureClass

MISSES = DATA / "heldout-misses.md"
LINE_PREFIX = "classifier: "  # tests/conftest.py prints the lines that start so at the end of the run
_ROUND = re.compile(r"^### Round (?P<n>\d+) \(commit (?P<commit>\w+)\): (?P<right>\d+) of (?P<total>\d+) right", re.M)
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


def _outcomes(excerpts: list[Excerpt]) -> list[Outcome]:
    return [Outcome(e, e.classify()) for e in excerpts]


def _share(outcomes: list[Outcome]) -> str:
    right = sum(o.right for o in outcomes)
    return f"{right}/{len(outcomes)} ({100 * right / len(outcomes):.1f} %)" if outcomes else "0/0"


def _blind() -> str:
    """The rounds of heldout-misses.md: each measured excerpts the classifier had not met, as it stood then (the
    misses a rule was then written for moved to development, so "now" alone would flatter it)."""
    rounds = sorted(_ROUND.finditer(MISSES.read_text(encoding="utf-8")), key=lambda m: int(m.group("n")))
    if not rounds:
        return "not measured blind yet"
    right, total = sum(int(m.group("right")) for m in rounds), sum(int(m.group("total")) for m in rounds)
    last = rounds[-1]
    return (f"measured blind {right}/{total} ({100 * right / total:.1f} %) over {len(rounds)} round(s) (the last, at "
            f"{last.group('commit')}: {last.group('right')}/{last.group('total')})")


def listed_misses() -> dict[str, tuple[str, str, str]]:
    """The rows of heldout-misses.md: excerpt → (labelled, classified, why)."""
    rows = {}
    for line in MISSES.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m is not None:
            rows[m.group("name")] = (m.group("labelled"), m.group("classified"), m.group("why").strip())
    return rows


def test_held_out_accuracy() -> None:
    """The one line `make test` prints — the blind rounds, the held-out part as it is now, the development part — and
    the misses file kept true: every held-out miss is listed with the class it was labelled, the class it got and why;
    nothing else is listed. The target (95 % on logs the classifier has not met) is read from the blind rounds, so it
    is reported, not asserted: a miss fixed after it was measured leaves the held-out part."""
    dev, held = _outcomes(load_all(CORPUS)), _outcomes(load_all(HELDOUT))
    added = added_under_issue_39()
    before = [o for o in dev if o.excerpt.name not in added]
    quoted = sum(o.quotes_the_cause for o in held)
    print(f"{LINE_PREFIX}held-out {_blind()}; {_share(held)} of those held out now, the cause quoted in {quoted}; "
          f"development {_share(dev)}, the {len(before)} excerpts before issue 39 {_share(before)}")
    misses = {o.excerpt.name: (o.excerpt.cls.value, o.failure.cls.value) for o in held if not o.right}
    listed = listed_misses()
    unlisted = sorted(set(misses) - set(listed))
    assert not unlisted, f"held-out misses not in {MISSES.name}: " + "; ".join(
        f"{name} (labelled {misses[name][0]}, classified {misses[name][1]})" for name in unlisted)
    fixed = sorted(set(listed) - set(misses))
    assert not fixed, f"{MISSES.name} lists excerpts that are no longer misses: {fixed}"
    for name, (labelled, classified, why) in listed.items():
        assert (labelled, classified) == misses[name], f"{name}: listed as {labelled} → {classified}, is {misses[name]}"
        assert len(why) >= 20, f"{name}: the reason for the miss is missing"


HELD = load_all(HELDOUT)


@pytest.mark.parametrize("excerpt", HELD, ids=[e.name for e in HELD])
def test_explain_names_what_happened_on_held_out_logs(excerpt: Excerpt) -> None:
    """`sparkd explain` on a log it was never tuned on still gives a class and a sentence that says what happened:
    where the log has a Python exception and the class is unknown, the sentence names it."""
    failure = explain(list(excerpt.lines), excerpt.exit_code, excerpt.signal)
    what, _, do = failure.sentence.partition("; ")
    assert failure.cls in FailureClass and what and do, failure.sentence
    if failure.cls is FailureClass.unknown and failure.evidence is not None:
        assert failure.evidence[:40] in failure.sentence, failure.sentence
