"""Logging: sparkd's own structured events (structlog), and the host copy of vLLM's output.

sparkd logs one JSON object per line to stderr (journald keeps it) — or a readable console rendering on a
terminal. vLLM's lines go to ``<logs>/vllm.log`` (rotated by size) and a ring buffer for incidents,
``sparkctl logs`` and the classifier.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import structlog


def configure_logging(*, json_lines: bool | None = None, level: int = logging.INFO) -> None:
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer: Any = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("sparkd").bind(**bound)


class VllmLog:
    """vLLM's output on the host: an append-only file rotated by size, plus the last lines in memory."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int, ring: int = 2000) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.tail: deque[str] = deque(maxlen=ring)
        self._handle: TextIO | None = None
        self._size = 0
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def append(self, line: str, *, persist: bool = True) -> None:
        self.tail.append(line)
        for listener in list(self._listeners):
            listener(line)
        if not persist:
            return
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived, closed in close()
            self._size = self._handle.tell()
        data = line + "\n"
        self._handle.write(data)
        self._handle.flush()
        self._size += len(data.encode("utf-8", "replace"))
        if self._size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))

    def last(self, n: int) -> list[str]:
        return list(self.tail)[-n:]

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
