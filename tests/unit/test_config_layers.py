"""The config's layers: a file with nothing to stack over it (no profile named, no SPARKD_* override) is taken as it
is, without pydantic-settings; anything to stack goes through pydantic-settings' sources. Both ways give the same
mapping, so the shortcut changes nothing but what a daemon loads (issue 35: ~1.3 MiB at rest)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.config import Config
from sparkd.config.layers import layered
from sparkd.config.sources import stacked

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*(REPO / "config" / "examples").glob("*.toml"), *(REPO / "docs" / "examples").glob("*.toml")])

keys = st.sampled_from(["launch", "health", "guard", "env", "port", "model", "_x", "Launch", "profile_x"])
leaves = st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none(), st.lists(st.integers(), max_size=3))
tables = st.recursive(st.dictionaries(keys, leaves, max_size=4), lambda inner: st.dictionaries(keys, inner,
                                                                                                 max_size=4),
                      max_leaves=12)


@settings(deadline=None)  # the first example imports pydantic-settings
@given(tables)
def test_one_layer_is_the_same_mapping_either_way(data: dict[str, Any]) -> None:
    launch = data.get("launch")
    if isinstance(launch, dict):
        launch.pop("profile", None)
    assert layered(data, {"SPARKD_STANDIN_STARTUP_SECONDS": "3"}, Config) == stacked(data, {}, Config)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_layers_the_same_either_way(example: Path) -> None:
    data = tomllib.loads(example.read_text())
    assert layered(data, {}, Config) == stacked(data, {}, Config)
    assert layered(data, {"SPARKD_LAUNCH__PORT": "8123"}, Config) == stacked(data, {"SPARKD_LAUNCH__PORT": "8123"},
                                                                               Config)


def test_a_profile_or_an_override_is_stacked_by_pydantic_settings() -> None:
    data = {"launch": {"model": "/m", "profile": "latency", "env": {"A": "1"}}}
    merged, overrides = layered(data, {"SPARKD_LAUNCH__ENV__B": "2"}, Config)
    assert merged["launch"]["env"]["A"] == "1" and merged["launch"]["env"]["B"] == "2"
    assert merged == stacked(data, {"SPARKD_LAUNCH__ENV__B": "2"}, Config)[0]
    assert [o.variable for o in overrides] == ["SPARKD_LAUNCH__ENV__B"]
    assert layered({"launch": {"model": "/m"}}, {}, Config, profile="latency") == stacked(
        {"launch": {"model": "/m"}}, {}, Config, profile="latency")


def test_loading_a_file_without_layers_leaves_pydantic_settings_out(tmp_path: Path) -> None:
    path = tmp_path / "sparkd.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "/m"\n')
    code = ("import sys; from sparkd.config import load_config; load_config(sys.argv[1]); "
            "print('pydantic_settings' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin"}, timeout=60, check=True)
    assert out.stdout.strip() == "False"
    path.write_text(path.read_text() + 'profile = "latency"\n')
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin"}, timeout=60, check=True)
    assert out.stdout.strip() == "True"
