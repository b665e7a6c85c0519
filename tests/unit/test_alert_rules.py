"""The shipped alert rules, read as the operator gets them: every alert says what happened (summary), what it
means (description) and where to read on (a runbook_url whose anchor is a section of docs/runbook.md).

``promtool test rules`` (test_observe) holds what each rule's expression does; this holds what it says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "sparkd-alerts.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_BASE = "file:///usr/share/doc/sparkd/runbook.md#"


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub, pandoc's gfm) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections() -> set[str]:
    return {anchor(line[3:]) for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}


def test_the_rules_file_has_alerts() -> None:
    assert len(alerts()) == RULES.read_text().count("- alert: ") >= 10


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_says_what_and_links_its_runbook_section(rule: dict[str, Any]) -> None:
    notes = rule.get("annotations") or {}
    assert notes.get("summary", "").strip(), f"{rule['alert']}: no summary"
    assert notes.get("description", "").strip(), f"{rule['alert']}: no description"
    url = notes.get("runbook_url", "")
    assert url.startswith(RUNBOOK_BASE), f"{rule['alert']}: runbook_url {url!r} is not under {RUNBOOK_BASE}"
    assert url.removeprefix(RUNBOOK_BASE) in sections(), f"{rule['alert']}: {url} names no section of {RUNBOOK}"
    assert rule.get("labels", {}).get("severity") in ("warning", "critical"), f"{rule['alert']}: severity"
