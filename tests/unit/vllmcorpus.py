"""The real vLLM log corpus (tests/data/vllm-logs/ and its held-out part, formats in their READMEs): loading an excerpt
and classifying it as its header says it ended. Shared by test_vllm_corpus.py and test_corpus_accuracy.py."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from sparkd.cli.explain import parse_signal
from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS = DATA / "vllm-logs"  # the development part: the classifier is built against it
HELDOUT = DATA / "vllm-logs-heldout"  # the held-out part: measured, never tuned on
SPLIT = HELDOUT / "SPLIT.csv"  # every excerpt added under issue 39, in both parts
MISSES = DATA / "heldout-misses.md"  # the held-out misses, and each round as it was measured blind
NOT_IN_LOGS = {FailureClass.killed_by_guard, FailureClass.host_unavailable,  # sparkd's own, not vLLM's
               FailureClass.reboot_needed,
               # the acceptance gate's: what vLLM answers, not what it logs
               FailureClass.answers_changed, FailureClass.answers_garbled, FailureClass.capacity_lost}
REQUIRED = ("source", "vllm", "class", "cause", "next")
KNOWN = (*REQUIRED, "exit", "signal", "phase", "note")
_ROUND = re.compile(r"^### Round (?P<n>\d+) \(commit (?P<commit>\w+)\): (?P<right>\d+) of (?P<total>\d+) right", re.M)
_MOVED = re.compile(r"^- `(?P<name>[^`]+)` \(labelled(?:\s+\w+,\s+classified\s+(?P<classified>\w+)\))?", re.M)
_VERSION = re.compile(r"^0\.(?P<minor>\d+)(?:\.\d+)*(?:rc\d+)?(?:\.dev\d+)?(?:\.post\d+)?\b")


@dataclass(frozen=True)
class Excerpt:
    name: str
    header: dict[str, str]
    lines: tuple[str, ...]

    @property
    def cls(self) -> FailureClass:
        return FailureClass(self.header["class"])

    @property
    def exit_code(self) -> int | None:
        if "signal" in self.header:
            return None
        return int(self.header.get("exit", "1"))

    @property
    def signal(self) -> int | None:
        return parse_signal(self.header["signal"]) if "signal" in self.header else None

    @property
    def minor(self) -> int:
        m = _VERSION.match(self.header["vllm"])
        assert m is not None, f"{self.name}: vllm: {self.header['vllm']!r} does not start with 0.N"
        return int(m.group("minor"))

    def classify(self) -> Failure:
        return classify(self.exit_code, self.signal, self.lines)


def load(path: Path) -> Excerpt:
    text = path.read_text(encoding="utf-8")
    head, sep, body = text.partition("\n---\n")
    assert sep, f"{path.name}: no '---' line between the header and the excerpt"
    header: dict[str, str] = {}
    for line in head.splitlines():
        m = re.fullmatch(r"# (?P<key>[a-z]+): (?P<value>.+)", line)
        assert m is not None, f"{path.name}: header line {line!r} is not '# key: value'"
        assert m.group("key") in KNOWN, f"{path.name}: unknown header key {m.group('key')!r}"
        header[m.group("key")] = m.group("value").strip()
    missing = [key for key in REQUIRED if key not in header]
    assert not missing, f"{path.name}: missing header keys {missing}"
    lines = tuple(body.rstrip("\n").split("\n"))
    assert any(line.strip() for line in lines), f"{path.name}: the excerpt is empty"
    return Excerpt(path.stem, header, lines)


def load_all(folder: Path) -> list[Excerpt]:
    return [load(path) for path in sorted(folder.glob("*.log"))]


def added_under_issue_39() -> set[str]:
    """The excerpts the manifest lists (both parts); the development part's others are the corpus before issue 39."""
    return {row["excerpt"] for row in split_rows()}


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def split_rows(path: Path = SPLIT) -> list[dict[str, str]]:
    return csv_rows(path)


def recorded_rounds(text: str) -> dict[int, tuple[re.Match[str], tuple[str, ...]]]:
    """The rounds heldout-misses.md records: each heading, and the excerpts its section lists as moved."""
    heads = list(_ROUND.finditer(text))
    found = {}
    for i, head in enumerate(heads):
        section = text[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        found[int(head.group("n"))] = (head, tuple(m.group("name") for m in _MOVED.finditer(section)))
    return found


def moved_as(text: str) -> dict[str, str]:
    """The excerpts heldout-misses.md lists as moved to development, each with the class its round gave it."""
    return {m.group("name"): m.group("classified") for m in _MOVED.finditer(text) if m.group("classified")}
