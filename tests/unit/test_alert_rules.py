"""The shipped alert rules, read as the operator gets them: every alert says what happened (summary), what it
means (description) and where to read on: a runbook_url whose anchor is a section of the runbook, on the runbook the
alerting node's sparkd serves (``http://<instance>/runbook``) unless Prometheus's external label
``sparkd_runbook_base`` names the operator's own copy, and a runbook_file, the packaged copy on the node. No URL in
the package points at a repository that does not exist (the rules once linked a placeholder repository).

``promtool test rules`` (test_observe) holds what each rule's expression does and what its links render to;
tests/integration/test_runbook_served.py follows every link to a live sparkd; this holds what the rules say.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkd.supervisor.runbook import anchor

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "sparkd-alerts.yml"
RUNBOOK = ROOT / "sparkd" / "api" / "runbook.md"
PACKAGED = "file:///usr/share/doc/sparkd/runbook.md#"
SCHEME = "{{ with $externalLabels.sparkd_runbook_scheme }}{{ . }}{{ else }}http{{ end }}"
# The one form every runbook_url takes: the operator's base when Prometheus has it, else the alerting node's own.
URL = ("{{ with $externalLabels.sparkd_runbook_base }}{{ . }}{{ else }}" + SCHEME +
       "://{{ $labels.instance }}/runbook{{ end }}#%s")
# SparkdAbsent has no instance: the sparkd scraped last, else the packaged copy.
ABSENT = ("{{ with $externalLabels.sparkd_runbook_base }}{{ . }}{{ else }}"
          '{{ with query "topk(1, last_over_time(sparkd_build_info[1w]))" }}' + SCHEME +
          '://{{ . | first | label "instance" }}/runbook{{ else }}file:///usr/share/doc/sparkd/runbook.md{{ end }}'
          "{{ end }}#sparkdabsent")


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


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
    expected = ABSENT if rule["alert"] == "SparkdAbsent" else URL % section
    assert notes.get("runbook_url") == expected, f"{rule['alert']}: runbook_url"
    assert section == anchor(rule["alert"])
    assert rule.get("labels", {}).get("severity") in ("warning", "critical"), f"{rule['alert']}: severity"


# Code hosts whose URLs name a repository; the package may name only repositories known to exist, each with why.
REPOSITORY = re.compile(r"(?:github\.com|gitlab\.com|bitbucket\.org)/([\w.-]+)/([\w.-]+)")
KNOWN = {"deepseek-ai/DeepGEMM": "the image rule's sentence (sparkd/supervisor/rulekit.py) names its install source"}
SHIPPED = ["sparkd", "standin", "packaging", "systemd", "config", "docs", "README.md", "pyproject.toml", "Makefile"]


def shipped_files() -> list[Path]:
    out: list[Path] = []
    for name in SHIPPED:
        path = ROOT / name
        out += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts] if path.is_dir() else [path]
    return out


def test_no_url_in_the_package_points_at_a_repository_that_does_not_exist() -> None:
    found = {}
    for path in shipped_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for owner, repo in REPOSITORY.findall(text):
            found.setdefault(f"{owner}/{repo.removesuffix('.git')}", str(path.relative_to(ROOT)))
    unknown = {repo: where for repo, where in found.items() if repo not in KNOWN}
    assert unknown == {}, f"a repository not known to exist is linked (placeholder?): {unknown}"
    assert "deepseek-ai/DeepGEMM" in found  # the scan sees the package's files


def test_the_scan_catches_the_old_placeholder() -> None:
    assert REPOSITORY.findall("https://github.com/sparkd/sparkd/blob/main/docs/runbook.md") == [("sparkd", "sparkd")]
