"""The ring file: a fixed-size file of framed records, the oldest overwritten first.

Layout: a 64-byte header (magic, format, the data area's size, a CRC of the header), then the data area. Each
record is one frame, ``magic (4) | length (u16) | seq (u64) | crc32 (u32) | record``, the CRC over the length,
the sequence number and the record. A frame never wraps: when it does not fit before the end of the data area
the writer starts again at its beginning, and what is left at the end is older frames, still whole.

Reading (:func:`scan`) trusts nothing: it looks for the magic, and keeps a frame only when its length fits and
its CRC matches; anything else is skipped a byte at a time to the next magic. So a torn write at a power cut
loses that one record (and the older frames it had started to overwrite), a truncated or corrupted file loses
exactly the frames it touched, and no input makes the reader fail. The newest frame (the highest ``seq``) tells
a restarted writer where to go on.

Files are opened without following a symlink (``O_NOFOLLOW``), must be regular files with one link, owned by
the user sparkd runs as; anything else at the path is set aside, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sparkd.recorder.record import Record, decode

__all__ = ["HEADER_SIZE", "Frame", "NotARing", "RingFile", "frame", "read_frames", "read_ring", "scan", "scan_frames"]

MAGIC = b"SPRc"
FILE_MAGIC = b"SPARKD-RING\0"
HEADER_SIZE = 64
_HEAD = struct.Struct("<12sHI")  # file magic, format, data size
_FRAME = struct.Struct("<4sHQI")  # magic, length, seq, crc
_CRC_PART = struct.Struct("<HQ")
MAX_RECORD = 8192
_FORMAT = 1
_ZERO_CHUNK = 1 << 18


class NotARing(OSError):
    """The path holds something sparkd must not write through (a link, a directory, a file not its own)."""


@dataclass(frozen=True)
class Frame:
    offset: int  # in the data area
    seq: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.offset + _FRAME.size + len(self.payload)


def frame(seq: int, payload: bytes) -> bytes:
    if len(payload) > MAX_RECORD:
        raise ValueError(f"a record of {len(payload)} bytes is over {MAX_RECORD}")
    crc = zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(len(payload), seq)))
    return _FRAME.pack(MAGIC, len(payload), seq, crc) + payload


def header(data_size: int) -> bytes:
    head = _HEAD.pack(FILE_MAGIC, _FORMAT, data_size)
    return (head + struct.pack("<I", zlib.crc32(head))).ljust(HEADER_SIZE, b"\0")


def data_size_of(head: bytes) -> int | None:
    """The data area's size a header names, or None when it is no ring header."""
    if len(head) < _HEAD.size + 4:
        return None
    magic, version, size = _HEAD.unpack_from(head)
    (crc,) = struct.unpack_from("<I", head, _HEAD.size)
    if magic != FILE_MAGIC or version != _FORMAT or crc != zlib.crc32(head[:_HEAD.size]):
        return None
    return int(size)


def scan_frames(data: bytes) -> Iterator[Frame]:
    """Every whole frame in ``data`` (a data area, or any bytes at all), in file order."""
    pos, end = 0, len(data)
    while pos + _FRAME.size <= end:
        at = data.find(MAGIC, pos)
        if at < 0 or at + _FRAME.size > end:
            return
        _, length, seq, crc = _FRAME.unpack_from(data, at)
        body = at + _FRAME.size
        if length <= MAX_RECORD and body + length <= end:
            payload = data[body:body + length]
            if zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(length, seq))) == crc:
                yield Frame(at, seq, payload)
                pos = body + length
                continue
        pos = at + 1


def scan(data: bytes) -> list[Record]:
    """The records in ``data``, oldest first (by sequence number); a frame that does not decode is skipped."""
    return records_of(scan_frames(data))


def records_of(frames: Iterable[Frame]) -> list[Record]:
    records = []
    for f in frames:
        with contextlib.suppress(ValueError, struct.error):
            records.append(decode(f.payload, f.seq))
    records.sort(key=lambda r: r.seq)
    return records


def _data_area(raw: bytes) -> bytes:
    size = data_size_of(raw[:HEADER_SIZE])
    if size is None:  # a damaged header: the frames are still worth reading
        return raw
    return raw[HEADER_SIZE:HEADER_SIZE + size]


def read_frames(path: Path) -> list[Frame]:
    """Every whole frame a ring file holds, in file order. Raises OSError (missing, unreadable, not a regular
    file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARing(f"{path} is not a regular file")
        raw = _read_all(fd)
    finally:
        os.close(fd)
    return list(scan_frames(_data_area(raw)))


def read_ring(path: Path) -> list[Record]:
    """Every record a ring file holds, oldest first. Raises OSError (missing, unreadable, not a regular file)."""
    return records_of(read_frames(path))


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _safe_open(path: Path) -> int:
    """The ring's fd, read-write: never through a symlink, never a file with other links or another owner."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARing(f"{path} is a symbolic link") from None
        raise
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               f"a file with {st.st_nlink} links" if st.st_nlink != 1 else
               "owned by another user" if st.st_uid != os.geteuid() else None)
    if problem is not None:
        os.close(fd)
        raise NotARing(f"{path} is {problem}")
    return fd


def set_aside(path: Path) -> Path | None:
    target = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.rename(path, target)
    except OSError:
        return None
    return target


class RingFile:
    """The ring open for writing. Not thread-safe: one writer (the recorder's thread) uses it."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size  # of the data area
        self.fd = -1
        self.pos = 0
        self.seq = 0
        self.dirty = False
        self.carried = 0  # records carried over from a ring of another size

    def open(self) -> list[Record]:
        """Open (or make) the ring and find where to go on; the records it already held, oldest first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = _safe_open(self.path)
        except NotARing:
            set_aside(self.path)
            fd = _safe_open(self.path)
        raw = _read_all(fd)
        size = data_size_of(raw[:HEADER_SIZE])
        frames = list(scan_frames(_data_area(raw))) if raw else []
        if size != self.size or len(raw) != HEADER_SIZE + self.size:
            os.close(fd)
            fd = self._remake(frames)
            frames = list(scan_frames(_read_all_at(fd, HEADER_SIZE, self.size)))
        self.fd = fd
        newest = max(frames, key=lambda f: f.seq, default=None)
        self.seq = newest.seq if newest is not None else 0
        self.pos = newest.end if newest is not None else 0
        return records_of(frames)

    def _remake(self, frames: list[Frame]) -> int:
        """A fresh ring of the configured size beside the old one, holding the newest frames that fit, then renamed
        over it: a resized ring keeps its evidence."""
        keep, used = [], 0
        for f in sorted(frames, key=lambda f: f.seq, reverse=True):
            size = f.end - f.offset
            if used + size > self.size:
                break
            keep.append(f)
            used += size
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            body = b"".join(frame(f.seq, f.payload) for f in reversed(keep))
            os.pwrite(fd, header(self.size), 0)
            zeros = bytes(_ZERO_CHUNK)
            for at in range(0, self.size, _ZERO_CHUNK):
                os.pwrite(fd, zeros[:min(_ZERO_CHUNK, self.size - at)], HEADER_SIZE + at)
            os.pwrite(fd, body, HEADER_SIZE)
            os.fsync(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.carried = len(keep)
        return fd

    def append(self, payload: bytes) -> int:
        """Write one record; its sequence number. Raises OSError (the caller keeps going)."""
        self.seq += 1
        data = frame(self.seq, payload)
        if self.pos + len(data) > self.size:
            self.pos = 0
        os.pwrite(self.fd, data, HEADER_SIZE + self.pos)
        self.pos += len(data)
        self.dirty = True
        return self.seq

    def sync(self) -> None:
        if self.dirty:
            os.fdatasync(self.fd)
            self.dirty = False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_all_at(fd: int, offset: int, size: int) -> bytes:
    return os.pread(fd, size, offset)
