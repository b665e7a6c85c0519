"""docs/design.md matches the code: its lifecycle table and its failure table are generated from
``sparkd.supervisor.lifecycle`` and ``sparkd.supervisor.failures`` (``python tests/unit/test_design_doc.py``
rewrites them), and every module it names exists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sparkd.supervisor import lifecycle
from sparkd.supervisor.failures import CAUSES, TREATMENT
from sparkd.supervisor.states import State

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "design.md"


def lifecycle_table() -> str:
    rows = ["| from | observation | to | the rule |", "|---|---|---|---|"]
    for state in State:
        for (s, obs), edge in lifecycle.TABLE.items():
            if s is state:
                to = " \\| ".join(t.value for t in State if t in edge.to)
                rows.append(f"| {state.value} | {obs.__name__} | {to} | {edge.why} |")
    return "\n".join(rows)


def ignored_table() -> str:
    by_reason: dict[str, list[str]] = {}
    for (state, obs), why in lifecycle.IGNORED.items():
        by_reason.setdefault(why, []).append(f"{state.value}/{obs.__name__}")
    rows = ["| ignored (logged) | pairs |", "|---|---|"]
    for why, pairs in by_reason.items():
        rows.append(f"| {why} | {len(pairs)} pairs, e.g. {', '.join(pairs[:3])} |")
    return "\n".join(rows)


def failure_table() -> str:
    rows = ["| class | restartable | budget | scope | evidence beyond the log tail | what happened |",
            "|---|---|---|---|---|---|"]
    for cls, t in TREATMENT.items():
        evidence = ", ".join(sorted(e.value for e in t.evidence))
        rows.append(f"| {cls.value} | {'yes' if t.restartable else 'no'} | {t.budget.value} | {t.scope.value} "
                    f"| {evidence} | {t.what} |")
    return "\n".join(rows)


def causes_table() -> str:
    rows = ["| the group's check finds | class |", "|---|---|"]
    rows += [f"| {what} | {cls.value} |" for cls, what in CAUSES.values()]
    return "\n".join(rows)


SECTIONS = {"lifecycle": lifecycle_table, "ignored": ignored_table, "failures": failure_table,
            "causes": causes_table}


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        text = re.sub(rf"(<!-- {name}:begin -->\n)(?:.*?\n)?(<!-- {name}:end -->)",
                      lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), text, flags=re.S)
    return text


def test_the_generated_tables_match_the_code() -> None:
    text = DOC.read_text()
    for name in SECTIONS:
        assert f"<!-- {name}:begin -->" in text, name
    assert render(text) == text, "docs/design.md is stale: run `python tests/unit/test_design_doc.py`"


def test_every_module_the_design_names_exists() -> None:
    named = set(re.findall(r"`(sparkd/[\w/]+\.py)`", DOC.read_text()))
    assert named, "the design names its modules"
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert missing == []


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
    sys.exit(0)
