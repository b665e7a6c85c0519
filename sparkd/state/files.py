"""Small JSON files the daemon keeps current, crash-only: validated on read, never fatal on write.

Rules (issue 16):
- A write goes to ``.<name>.<pid>.<random>.tmp`` in the same folder (created ``O_EXCL|O_NOFOLLOW``, its mode set
  on the descriptor: :mod:`sparkd.host.safefile`), is fsynced, then renamed over the file, so a reader never sees a
  torn file and no link or FIFO put in its way is written through. A write that fails (disk full, read-only, a
  directory in the way that cannot be set aside) never raises: it returns a :class:`WriteResult` naming the path
  and the reason, removes its temp file, and is logged once per episode (the first failure, then the recovery),
  not once per attempt.
- A read validates the file against its :class:`~sparkd.state.schema.Schema`. A bad one (not JSON, not UTF-8,
  the wrong shape, a directory, unreadable) is logged by name, set aside as ``<name>.bad-<UTC stamp>`` (never
  deleted: it is evidence) and treated as absent. A missing file is simply absent.
- Temp files left by a process that died mid-write (``.<name>.<pid>[.<random>].tmp`` of a PID that no longer
  runs, or of our own PID) are removed by the next write.
- Floats that JSON cannot hold (NaN, ±inf) are written as null, so the file always parses.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sparkd.host.safefile import replace_file
from sparkd.state.schema import BadShape, Schema

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(frozen=True)
class WriteResult:
    ok: bool
    problem: str | None = None  # with ok False: a sentence naming the path and the reason
    started: bool = False  # this failure began an episode (it was logged)
    recovered: bool = False  # this success ended an episode (it was logged)


def utc_stamp(at: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))


def _default_logger() -> Any:
    from sparkd.host.logs import get_logger

    return get_logger(component="statefile")


class StateFile(Generic[T]):
    """One state file of a known shape. ``parse`` turns the validated object into ``T``; ``dump`` back."""

    def __init__(self, path: Path, schema: Schema, *, parse: Callable[[dict[str, Any]], T],
                 dump: Callable[[T], dict[str, Any]], log: Logger | None = None, clock: Clock = time.time) -> None:
        self.path = path
        self.schema = schema
        self.parse = parse
        self.dump = dump
        self.clock = clock
        self._log = log
        self._problem: str | None = None
        self._failed_since: float | None = None
        self._failures = 0
        self.set_aside: list[Path] = []  # every bad file this object moved away, oldest first

    @property
    def log(self) -> Any:
        if self._log is None:
            self._log = _default_logger()
        return self._log

    @property
    def healthy(self) -> bool:
        """False from a failed write until a write succeeds again."""
        return self._problem is None

    @property
    def problem(self) -> str | None:
        return self._problem

    # ---- reading

    def read(self) -> T | None:
        """The file's content, or None when it is missing or bad (a bad file is set aside and logged)."""
        try:
            return self.parse(self._load())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            self._set_aside_bad(_reason(exc))
            return None

    def peek(self) -> T | None:
        """Like :meth:`read` but changes nothing (for readers that do not own the file: ``sparkd preflight``)."""
        try:
            return self.parse(self._load())
        except (OSError, ValueError, TypeError):
            return None

    def _load(self) -> dict[str, Any]:
        return self.schema.validate(json.loads(read_regular(self.path).decode("utf-8")))

    def _set_aside_bad(self, reason: str) -> None:
        moved = set_aside(self.path, self.clock())
        if moved is not None:
            self.set_aside.append(moved)
        self.log.warning("state_file_bad", path=str(self.path), reason=reason,
                         set_aside=str(moved) if moved else None,
                         **({} if moved else {"note": "could not be moved aside; ignored"}))

    # ---- writing

    def write(self, data: T) -> WriteResult:
        """Write ``data`` atomically. Never raises; see :class:`WriteResult`."""
        try:
            record = self.dump(data)
            self.schema.validate(record)
            text = to_json(record)
        except (BadShape, TypeError, ValueError) as exc:
            return self._failed(f"sparkd refused to write {self.path}: {exc}")
        for attempt in range(2):
            try:
                replace_atomically(self.path, text)
            except IsADirectoryError:
                moved = set_aside(self.path, self.clock()) if attempt == 0 else None
                if moved is None:
                    return self._failed(f"cannot write {self.path}: a directory is in the way")
                self.set_aside.append(moved)
                self.log.warning("state_file_bad", path=str(self.path), reason="a directory was in the way",
                                 set_aside=str(moved))
            except OSError as exc:
                return self._failed(f"cannot write {self.path}: {exc.strerror or exc}")
            else:
                return self._succeeded()
        return self._failed(f"cannot write {self.path}: a directory is in the way")

    def remove(self) -> WriteResult:
        """Remove the file (absent afterwards counts as success). Never raises."""
        try:
            self.path.unlink(missing_ok=True)
        except IsADirectoryError:
            if set_aside(self.path, self.clock()) is None:
                return self._failed(f"cannot remove {self.path}: it is a directory")
        except OSError as exc:
            return self._failed(f"cannot remove {self.path}: {exc.strerror or exc}")
        return self._succeeded()

    def _failed(self, problem: str) -> WriteResult:
        self._failures += 1
        started = self._problem is None
        self._problem = problem
        if started:
            self._failed_since = self.clock()
            self.log.error("state_write_failed", path=str(self.path), reason=problem)
        return WriteResult(ok=False, problem=problem, started=started)

    def _succeeded(self) -> WriteResult:
        if self._problem is None:
            return WriteResult(ok=True)
        since = self._failed_since or self.clock()
        self.log.info("state_write_recovered", path=str(self.path), failed_writes=self._failures,
                      failing_for_s=round(self.clock() - since, 1), last_reason=self._problem)
        self._problem, self._failed_since, self._failures = None, None, 0
        return WriteResult(ok=True, recovered=True)


def json_state(path: Path, schema: Schema, *, log: Logger | None = None, clock: Clock = time.time
               ) -> StateFile[dict[str, Any]]:
    """A state file read and written as a plain validated dict."""
    return StateFile(path, schema, parse=dict, dump=dict, log=log, clock=clock)


# ---- the file operations


def set_aside(path: Path, at: float) -> Path | None:
    """Rename a bad ``path`` to ``<name>.bad-<UTC stamp>`` (``-N`` added on a clash); None when it cannot."""
    stamp = utc_stamp(at)
    for n in range(100):
        target = path.with_name(f"{path.name}.bad-{stamp}" + (f"-{n}" if n else ""))
        if target.exists() or target.is_symlink():
            continue
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return None
        except OSError:
            return None
        return target
    return None


MAX_READ = 4 << 20  # no state file is near this; a bigger one is garbage


class NotRegular(OSError):
    """The path is a directory, FIFO, device or socket: never a state file (and a FIFO would block a read)."""


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (at most MAX_READ + 1). Raises FileNotFoundError, NotRegular,
    OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotRegular(f"it is {kind}")
        chunks, total = [], 0
        while total <= MAX_READ:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_READ:
        raise NotRegular(f"it is larger than {MAX_READ} bytes")
    return b"".join(chunks)


def to_json(data: Any) -> str:
    """Strict JSON (no NaN/Infinity: those become null), indented, with a final newline."""
    try:
        text = json.dumps(data, indent=2, sort_keys=True, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), indent=2, sort_keys=True, default=str, allow_nan=False)
    return text + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def replace_atomically(path: Path, text: str, mode: int = 0o640) -> None:
    """Temp file of a random name beside ``path``, fsync, rename. The temp file never outlives a failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path)
    replace_file(path, text.encode("utf-8"), mode)


def remove_dead_temps(path: Path) -> list[Path]:
    """Remove ``.<name>.<pid>[.<random>].tmp`` beside ``path`` left by a writer that no longer runs."""
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d+)(?:\.[0-9a-f]+)?\.tmp")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and _pid_alive(pid):
            continue  # a live writer's: not ours to touch
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, NotRegular):
        return str(exc)
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"it is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, OSError):
        return f"it cannot be read: {exc.strerror or exc}"
    return str(exc)


# ---- the plain functions the daemon used before StateFile (kept for its current callers)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename). Raises OSError."""
    replace_atomically(path, to_json(data))


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when missing or unreadable (a torn file is never left behind)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
