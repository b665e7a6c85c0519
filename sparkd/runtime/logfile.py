"""Following a log file that another process appends to, the way ``tail -F`` does — at a bounded cost.

vLLM never writes into a pipe to sparkd: a pipe would die with the daemon and break an instance that should
survive a daemon restart. It appends to a file instead, and sparkd follows the file.

Bounds (issue 16, reliability.md 6b/6c), whatever vLLM writes:
- Memory and CPU per line: a line longer than ``max_line`` characters is cut into pieces of ``max_line``,
  each ending in :data:`CUT_MARK`; after ``max_pieces`` pieces the rest of that line is dropped and one
  :data:`NOTE` line says how much. Work is linear in the bytes read (no re-splitting of a growing buffer).
- Fairness: the reader hands the event loop a turn between two reads that both found bytes, and after every whole
  chunk (``chunk`` bytes), so a flood never starves the watchdog ping, signals or the control API; a wait's one
  short read (a line or two, many times a minute at rest) is followed by the read that finds the end, at once.
- Disk: the raw file is truncated once it is larger than ``truncate_over`` — at its end when the reader is
  caught up (nothing lost), and also while a flood outruns the reader (what was not read yet is skipped, and a
  :data:`NOTE` line says how many bytes).
- Replay: a file found larger than ``replay_max`` when it is first opened (an adopted instance's) is read
  from its last ``replay_max`` bytes, from a line start; a :data:`NOTE` line says what was skipped.
- Root reads where vLLM writes: the file is opened without following a symlink (``O_NOFOLLOW``; a container's
  file through :mod:`sparkd.runtime.inroot`, never out of the container), kept only when it is a regular file,
  and measured and truncated through its descriptor, never by name (a name can be swapped for a link to a host
  file between two calls; security review §5).
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import anyio

from sparkd.host.waits import Flag
from sparkd.runtime.filewatch import FileWatch

_SPLIT = re.compile(r"\r\n|\r|\n")  # tqdm redraws its bar with \r
CUT_MARK = " [sparkd: line cut]"
NOTE = "---- sparkd:"
MAX_LINE = 16384
MAX_PIECES = 4
CHUNK = 65536


@dataclass
class FollowStats:
    """What the reader did, for the caller's accounting (adoption replay, metrics)."""

    offset: int = 0  # file offset just past the last byte read
    cut_lines: int = 0
    skipped_bytes: int = 0  # not read: replay bound and flood truncation
    truncations: int = 0


class LineSplitter:
    """Bytes in, capped lines out. Linear: each byte is decoded and scanned once."""

    def __init__(self, max_line: int = MAX_LINE, max_pieces: int = MAX_PIECES) -> None:
        self.max_line = max_line
        self.max_pieces = max_pieces
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []
        self.size = 0  # characters held in parts
        self.pieces = 0  # pieces already given for the current line
        self.dropped = 0  # characters dropped from the current line
        self.carry = ""  # a trailing "\r" that may be half of "\r\n"
        self.cut_lines = 0

    def feed(self, data: bytes, *, final: bool = False) -> list[str]:
        text = self.carry + self.decoder.decode(data, final)
        self.carry = ""
        if text.endswith("\r") and not final:
            text, self.carry = text[:-1], "\r"
        out: list[str] = []
        fields = _SPLIT.split(text)
        for n, field in enumerate(fields):
            self._add(field, out)
            if n < len(fields) - 1:
                self._end_line(out)
        if final and (self.size or self.pieces or self.dropped):
            self._end_line(out)
        return out

    def _add(self, text: str, out: list[str]) -> None:
        while text:
            if self.pieces >= self.max_pieces:
                self.dropped += len(text)
                return
            room = self.max_line - self.size
            if len(text) < room:
                self.parts.append(text)
                self.size += len(text)
                return
            self.parts.append(text[:room])
            out.append("".join(self.parts) + CUT_MARK)
            text = text[room:]
            self.parts, self.size = [], 0
            self.pieces += 1

    def _end_line(self, out: list[str]) -> None:
        if self.pieces:
            if self.size:
                out.append("".join(self.parts))
            self.cut_lines += 1
            if self.dropped:
                out.append(f"{NOTE} the line above was cut: {self.dropped} more characters dropped")
        else:
            out.append("".join(self.parts))
        self.parts, self.size, self.pieces, self.dropped = [], 0, 0, 0

    def reset(self) -> list[str]:
        """Forget a partial line (the file was truncated under it); returns what to yield of it."""
        out = self.feed(b"", final=True) if (self.size or self.pieces or self.carry) else []
        self.decoder.reset()
        return out


WATCHED_POLL_S = 5.0  # with an inotify watch, a look at the file anyway this often (the watch is the fast path)


async def follow_file(
    path: Path, done: Flag, *, poll_s: float = 0.2, truncate_over: int | None = None,
    max_line: int = MAX_LINE, max_pieces: int = MAX_PIECES, replay_max: int | None = None,
    chunk: int = CHUNK, stats: FollowStats | None = None, opener: Callable[[], BinaryIO | None] | None = None,
) -> AsyncIterator[str]:
    """Yield the lines appended to ``path`` from its start; after ``done`` is set, drain and stop.

    ``truncate_over``: keep the raw file under this size (see the module doc). ``replay_max`` (default:
    ``truncate_over``): where a large file is first opened, read only its last this-many bytes. Between reads
    the follower waits for a write to the file (inotify, ``filewatch``), for ``done``, or WATCHED_POLL_S; without
    a watch it polls every ``poll_s``. ``opener``: how the file is opened (default :func:`open_regular`)."""
    stats = stats if stats is not None else FollowStats()
    replay_max = truncate_over if replay_max is None else replay_max
    handle: BinaryIO | None = None
    splitter = LineSplitter(max_line, max_pieces)
    watch: FileWatch | None = None
    streak = False  # this read follows another read, not a wait
    try:
        while True:
            if handle is None:
                handle = opener() if opener is not None else open_regular(path)
                if handle is not None:
                    watch = FileWatch.open(path)
                    for line in _skip_replay(handle, path, replay_max, stats):
                        yield line
            data = handle.read(chunk) if handle is not None else b""
            if data:
                stats.offset += len(data)
                for line in splitter.feed(data):
                    yield line
                stats.cut_lines = splitter.cut_lines
                if handle is not None and truncate_over is not None:
                    for line in _outrun(handle, path, truncate_over, splitter, stats):
                        yield line
                if streak or len(data) == chunk:  # more may be waiting (the module doc's fairness)
                    await anyio.sleep(0)  # a turn for every other task between two reads
                streak = True
                continue
            streak = False
            if done.is_set():
                for line in splitter.feed(b"", final=True):
                    yield line
                return
            if handle is not None:
                lines, moved = _at_end(handle, path, truncate_over, splitter, stats)
                for line in lines:
                    yield line
                if moved:
                    continue  # back at the start of the file: what is there now is read at once, not at the next write
            if watch is not None:
                await watch.wait(done, max(poll_s, WATCHED_POLL_S))
                continue
            with anyio.move_on_after(poll_s):
                await done.wait()
    finally:
        if watch is not None:
            watch.close()
        if handle is not None:
            handle.close()


def open_regular(path: Path) -> BinaryIO | None:
    """``path`` for reading (and truncating, where allowed), or None: missing, a symlink, not a regular file."""
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except PermissionError:
            continue
        except OSError:
            return None
        return regular(fd)
    return None


def regular(fd: int) -> BinaryIO | None:
    """``fd`` as a binary file when it is a regular file; else it is closed and None returned."""
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "rb")
    except OSError:
        pass
    os.close(fd)
    return None


def _size(handle: BinaryIO) -> int | None:
    try:
        return os.fstat(handle.fileno()).st_size
    except OSError:
        return None


def _truncate(handle: BinaryIO) -> bool:
    try:
        os.ftruncate(handle.fileno(), 0)
    except OSError:
        return False  # opened read-only, or not ours to shorten: keep reading it as it is
    return True


def _skip_replay(handle: BinaryIO, path: Path, replay_max: int | None, stats: FollowStats) -> list[str]:
    size = _size(handle)
    if replay_max is None or size is None or size <= replay_max:
        return []
    handle.seek(size - replay_max)
    handle.readline()  # to the next line start
    start = handle.tell()
    stats.offset = start
    stats.skipped_bytes += start
    return [f"{NOTE} skipped the first {start} bytes of {path} (replay is bounded to its last {replay_max})"]


def _outrun(handle: BinaryIO, path: Path, limit: int, splitter: LineSplitter, stats: FollowStats) -> list[str]:
    """While a flood outruns the reader: truncate a raw file over ``limit``, skipping what is unread."""
    size = os.fstat(handle.fileno()).st_size
    unread = size - handle.tell()
    if size <= limit or unread <= 0:
        return []  # at its end, _at_end truncates it with nothing lost
    if not _truncate(handle):
        return []
    out = splitter.reset()
    handle.seek(0)
    stats.offset = 0
    stats.skipped_bytes += unread
    stats.truncations += 1
    out.append(f"{NOTE} vLLM wrote faster than sparkd reads: skipped {unread} bytes of {path} "
               f"(kept under {limit} bytes)")
    return out


def _at_end(handle: BinaryIO, path: Path, limit: int | None, splitter: LineSplitter, stats: FollowStats
            ) -> tuple[list[str], bool]:
    """At the end of what was read: the lines to flush, and whether the handle went back to the file's start."""
    size = _size(handle)
    if size is None:
        return [], False
    position = handle.tell()
    if size < position:  # truncated or replaced by someone else: start over
        handle.seek(0)
        stats.offset = 0
        return splitter.reset(), True
    if limit is not None and size > limit and size == position and _truncate(handle):
        handle.seek(0)
        stats.offset = 0
        stats.truncations += 1
        return [], True
    return [], False
