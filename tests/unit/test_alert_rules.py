"""The shipped alert rules, read as the operator gets them: every alert says what happened (summary), what it
means (description) and where to read on: a runbook_url whose anchor is a section of docs/runbook.md, on the
published runbook (pyproject.toml's Runbook URL) unless Prometheus's external label ``sparkd_runbook_base`` names
the operator's own copy, and a runbook_file, the packaged copy on the node.

``promtool test rules`` (test_observe) holds what each rule's expression does; this holds what it says.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "sparkd-alerts.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PACKAGED = "file:///usr/share/doc/sparkd/runbook.md#"
PUBLISHED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Runbook"]
# The one form every runbook_url takes: the operator's base when Prometheus has it, else the published runbook.
URL = "{{ with $externalLabels.sparkd_runbook_base }}{{ . }}{{ else }}%s{{ end }}#%s"


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
    packaged = notes.get("runbook_file", "")
    assert packaged.startswith(PACKAGED), f"{rule['alert']}: runbook_file {packaged!r} is not under {PACKAGED}"
    section = packaged.removeprefix(PACKAGED)
    assert section in sections(), f"{rule['alert']}: {packaged} names no section of {RUNBOOK}"
    assert notes.get("runbook_url") == URL % (PUBLISHED, section), f"{rule['alert']}: runbook_url"
    assert rule.get("labels", {}).get("severity") in ("warning", "critical"), f"{rule['alert']}: severity"


def test_the_published_runbook_is_a_web_address() -> None:
    """Alertmanager, Slack and a browser elsewhere open it (a file:// link is dead there)."""
    assert PUBLISHED.startswith("https://") and PUBLISHED.endswith("/runbook.md"), PUBLISHED
