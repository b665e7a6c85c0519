"""The stand-in's tests: ``launch.start(...)`` starts a stand-in, and every one is ended after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from standin_helpers import Standins, standins


@pytest.fixture
def launch() -> Iterator[Standins]:
    with standins() as group:
        yield group
