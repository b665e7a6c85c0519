"""vLLM's log line format, its per-process prefixes, tqdm progress lines and torch's C++ warning lines.

- vLLM's logger writes ``LEVEL MM-DD HH:MM:SS [file.py:line] message`` to stdout. A multi-line message (a
  traceback) repeats the header on every line, joined by ``\\r\\n`` (vLLM's NewLineFormatter).
- ``decorate_logs(name, dialect)`` patches sys.stdout/sys.stderr so every line gets ``(name pid=N) ``, as vLLM's
  decorate_logs does: 0.13 wraps the prefix the stream already has (so a forked child logs under its parent's
  name too), 0.21+ replaces it. vLLM forks its EngineCore and workers unless VLLM_WORKER_MULTIPROC_METHOD=spawn;
  the stand-in always spawns, and a child that vLLM would have forked starts with its parent's prefix
  (``inherit_parent_prefix``), passed down in the environment. Lines written straight to fd 2 (torch's C++
  warnings) are not decorated, as in vLLM.
- tqdm bars go to stderr as ``\\r`` + bar + ``\\n``.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from sparkd_standin.dialect import Dialect

CYAN = "\033[0;36m"
RESET = "\033[0;0m"
VLLM_DIR = "/usr/local/lib/python3.12/dist-packages/vllm"

_write_lock = threading.RLock()
_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


def _min_level() -> int:
    return _LEVELS.get(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(), 20)


FORK_PREFIX_ENV = "_SPARKD_STANDIN_FORK_PREFIX"  # the prefix a forked child would have inherited
FORK_RECORDS_ENV = "_SPARKD_STANDIN_FORK_RECORDS_ONLY"  # "1": that prefix goes on vLLM's own records only (0.32)
_current = {"prefix": "", "records_only": ""}


def forks() -> bool:
    """vLLM's default start method for its EngineCore and workers is fork."""
    return os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork") != "spawn"


def _colour(dialect: Dialect) -> bool:
    if os.environ.get("NO_COLOR", "0") != "0":
        return False
    if not dialect.modern:
        return True
    setting = os.environ.get("VLLM_LOGGING_COLOR", "")
    return setting == "1" or (setting != "0" and sys.stdout.isatty())


def _prefixed(original: Callable[[str], object]) -> Callable[[str], int]:
    state = {"new_line": True}

    def write_with_prefix(text: str) -> int:
        if not text:
            return 0
        with _write_lock:
            pieces, start = [], 0
            while start < len(text):
                end = text.find("\n", start)
                chunk = text[start:] if end == -1 else text[start : end + 1]
                if state["new_line"]:
                    pieces.append(_current["prefix"])
                pieces.append(chunk)
                state["new_line"] = chunk.endswith("\n")
                start += len(chunk)
            original("".join(pieces))
        return len(text)

    return write_with_prefix


def _install(prefix: str, *, streams: bool = True) -> None:
    """Every line this process writes to stdout and stderr starts with ``prefix`` (replacing any earlier one); with
    ``streams`` False (0.32) only vLLM's own log records do (``log`` puts it there)."""
    _current["prefix"] = prefix
    _current["records_only"] = "" if streams else "1"
    os.environ[FORK_PREFIX_ENV] = prefix
    os.environ[FORK_RECORDS_ENV] = _current["records_only"]
    if not streams:
        return
    for stream in (sys.stdout, sys.stderr):
        if not hasattr(stream, "_standin_original_write"):
            original = stream.write
            setattr(stream, "_standin_original_write", original)  # noqa: B010 (a TextIO has no such attribute)
            stream.write = _prefixed(original)  # type: ignore[method-assign]


def decorate_logs(name: str, dialect: Dialect) -> None:
    """``(name pid=N) `` before every line: after the inherited prefix in 0.13, instead of it in 0.21+."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    pid = os.getpid()
    own = f"{CYAN}({name} pid={pid}){RESET} " if _colour(dialect) else f"({name} pid={pid}) "
    _install(_current["prefix"] + own if dialect.stacks_prefixes else own, streams=dialect.decorates_streams)


def inherit_parent_prefix() -> None:
    """First thing in a child vLLM would have forked: the parent's prefix until the child decorates its own."""
    inherited = os.environ.get(FORK_PREFIX_ENV, "")
    if forks() and inherited and os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0":
        _install(inherited, streams=os.environ.get(FORK_RECORDS_ENV, "") != "1")
    else:
        _current["prefix"], _current["records_only"] = "", ""
        os.environ.pop(FORK_PREFIX_ENV, None)
        os.environ.pop(FORK_RECORDS_ENV, None)


def _emit(stream: TextIO, text: str) -> None:
    with _write_lock:
        stream.write(text)
        stream.flush()


def log(level: str, where: str, message: str) -> None:
    """One vLLM log record on stdout. ``where`` is ``file.py:line``."""
    if _LEVELS[level] < _min_level():
        return
    header = f"{os.environ.get('VLLM_LOGGING_PREFIX', '')}{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] "
    if _current["records_only"]:
        header = _current["prefix"] + header
    _emit(sys.stdout, header + message.replace("\n", "\r\n" + header) + "\n")


def info(where: str, message: str) -> None:
    log("INFO", where, message)


def warning(where: str, message: str) -> None:
    log("WARNING", where, message)


def error(where: str, message: str) -> None:
    log("ERROR", where, message)


def debug(where: str, message: str) -> None:
    log("DEBUG", where, message)


def exception(where: str, message: str, traceback: str) -> None:
    """``logger.exception``: the message then the traceback, every line carrying the header."""
    log("ERROR", where, f"{message}\n{traceback}")


def traceback_text(frames: Sequence[tuple[str, int, str, str]], exc_line: str) -> str:
    """A Python traceback with the given (file, line, function, code) frames ending in ``exc_line``."""
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        file = path if path.startswith("/") else f"{VLLM_DIR}/{path}"
        lines.append(f'  File "{file}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    lines.append(exc_line)
    return "\n".join(lines)


def print_stderr(text: str) -> None:
    """Text on (decorated) stderr, as Python prints an uncaught traceback."""
    _emit(sys.stderr, text if text.endswith("\n") else text + "\n")


def progress(text: str) -> None:
    """One tqdm update on stderr."""
    _emit(sys.stderr, "\r" + text + "\n")


def torch_warning(where: str, message: str, rank: int | None = None) -> None:
    """A c10d/ProcessGroupNCCL ``TORCH_WARN`` line, written by C++ straight to fd 2 (no process prefix)."""
    now = datetime.datetime.now()
    stamp = now.strftime("%m%d %H:%M:%S") + f".{now.microsecond * 1000:09d}"
    rank_prefix = f"[rank{rank}]:" if rank is not None else ""
    with _write_lock:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, f"{rank_prefix}[W{stamp} {where}] {message}\n".encode())


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"
