"""Logging: sparkd's own structured events (structlog), and the host copy of vLLM's output.

sparkd's events go to stderr, one JSON object per line, or readable console lines (``[log] format``: ``auto``
picks console on a terminal). Under systemd, stderr is the journal (:mod:`sparkd.host.journal`): each line then
carries a ``<N>`` syslog priority, so ``journalctl -p warning -u sparkd`` shows warnings and errors only.
Foreign loggers (the control API's ``sparkd.api``, docker, httpx, asyncio) are rendered the same way. ``[log] level``
filters both. Every event and every rendered line passes the daemon's redactor (:mod:`sparkd.launch.redact`): no
secret reaches the journal.

vLLM's lines go to ``<logs>/vllm.log`` (rotated by size), a ring buffer for incidents, ``sparkctl logs`` and
the classifier, and optionally the journal under its own identifier (``[log] vllm_to_journal``). Rules of
:class:`VllmLog`:

1. It never raises into the daemon. A write that fails (disk full, read-only, the path a directory) is logged
   once per episode, lines are counted as lost, and the file is retried every ``retry_s``; the first write
   that works again is logged with the count. ``write_error`` says what is wrong meanwhile.
2. A line longer than ``Ring.max_line`` characters is cut (the file, the ring and the journal get the cut line with
   a note of how much was cut): one 64 MB line neither stays resident nor blows the rotation size.
3. The ring keeps at most ``Ring.lines`` lines and ``Ring.bytes`` bytes.
4. A listener that raises is dropped (and logged), not propagated.
5. The access-log lines of sparkd's own probes (``?probe=sparkd``, :mod:`sparkd.supervisor.probelines`) are left
   out — of the file, the ring, the listeners and the journal — unless ``[log] probe_requests``; they are counted.
6. Lines the journal cannot take at once wait in its sink's backlog (:class:`~sparkd.host.journal.JournalSink`);
   :meth:`VllmLog.feed_journal` sends them as it takes them, and at rest neither wakes nor holds anything. At the
   daemon's exit :meth:`VllmLog.close_journal` offers what still waits for a second more before it is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import anyio
import structlog

from sparkd.host.journal import JOURNAL_SOCKET, PRIORITY, JournalSink, stderr_is_journal
from sparkd.host.safefile import open_append
from sparkd.launch.redact import log_processor, redact_line
from sparkd.supervisor.probelines import is_probe_line

if TYPE_CHECKING:
    from sparkd.config import Config, LogConfig

__all__ = ["VllmLog", "configure_logging", "get_logger"]

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class _Render:
    """The final processor: render the event, then prefix every line with its syslog priority when stderr is
    the journal (a multi-line console traceback keeps its priority on each line)."""

    def __init__(self, renderer: Any, journal: bool) -> None:
        self.renderer = renderer
        self.journal = journal

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        level = str(event.get("level", method)).lower()
        text = redact_line(str(self.renderer(logger, method, event)))
        if not self.journal:
            return text
        priority = PRIORITY.get(level, PRIORITY["info"])
        return "\n".join(f"<{priority}>{line}" for line in text.split("\n"))


RESERVED = ("level", "timestamp")  # written by the pipeline itself (add_log_level, TimeStamper)


def keep_fields(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """An event's own ``level`` or ``timestamp`` (the guard's level, a sample's time) is kept as
    ``<key>_field`` instead of being overwritten by the log line's level and time."""
    for key in RESERVED:
        if key in event:
            event[f"{key}_field"] = event.pop(key)
    return event


def configure_logging(cfg: LogConfig | None = None, *, json_lines: bool | None = None, level: int | str | None = None,
                      stream: TextIO | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Set up sparkd's logging from ``[log]`` (format, level); ``json_lines``/``level`` override it. Safe to
    call again (a reload applies a new level at once)."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    fmt = cfg.format.value if cfg is not None else "auto"
    if json_lines is None:
        json_lines = fmt == "json" or (fmt == "auto" and not _isatty(stream))
    if level is None:
        level = cfg.level.value if cfg is not None else "info"
    numeric = LEVELS[level.lower()] if isinstance(level, str) else level
    renderer: Any = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(
        colors=_isatty(stream))
    final = _Render(renderer, stderr_is_journal(stream, environ))
    shared: list[Any] = [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True)]
    exc: list[Any] = [structlog.processors.format_exc_info] if json_lines else []
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, keep_fields, *shared, *exc, log_processor, final],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    _bridge_stdlib(stream, [*shared, *exc], final, max(numeric, logging.WARNING))


def _bridge_stdlib(stream: TextIO, pre_chain: list[Any], final: _Render, level: int) -> None:
    """Render records of stdlib loggers (``sparkd.api``, docker, httpx, asyncio) like sparkd's own lines."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=pre_chain,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, final],
    ))
    handler.set_name("sparkd")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "sparkd"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Logger(Protocol):
    """sparkd's structured logger as its parts use it (structlog's bound logger, or a test's recorder): an event
    name and its fields, at a level; ``bind`` adds fields to every later event."""

    def bind(self, **fields: Any) -> Logger: ...

    def debug(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...

    def error(self, event: str, **fields: Any) -> Any: ...

    def exception(self, event: str, **fields: Any) -> Any: ...


def get_logger(**bound: Any) -> Logger:
    logger: Logger = structlog.get_logger("sparkd").bind(**bound)
    return logger


KIB = 1024


@dataclass(frozen=True)
class Rotation:
    """``vllm.log`` is rotated past ``max_bytes``, ``backups`` older files kept (``[supervisor] log_*``)."""

    max_bytes: int
    backups: int


@dataclass(frozen=True)
class Ring:
    """The last lines kept in memory: at most ``lines`` of them and ``bytes`` bytes, a line cut past ``max_line``
    characters (rules 2 and 3)."""

    lines: int = 2000
    bytes: int = 4 * KIB**2
    max_line: int = 64 * KIB


def _rotation(cfg: Config) -> Rotation:
    return Rotation(cfg.supervisor.log_max_bytes, cfg.supervisor.log_backups)


class VllmLog:
    """vLLM's output on the host: an append-only file rotated by size, the last lines in memory, and
    optionally the journal. Never raises (module docstring, rules 1-4)."""

    def __init__(self, path: Path, rotation: Rotation, *, ring: Ring = Ring(), journal: JournalSink | None = None,
                 retry_s: float = 5.0, probe_requests: bool = False, clock: Callable[[], float] = time.monotonic,
                 log: Logger | None = None) -> None:
        self.path = path
        self.rotation: Callable[[], Rotation] = lambda: rotation  # read at every write
        self.ring_bytes = ring.bytes
        self.max_line = ring.max_line
        self.journal = journal
        self.retry_s = retry_s
        self.probe_requests: Callable[[], bool] = lambda: probe_requests  # read at every line
        self.probe_lines = 0  # access-log lines of sparkd's own probes left out
        self.clock = clock
        self.log = log if log is not None else get_logger(component="vllm_log")
        self.tail: deque[str] = deque(maxlen=ring.lines)
        self._sizes: deque[int] = deque(maxlen=ring.lines)  # bytes of each line in `tail`
        self._times: deque[float] = deque(maxlen=ring.lines)  # when each line in `tail` came (wall clock)
        self._tail_bytes = 0
        self._handle: TextIO | None = None
        self._size = 0
        self._listeners: list[Callable[[str], None]] = []
        self.write_error: str | None = None  # set while writes to `path` fail
        self.lost_lines = 0  # lines not written during the current failure episode
        self._retry_at = 0.0
        self._journal_failing = False
        self._journal_dropped = 0
        self._journal_waits: anyio.Event | None = None  # set while lines wait for the journal (feed_journal runs)

    @classmethod
    def following(cls, config: Callable[[], Config]) -> VllmLog:
        """The daemon's vLLM log: ``<logs>/vllm.log``, rotated and with the probes' lines kept or not as the config
        in force says (a reload applies from the next line); the journal as ``SYSLOG_IDENTIFIER=vllm`` when
        ``[log] vllm_to_journal`` is on at the start and the journal runs."""
        cfg = config()
        journal = None
        if cfg.log.vllm_to_journal and JOURNAL_SOCKET.exists():
            journal = JournalSink("vllm", extra={"SPARKD_NODE": cfg.node.name})
        log = cls(cfg.paths.logs / "vllm.log", _rotation(cfg), journal=journal)
        log.rotation = lambda: _rotation(config())
        log.probe_requests = lambda: config().log.probe_requests
        return log

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._unsubscribe(listener)

    def _unsubscribe(self, listener: Callable[[str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def append(self, line: str, *, persist: bool = True) -> None:
        if not self.probe_requests() and is_probe_line(line):
            self.probe_lines += 1  # sparkd's own probe in uvicorn's access log: not vLLM's story (rule 5)
            return
        line = self._cut(line)
        data = line + "\n"
        size = len(data.encode("utf-8", "replace"))
        self._remember(line, size)
        for listener in list(self._listeners):
            try:
                listener(line)
            except Exception as exc:
                self._unsubscribe(listener)
                self.log.warning("vllm_log_listener_dropped", error=f"{type(exc).__name__}: {exc}")
        if self.journal is not None:
            self._to_journal(line)
        if persist:
            self._persist(data, size)

    def _cut(self, line: str) -> str:
        if len(line) <= self.max_line:
            return line
        return line[: self.max_line] + f" [sparkd: {len(line) - self.max_line} more characters cut]"

    def _remember(self, line: str, size: int) -> None:
        if len(self.tail) == self.tail.maxlen:
            self._tail_bytes -= self._sizes[0]  # the deques drop their oldest on append
        self.tail.append(line)
        self._sizes.append(size)
        self._times.append(time.time())
        self._tail_bytes += size
        while self._tail_bytes > self.ring_bytes and len(self.tail) > 1:
            self.tail.popleft()
            self._times.popleft()
            self._tail_bytes -= self._sizes.popleft()

    def _to_journal(self, line: str) -> None:
        assert self.journal is not None
        self._journal_answered(self.journal.send(line))

    def _journal_answered(self, ok: bool) -> None:
        """After a send or a flush: the journal's failures and drops logged once an episode; the feeder woken while
        lines wait."""
        assert self.journal is not None
        failing = not ok or self.journal.dropped > self._journal_dropped
        self._journal_dropped = self.journal.dropped
        if failing and not self._journal_failing:
            self.log.warning("vllm_journal_failed", error=self.journal.last_error or "its queue stayed full",
                             dropped=self.journal.dropped)
        elif not failing and self._journal_failing:
            self.log.info("vllm_journal_recovered", dropped=self.journal.dropped)
        self._journal_failing = failing
        if self.journal.pending and self._journal_waits is not None:
            self._journal_waits.set()

    async def feed_journal(self, every_s: float = 0.05, most_s: float = 1.0) -> None:
        """While lines wait for the journal, offer them until it has taken them all: every ``every_s`` while it
        takes some, less often (to ``most_s``) while it takes none (rule 6)."""
        if self.journal is None:
            return
        while True:
            self._journal_waits = anyio.Event()
            if not self.journal.pending:
                await self._journal_waits.wait()
            delay = every_s
            while self.journal.pending:
                await anyio.sleep(delay)
                before = self.journal.sent
                self._journal_answered(self.journal.flush())
                delay = every_s if self.journal.sent > before else min(delay * 2, most_s)

    async def close_journal(self, within_s: float = 1.0, every_s: float = 0.05) -> None:
        """At the daemon's exit: what still waits for the journal (vLLM's last lines, a stop's story) is offered for
        up to ``within_s``; what it would not take is dropped, counted and logged, and the sink closed (rule 6)."""
        journal = self.journal
        if journal is None:
            return
        with anyio.move_on_after(within_s):
            while journal.pending and journal.flush() and journal.pending:
                await anyio.sleep(every_s)
        left = journal.pending
        journal.close()
        if left:
            self.log.warning("vllm_journal_left", lines=left, dropped=journal.dropped)

    def _persist(self, data: str, size: int) -> None:
        now = self.clock()
        if self.write_error is not None and now < self._retry_at:
            self.lost_lines += 1
            return
        try:
            self._write(data, size)
        except (OSError, ValueError) as exc:
            self._failed(exc, now)
            return
        if self.write_error is not None:
            self.log.info("vllm_log_write_recovered", path=str(self.path), lost_lines=self.lost_lines)
            self.write_error, self.lost_lines = None, 0

    def _write(self, data: str, size: int) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Never through a link or into a FIFO planted as vllm.log (security review §3): O_NOFOLLOW, regular only.
            self._handle = os.fdopen(open_append(self.path), "a", encoding="utf-8", errors="replace")
            self._size = self._handle.tell()
        self._handle.write(data)
        self._handle.flush()
        self._size += size
        if self._size >= self.rotation().max_bytes:
            self._rotate()

    def _failed(self, exc: Exception, now: float) -> None:
        self.close()
        self.lost_lines += 1
        self._retry_at = now + self.retry_s
        if self.write_error is None:
            self.write_error = f"{self.path}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            self.log.warning("vllm_log_write_failed", path=str(self.path), error=self.write_error,
                             retry_s=self.retry_s)

    def _rotate(self) -> None:
        self.close()
        backups = self.rotation().backups
        if backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for n in range(backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))

    def last(self, n: int) -> list[str]:
        """The last ``n`` lines (none for ``n <= 0``)."""
        return list(self.tail)[-n:] if n > 0 else []

    def entries(self, n: int, since: float | None = None) -> list[tuple[float, str]]:
        """The last ``n`` lines with the wall time each came, only those since ``since`` when given."""
        pairs = [(t, line) for t, line in zip(self._times, self.tail, strict=True) if since is None or t >= since]
        return pairs[-n:] if n > 0 else []

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError, ValueError):  # a flush into a full disk: already logged
                handle.close()
