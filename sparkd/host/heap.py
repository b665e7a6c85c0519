"""The C heap of this process: glibc keeps freed pages for the next ``malloc``; a daemon that will rest gives them
back."""

from __future__ import annotations

import contextlib
import ctypes

__all__ = ["trim_heap"]


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: free pages of every arena's heap back to the system (no glibc: nothing done)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
