"""Following a log file that another process appends to, the way ``tail -F`` does.

vLLM never writes into a pipe to sparkd: a pipe would die with the daemon and break an instance that should
survive a daemon restart. It appends to a file instead, and sparkd follows the file.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import anyio

_SPLIT = re.compile(r"\r\n|\r|\n")  # tqdm redraws its bar with \r


async def follow_file(
    path: Path, done: anyio.Event, *, poll_s: float = 0.2, truncate_over: int | None = None,
) -> AsyncIterator[str]:
    """Yield complete lines appended to ``path`` from its start; after ``done`` is set, drain and stop.

    ``truncate_over``: when the file has been read to its end and is larger than this, truncate it
    (the caller keeps the lines elsewhere), so a raw output file cannot fill the disk.
    """
    handle = None
    pending = ""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while True:
            if handle is None:
                handle = _open(path)
            chunk = handle.read(65536) if handle is not None else b""
            if chunk:
                pending += decoder.decode(chunk)
                *lines, pending = _SPLIT.split(pending)
                for line in lines:
                    yield line
                continue
            if done.is_set():
                if pending:
                    yield pending
                return
            if handle is not None:
                _maybe_truncate(handle, path, truncate_over)
            with anyio.move_on_after(poll_s):
                await done.wait()
    finally:
        if handle is not None:
            handle.close()


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return None


def _maybe_truncate(handle: BinaryIO, path: Path, limit: int | None) -> None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return
    position = handle.tell()
    if size < position:  # truncated or replaced by someone else: start over
        handle.seek(0)
    elif limit is not None and size > limit and size == position:
        os.truncate(path, 0)
        handle.seek(0)
