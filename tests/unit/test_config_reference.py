"""Every config key is documented, docs/config.md is what `sparkd config-reference` prints, and each
documented variable really overrides its key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from sparkd.config import Config, config_from_mapping
from sparkd.config.env import parse_overrides
from sparkd.config.reference import UndocumentedKey, reference_markdown, rows

REPO = Path(__file__).resolve().parents[2]


def sparkd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkd.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=False)


def test_docs_config_md_is_the_generated_reference() -> None:
    result = sparkd("config-reference")
    assert result.returncode == 0, result.stderr
    on_disk = (REPO / "docs" / "config.md").read_text()
    assert result.stdout == on_disk, "docs/config.md is stale: run `sparkd config-reference > docs/config.md`"


def test_every_key_has_a_type_a_default_and_a_description() -> None:
    found = rows()
    assert len(found) > 140
    for row in found:
        assert row.description and row.type and row.default, row
    keys = {row.key for row in found}
    # Keys the operators' review found documented nowhere are among them now.
    assert {"preflight.skip", "preflight.apply_host", "supervisor.log_max_bytes", "supervisor.incidents_keep",
            "paths.log_dir", "restart.consecutive_limit", "health.stall_after_s", "log.level"} <= keys


def test_a_key_without_a_description_fails_the_reference() -> None:
    class Section(BaseModel):
        documented: int = Field(default=1, description="yes")
        bare: int = 2

    class Root(BaseModel):
        part: Section = Field(default_factory=Section, description="a section")

    with pytest.raises(UndocumentedKey, match=r"part\.bare"):
        rows(Root)


def test_each_documented_variable_overrides_its_key() -> None:
    for row in rows():
        if row.variable is None:
            continue
        (override,) = parse_overrides({row.variable: "[]" if "list" in row.type else "{}"
                                       if "table" in row.type else "1"}, Config)
        assert ".".join(override.path) == row.key, row


def test_defaults_shown_are_the_models_defaults() -> None:
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "/m"}}, env={})
    shown = {row.key: row.default for row in rows()}
    assert shown["launch.port"] == str(cfg.launch.port) == "8000"
    assert shown["guard.warn_below"] == '"8 GiB"' and cfg.guard.warn_below == 8 * 1024**3
    assert shown["launch.model"] == "required"
    assert shown["node.name"].startswith("computed")  # not this machine's host name
    assert shown["container.command"] == '["sleep", "infinity"]'


def test_json_output_lists_the_same_keys() -> None:
    result = sparkd("config-reference", "--json")
    assert result.returncode == 0, result.stderr
    assert [item["key"] for item in json.loads(result.stdout)] == [row.key for row in rows()]
    assert reference_markdown().count("\n| `") == len(rows())
