"""Fixtures of the daemon-level tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import Fleet


@pytest.fixture
def sparkd(tmp_path: Path) -> Iterator[Fleet]:
    """``sparkd(**sections)`` makes a daemon with ``base_config`` and those sections; all are stopped after the test."""
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.close()
