"""The venv the tests run in holds exactly the versions packaging/constraints.txt pins, the ones the .deb
ships (`make setup` installs from the same file): the suite tests what ships."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "packaging" / "constraints.txt"


def venv_check() -> Any:
    spec = importlib.util.spec_from_file_location("venv_check", REPO / "packaging" / "venv_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_venv_has_exactly_the_pinned_versions() -> None:
    check = venv_check()
    problems = check.differences(check.pins(CONSTRAINTS), check.installed())
    assert problems == [], f"{sys.prefix} differs from {CONSTRAINTS} (run `make setup`): {problems}"


def test_every_runtime_dependency_is_pinned() -> None:
    import tomllib

    check = venv_check()
    pinned = check.pins(CONSTRAINTS)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = check.canonical(dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip())
        assert name in pinned, f"{dep} has no pin in {CONSTRAINTS}"


def test_differences_names_what_is_off() -> None:
    check = venv_check()
    assert check.differences({"a": "1"}, {"a": "2", "b": "1", "pip": "9", "sparkd": "0"}) == [
        "a 2 is installed, 1 is pinned", "b 1 is installed but not pinned"]
