"""Writing files as root where a link or a FIFO might wait: never through a name someone else chose.

The launch script was written through a fixed temp name that followed symlinks: with a FIFO there a user fed
bash their own script and got ``uid=0`` (security review §3). Rules:

- a file is replaced through a temp file of a random name beside it (``.<name>.<pid>.<random>.tmp``), created
  with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (an existing name, link or FIFO fails the open, it is never written
  through), given its mode with ``fchmod`` on the descriptor, written, fsynced, and renamed over the file (a
  rename replaces a link at the destination, it does not follow it);
- a new file that must not exist yet (an incident's evidence) is created the same way, in place;
- a log is opened for appending with ``O_NOFOLLOW|O_NONBLOCK`` and kept only when ``fstat`` says it is a regular
  file (a FIFO or a device is refused, a link fails the open).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from pathlib import Path

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegularFile(OSError):
    """The path is there but is not a regular file (a FIFO, a device, a directory)."""


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def create_new(path: Path, data: bytes, mode: int = 0o640, *, fsync: bool = False) -> None:
    """Create ``path`` holding ``data``; FileExistsError when anything (a file, a link, a FIFO) has that name."""
    fd = os.open(path, _NEW, 0o600)
    try:
        os.fchmod(fd, mode)
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def replace_file(path: Path, data: bytes, mode: int = 0o640) -> None:
    """``path`` atomically replaced by a file holding ``data`` with ``mode`` (the temp file never outlives a
    failure)."""
    tmp = temp_name(path)
    create_new(tmp, data, mode, fsync=True)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: Path, mode: int = 0o640) -> int:
    """A descriptor appending to the regular file ``path`` (created with ``mode`` when missing). Raises OSError:
    ELOOP for a symlink, :class:`NotRegularFile` for a FIFO, a device or a directory."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                 | os.O_NOCTTY, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fresh_file(path: Path, mode: int = 0o640) -> int:
    """A descriptor of a new, empty ``path`` for appending: whatever had that name is removed first (a link
    itself, never its target), and the new file is created ``O_EXCL|O_NOFOLLOW``."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, _NEW | os.O_APPEND, mode)
