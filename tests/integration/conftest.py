"""Fixtures of the daemon-level tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Fleet
from pair_harness import Link, Pair


@pytest.fixture
def sparkd(tmp_path: Path) -> Iterator[Fleet]:
    """``sparkd(**sections)`` makes a daemon with ``base_config`` and those sections; all are stopped after the test."""
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.close()


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[Any]:
    """``make_pair(**sections)`` makes a head and a worker in two namespaces of their own; all closed after."""
    pairs: list[Pair] = []

    def make(**kw: Any) -> Pair:
        folder = tmp_path / f"p{len(pairs)}"
        folder.mkdir()
        pair = Pair(folder, Link.create(), **kw)
        pairs.append(pair)
        return pair

    yield make
    for pair in pairs:
        pair.close()


@pytest.fixture
def theirs() -> Iterator[Path]:
    """A folder of nobody's (uid 65534), mode 0755, under /tmp: pytest's own folders are root's 0700, where
    another user could not reach a file."""
    base = Path(tempfile.mkdtemp(prefix="sparkd-theirs-"))
    base.chmod(0o755)
    os.chown(base, 65534, 65534)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)

