"""Opening a file in a container's file system from the host, resolved inside the container: never through a
symlink out of it.

docker-exec reads vLLM's output at ``/proc/<container init>/root/tmp/sparkd-vllm.log``. A plain ``open()`` of
that path resolves an absolute symlink in the container against the host's root: code in the container (a
model's ``trust_remote_code``, a bad package) could make root read ``/etc/shadow`` into ``sparkctl logs``
(security review §5). Here the path is resolved with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``
against a descriptor of the container's root, so ``/`` and ``..`` stop at the container's root and ``/proc``
magic links are refused. Where the kernel lacks openat2 (before 5.6) every component is opened with
``O_NOFOLLOW`` instead, and any symlink on the way refuses the open. Either way the result must be a regular
file.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from typing import BinaryIO

from sparkd.runtime.logfile import regular

SYS_OPENAT2 = 437  # the same number on every architecture Linux added it to after 5.6 (x86_64, aarch64)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_PROC_ROOT = re.compile(r"^/proc/(\d+)/root(/.+)$")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    call = _libc.syscall
    call.restype = ctypes.c_long
    return call


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """The openat2 system call. Raises OSError (ENOSYS where the kernel lacks it)."""
    call = _syscall()
    if call is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    fd = call(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
              ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _walk(root_fd: int, path: str, flags: int) -> int:
    """The fallback: every component opened relative to the last with O_NOFOLLOW (no link is ever followed)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EPERM, "refused: the path leaves the root", path)
    fd = os.dup(root_fd)
    try:
        for name in parts[:-1]:
            step = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def open_in_root(root: str, path: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path`` resolved inside the file system whose root is ``root`` (a directory, e.g.
    ``/proc/<pid>/root``). Raises OSError: ELOOP/ENOTDIR/EXDEV for a way out, ENOENT when missing."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            return openat2(root_fd, path, flags | os.O_NONBLOCK | os.O_NOCTTY,
                           RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
        return _walk(root_fd, path, flags | os.O_NONBLOCK | os.O_NOCTTY)
    finally:
        os.close(root_fd)


def open_log(host_path: str) -> BinaryIO | None:
    """The container's log named by its host path ``/proc/<pid>/root/<path>`` (see ``host_log_path``), opened
    inside that root; None when it is missing, a way out, or not a regular file."""
    match = _PROC_ROOT.match(host_path)
    if match is None:
        return None
    root = f"/proc/{match.group(1)}/root"
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            return regular(open_in_root(root, match.group(2), flags))
        except PermissionError:
            continue
        except OSError:
            return None
    return None
