"""systemd's journal, spoken directly: syslog priorities for sparkd's own lines, and vLLM's output as journal
entries of their own. No dependency: both protocols are a few lines.

Rules:

1. Priorities follow syslog (``sd-daemon.h``): debug 7, info 6, warning 4, error 3, critical 2.
2. sparkd's stderr is the journal when ``JOURNAL_STREAM`` (``device:inode``, set by systemd) names the file
   stderr is; only then does a line carry a ``<N>`` prefix, which journald (``SyslogLevelPrefix=``, on by
   default) turns into the entry's priority. A terminal or a pipe never sees the prefix.
3. vLLM's lines go to the journal's native socket (``/run/systemd/journal/socket``) with
   ``SYSLOG_IDENTIFIER=vllm``, a priority read from vLLM's own level word (``WARNING 01-02 ...``; a
   ``(EngineCore pid=N)`` prefix and colour codes allowed), else info. A field holding a newline uses the
   protocol's length-prefixed form. A line is cut at :data:`MAX_MESSAGE` bytes.
4. The sink never blocks and never raises. A burst the journal's socket cannot take at once (its queue is full:
   ``EAGAIN``; ``net.unix.max_dgram_qlen`` is 10 where systemd's sysctl did not raise it, as in a container) waits in
   a backlog of at most :data:`BACKLOG_BYTES`, in order, sent before the next line and by :meth:`JournalSink.flush`;
   a line the backlog cannot hold, or any line while the journal is absent, is dropped and counted.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

__all__ = ["BACKLOG_BYTES", "JOURNAL_SOCKET", "MAX_MESSAGE", "PRIORITY", "JournalSink", "encode_entry",
           "stderr_is_journal", "vllm_priority"]

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
MAX_MESSAGE = 48 * 1024  # journald's own LineMax default for stream lines
BACKLOG_BYTES = 1 << 20  # a start's burst of lines (vLLM's banner, config, shards) fits many times over
PRIORITY = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "warn": 4, "error": 3, "exception": 3,
            "critical": 2, "fatal": 2}
_VLLM_LEVEL = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?(?:\([^)]*\)\s*)?(?:\x1b\[[0-9;]*m)?\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_FIELD_NAME = re.compile(r"^[A-Z0-9][A-Z0-9_]*$")


def stderr_is_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """True when ``stream`` is the journal stream systemd connected (JOURNAL_STREAM = its device:inode)."""
    value = environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def vllm_priority(line: str) -> int:
    match = _VLLM_LEVEL.match(line)
    return PRIORITY[match.group(1).lower()] if match else PRIORITY["info"]


def encode_entry(fields: Mapping[str, str]) -> bytes:
    """One native-protocol datagram: ``NAME=value\\n``, or ``NAME\\n<u64 LE length>value\\n`` for a value
    with a newline. Names must be upper-case letters, digits and underscores."""
    parts: list[bytes] = []
    for name, value in fields.items():
        if not _FIELD_NAME.match(name):
            raise ValueError(f"{name!r} is not a journal field name")
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            parts.append(name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(name.encode() + b"=" + data + b"\n")
    return b"".join(parts)


class JournalSink:
    """Sends lines to the journal as entries of one identifier; holds back what the journal cannot take yet
    (rule 4), drops (and counts) what it cannot send at all."""

    def __init__(self, identifier: str, *, extra: Mapping[str, str] | None = None,
                 path: Path = JOURNAL_SOCKET, backlog_bytes: int = BACKLOG_BYTES) -> None:
        self.identifier = identifier
        self.extra = dict(extra or {})
        self.path = path
        self.backlog_bytes = backlog_bytes
        self.sent = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._sock: socket.socket | None = None
        self._backlog: deque[bytes] = deque()
        self._held = 0  # bytes in the backlog

    @property
    def pending(self) -> int:
        """Entries waiting for the journal to take them."""
        return len(self._backlog)

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            self._sock = sock
        return self._sock

    def send(self, line: str) -> bool:
        """Sends ``line`` after what waits, or holds it back; False when the journal is absent (it is dropped)."""
        message = line.encode("utf-8", "replace")[:MAX_MESSAGE].decode("utf-8", "ignore")
        entry = encode_entry({"MESSAGE": message, "PRIORITY": str(vllm_priority(line)),
                              "SYSLOG_IDENTIFIER": self.identifier, **self.extra})
        self._backlog.append(entry)
        self._held += len(entry)
        while self._held > self.backlog_bytes and len(self._backlog) > 1:
            self._held -= len(self._backlog.popleft())
            self.dropped += 1
        return self.flush()

    def flush(self) -> bool:
        """Sends what waits, in order, as far as the journal takes it now; False when the journal is absent (what
        waited is dropped)."""
        while self._backlog:
            try:
                self._socket().sendto(self._backlog[0], str(self.path))
            except BlockingIOError:
                return True  # its queue is full: the rest waits
            except OSError as exc:
                self.dropped += len(self._backlog)
                self._backlog.clear()
                self._held = 0
                self.last_error = f"{type(exc).__name__}: {exc}"
                return False
            self._held -= len(self._backlog.popleft())
            self.sent += 1
        self.last_error = None
        return True

    def close(self) -> None:
        """Sends what the journal takes now; what it does not is dropped (and counted)."""
        self.flush()
        self.dropped += len(self._backlog)
        self._backlog.clear()
        self._held = 0
        if self._sock is not None:
            self._sock.close()
            self._sock = None
