"""The corpus of real vLLM log excerpts (tests/data/vllm-logs/, format in its README): every excerpt goes through
the log parser, the classifier and `sparkd explain`, and must come out as its header says — the expected class and
a sentence that names the cause and the next step."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from functools import reduce
from pathlib import Path

import pytest
from vllmcorpus import CORPUS, NOT_IN_LOGS, Excerpt, load_all

from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.logline import clean, parse
from sparkd.supervisor.progress import Phase, Startup, advance
from sparkd.supervisor.servelog import read_serve_line

SPARKD = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparkd"

EXCERPTS = load_all(CORPUS)
IDS = [e.name for e in EXCERPTS]


def test_the_corpus_spans_the_versions() -> None:
    """Every excerpt names its source and a vLLM version; together they run from V0 (before 0.11) to at least 0.24
    (builds after 0.24 are what the DGX Spark field runs, so they count too), and the real vLLM 0.32 of the test tier
    (tests/realvllm) is among them. Sources are public pages (https), field reports or the test tier."""
    minors = {e.minor for e in EXCERPTS}
    assert min(minors) <= 10 and max(minors) >= 24 and 32 in minors, sorted(minors)
    for e in EXCERPTS:
        assert e.header["source"].startswith(("https://", "field-reports/", "tests/realvllm/")), e.name


# Issue 14 asks for at least 40 excerpts and two of every class a vLLM log can show (README, "Coverage").
def test_the_corpus_is_broad() -> None:
    """At least 40 excerpts, every class a vLLM log can show at least twice."""
    counts = Counter(e.cls for e in EXCERPTS)
    thin = {cls.value: counts[cls] for cls in FailureClass if cls not in NOT_IN_LOGS and counts[cls] < 2}
    assert len(EXCERPTS) >= 40 and not thin, f"{len(EXCERPTS)} excerpts; classes with fewer than two: {thin}"


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=IDS)
def test_every_line_parses(excerpt: Excerpt) -> None:
    """The parser takes every real line apart: no colour and no `(Name pid=N)` prefix is left in front."""
    for raw in excerpt.lines:
        line = parse(raw)
        assert "\x1b" not in line.text and not re.match(r"\s*\([A-Za-z_][\w.\-]* pid=\d+", line.text), raw
        read_serve_line(raw)
    progress = reduce(lambda p, item: advance(p, item[1], float(item[0])), enumerate(excerpt.lines), Startup())
    if "phase" in excerpt.header:
        assert progress.phase is Phase(excerpt.header["phase"])


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=IDS)
def test_classified_as_the_header_says(excerpt: Excerpt) -> None:
    failure = excerpt.classify()
    assert failure.cls is excerpt.cls, failure.sentence
    what, _, do = failure.sentence.partition("; ")
    assert what and do, failure.sentence
    assert excerpt.header["cause"] in failure.sentence, failure.sentence
    assert excerpt.header["next"] in failure.sentence, failure.sentence
    if failure.evidence is not None:  # the line it rests on is one of the excerpt's (undecorated)
        cleaned = " ".join(clean(line) for line in excerpt.lines)
        assert failure.evidence.rstrip("…")[:60] in cleaned or failure.evidence.startswith("docker inspect")


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=IDS)
def test_sparkd_explain_says_the_same(excerpt: Excerpt) -> None:
    """`sparkd explain - --json`, the excerpt on stdin: the same class and sentence as the daemon's classifier."""
    how = ["--signal", excerpt.header["signal"]] if "signal" in excerpt.header else \
        ["--exit-code", str(excerpt.exit_code)]
    proc = subprocess.run([str(SPARKD), "explain", "-", *how, "--json"], input="\n".join(excerpt.lines) + "\n",
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    expected = classify(excerpt.exit_code, excerpt.signal, excerpt.lines)
    assert answer == {"class": excerpt.cls.value, "sentence": expected.sentence, "evidence": expected.evidence,
                      "runbook": f"/runbook#{excerpt.cls.value}"}
