"""Waiting in tests: poll a condition until it holds, or fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def until(predicate: Callable[[], Any], what: str, timeout: float = 60.0, *, interval: float = 0.1,
          tolerate: tuple[type[BaseException], ...] = (), log: Path | None = None) -> Any:
    """``predicate()``'s first true value, asked every ``interval`` s; an exception in ``tolerate`` counts as not
    yet. Past ``timeout`` an AssertionError names ``what`` (and shows the end of ``log``, where one is given)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except tolerate:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}".rstrip())
        time.sleep(interval)
