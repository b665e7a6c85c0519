"""tests/gpu/wheels.txt, the wheels a GPU host without a package index needs for `make test-gpu`, stays what sparkd
and tests/gpu need: every line a pin of packaging/constraints.txt, and nothing of the dependency closure missing."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {norm(name): version for name, _, version in (line.partition("==") for line in lines if line)}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> set[str]:
    """The distributions ``roots`` need on Linux with Python >= 3.11 (this venv's markers)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = norm(stack.pop())
        if name in seen:
            continue
        seen.add(name)
        for requirement in md.distribution(name).requires or []:
            spec, _, marker = requirement.partition(";")
            if marker and ("extra ==" in marker or not _holds(marker)):
                continue
            stack.append(re.match(r"[A-Za-z0-9_.-]+", spec.strip()).group(0))  # type: ignore[union-attr]
    return seen


def _holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate()


def test_the_gpu_wheels_are_pinned_and_complete() -> None:
    wanted = pins(REPO / "tests" / "gpu" / "wheels.txt")
    constraints = pins(REPO / "packaging" / "constraints.txt")
    assert {k: v for k, v in wanted.items() if constraints.get(k) != v} == {}
    # the stand-in too: the quiet-host benches run sparkd supervising it (tests/gpu/quiet_setup.sh)
    needed = closure(["sparkd", "sparkd-standin", "pytest", "pytest-timeout", "setproctitle"]) - {"sparkd",
                                                                                                  "sparkd-standin"}
    assert needed - set(wanted) == set() and set(wanted) - needed == set()
