"""A second reading of the corpus's blind excerpts (issue 39): a reader of the log alone labels every excerpt some round
measured blind, without its name, header, source, label or the classifier. It measures two things the blind rounds
cannot: how far the log alone supports the gatherers' labels (they read the thread too) — what any classifier of logs
can be held to — and how the classifier, as each round's commit had it, did on the excerpts whose label a reader of
the log alone was sure of and shared. tests/data/second-reading/README.md says how it was run.

    python tests/unit/secondreading.py packets --out DIR [-n N --readers R]  # the readers' packets, and the key
    python tests/unit/secondreading.py blind                                # each excerpt classified by its round
    python tests/unit/secondreading.py report                               # the figures
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vllmcorpus import CORPUS, DATA, HELDOUT, MISSES, Excerpt, csv_rows, load, moved_as, recorded_rounds, split_rows

ROOT = DATA.parents[1]
READING = ROOT / "tests" / "data" / "second-reading"
KEY = READING / "key.csv"  # packet id -> excerpt
READINGS = READING / "readings.csv"  # the readers' labels, by packet id
BLIND = READING / "blind.csv"  # each excerpt as the classifier of its round classified it
SEED = 39  # fixed before the sample was drawn


@dataclass(frozen=True)
class Blind:
    """An excerpt the classifier was measured on blind: its round and the commit the round was recorded at."""

    name: str
    round: int
    commit: str

    @property
    def path(self) -> Path:
        held = HELDOUT / f"{self.name}.log"
        return held if held.exists() else CORPUS / f"{self.name}.log"

    def excerpt(self) -> Excerpt:
        return load(self.path)


def blind_population() -> list[Blind]:
    """Every excerpt some round measured blind: the round's excerpts still held out and those moved after it."""
    rows, recorded = split_rows(), recorded_rounds(MISSES.read_text(encoding="utf-8"))
    found = []
    for n, (head, moved) in sorted(recorded.items()):
        held = [r["excerpt"] for r in rows if r["part"] == "heldout" and r["round"] == str(n)]
        found += [Blind(name, n, head.group("commit")) for name in sorted({*held, *moved})]
    return found


def packet_text(excerpt: Excerpt) -> str:
    ended = (f"the process ended by {excerpt.header['signal']}" if "signal" in excerpt.header
             else f"the process exited with status {excerpt.header.get('exit', '1')}")
    return f"# how it ended (as far as known): {ended}\n---\n" + "\n".join(excerpt.lines) + "\n"


def make_packets(out: Path, n: int, readers: int) -> None:
    """The first reading: ``n`` excerpts drawn at random, dealt to ``readers`` packets. Run again after it, the rest
    of the blind excerpts in packets of ``n``, numbered on from the last (the whole population read once)."""
    population = blind_population()
    keyed = csv_rows(KEY) if KEY.exists() else []
    if keyed:
        read = {row["excerpt"] for row in keyed}
        rest = [item for item in population if item.name not in read]
        random.Random(SEED).shuffle(rest)
        first = max(int(row["id"].split("-")[0][1:]) for row in keyed) + 1
        dealt = [(f"p{first + i // n}", f"p{first + i // n}-{i % n + 1:02d}", item) for i, item in enumerate(rest)]
    else:
        sample = random.Random(SEED).sample(population, n)
        dealt = [(f"p{i % readers + 1}", f"p{i % readers + 1}-{i // readers + 1:02d}", item)
                 for i, item in enumerate(sample)]
    out.mkdir(parents=True, exist_ok=True)
    with KEY.open("a" if keyed else "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        if not keyed:
            writer.writerow(["id", "excerpt", "round"])
        for packet, pid, item in dealt:
            (out / packet).mkdir(exist_ok=True)
            (out / packet / f"{pid}.txt").write_text(packet_text(item.excerpt()), encoding="utf-8")
            writer.writerow([pid, item.name, item.round])
    print(f"{len(dealt)} of {len(population)} blind excerpts in {len({p for p, _, _ in dealt})} packets under {out}; "
          f"key in {KEY}")


def classify_at(commit: str, names: list[tuple[str, str, str]]) -> dict[str, str]:
    """``names`` (name, exit, signal) classified by sparkd's classifier as ``commit`` had it."""
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "sparkd"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        script = ("import sys, json\n"
                  "from sparkd.cli.explain import parse_signal\n"
                  "from sparkd.supervisor.classify import classify\n"
                  "out = {}\n"
                  "for name, path, code, sig in json.load(sys.stdin):\n"
                  "    body = open(path, encoding='utf-8').read().partition('\\n---\\n')[2]\n"
                  "    lines = tuple(body.rstrip('\\n').split('\\n'))\n"
                  "    ended = (None, parse_signal(sig)) if sig else (int(code), None)\n"
                  "    out[name] = classify(*ended, lines).cls.value\n"
                  "print(json.dumps(out))\n")
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps(names), capture_output=True,
                              text=True, check=True, cwd=tree, env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"})
        return dict(json.loads(done.stdout))


def _exists(commit: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def _from_the_record(items: list[Blind]) -> dict[str, str]:
    """A round whose commit is no longer in the history (rounds 12-22 were recovered in one commit, db5129d): an
    excerpt moved after it is classified as its record says; one still held out as the classifier classifies it now."""
    moved = moved_as(MISSES.read_text(encoding="utf-8"))
    return {item.name: moved[item.name] if item.name in moved else item.excerpt().classify().cls.value
            for item in items}


def make_blind(out: Path) -> None:
    by_commit: dict[str, list[Blind]] = {}
    for item in blind_population():
        by_commit.setdefault(item.commit, []).append(item)
    rows = []
    for commit, items in by_commit.items():
        headers = {item.name: item.excerpt().header for item in items}
        recorded_at = commit
        if _exists(commit):
            got = classify_at(commit, [(item.name, str(item.path), headers[item.name].get("exit", "1"),
                                        headers[item.name].get("signal", "")) for item in items])
        else:
            got, recorded_at = _from_the_record(items), f"{commit} (gone: the record)"
        rows += [(item.name, item.round, recorded_at, headers[item.name]["class"], got[item.name]) for item in items]
    with out.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["excerpt", "round", "commit", "labelled", "classified_blind"])
        writer.writerows(sorted(rows, key=lambda r: (r[1], r[0])))
    print(f"{sum(r[3] == r[4] for r in rows)}/{len(rows)} right blind, by the commit of each round, in {out}")


@dataclass(frozen=True)
class Reading:
    """One blind excerpt: its label, how the classifier of its round classified it, and the second reader's label."""

    excerpt: str
    round: int
    labelled: str
    blind: str  # as the classifier of the excerpt's round classified it
    read: str  # the second reader's class, from the log alone
    sure: bool  # the reader was sure (else: doubt)

    @property
    def agrees(self) -> bool:
        return self.read == self.labelled

    @property
    def plain(self) -> bool:
        """The log alone supports the label: the reader was sure of it, and it is the gatherer's."""
        return self.sure and self.agrees

    @property
    def right_blind(self) -> bool:
        return self.blind == self.labelled


def readings() -> list[Reading]:
    key = {row["id"]: row["excerpt"] for row in csv_rows(KEY)}
    blind = {row["excerpt"]: row for row in csv_rows(BLIND)}
    found = []
    for row in csv_rows(READINGS):
        b = blind[key[row["id"]]]
        found.append(Reading(b["excerpt"], int(b["round"]), b["labelled"], b["classified_blind"], row["class"],
                             row["confidence"] == "sure"))
    return found


def _share(right: int, total: int) -> str:
    return f"{right}/{total} ({100 * right / total:.1f} %)" if total else "0/0"


PERIODS = ((1, 11), (12, 30), (31, 72))  # the first gatherings, the middle ones, the last (about a third each)


def summary(found: Iterable[Reading]) -> str:
    """The figures in one line: the reader against the labels, the classifier blind on what the log alone supports."""
    found = list(found)
    plain = [r for r in found if r.plain]
    periods = ", ".join(f"rounds {lo}-{hi} " + _share(sum(r.right_blind for r in plain if lo <= r.round <= hi),
                                                     sum(lo <= r.round <= hi for r in plain)) for lo, hi in PERIODS)
    return (f"second reading of {len(found)} blind excerpts from the log alone (tests/data/second-reading/): it "
            f"gives the label's class on {_share(sum(r.agrees for r in found), len(found))}, surely on "
            f"{len(plain)}; on those {len(plain)} the classifier was right blind on "
            f"{_share(sum(r.right_blind for r in plain), len(plain))} ({periods}), on all "
            f"{_share(sum(r.right_blind for r in found), len(found))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    packets = sub.add_parser("packets")
    packets.add_argument("--out", type=Path, required=True)
    packets.add_argument("-n", type=int, default=200)
    packets.add_argument("--readers", type=int, default=5)
    blind = sub.add_parser("blind")
    blind.add_argument("--out", type=Path, default=BLIND)
    sub.add_parser("report")
    args = parser.parse_args()
    READING.mkdir(parents=True, exist_ok=True)
    if args.what == "packets":
        make_packets(args.out, args.n, args.readers)
    elif args.what == "blind":
        make_blind(args.out)
    else:
        print(summary(readings()))


if __name__ == "__main__":
    main()
