"""Normalising raw vLLM log lines before anything matches against them.

One raw line, as read from `docker logs` or a pipe, may carry three kinds of decoration that the
matchers in `classify` and `progress` must not see:

- ANSI colour codes (vLLM colours its process prefix cyan, `\\033[0;36m(APIServer pid=7)\\033[0;0m `);
- the process prefix `decorate_logs()` puts on every line: `(APIServer pid=N) `, `(EngineCore_DP0 pid=N) `,
  `(Worker_TP1 pid=N) `; Ray adds `, ip=...` inside the parentheses, and under Ray's executor a line can carry
  several, one process's around another's (every one is removed; the first names the process);
- carriage returns: a tqdm bar redraws itself with `\\r`, so one "line" can hold many frames of which only the
  last is current.

`clean()` returns the current frame without decoration; `segments()` returns every frame (the classifier scans
them all). `parse()` also splits off the vLLM header `INFO 11-26 01:23:45 [file.py:123] `.

Pure functions; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# CSI sequences (colours, cursor moves tqdm may emit) and the two-byte ESC forms.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

# `(APIServer pid=123) `, `(Worker_TP0 pid=5) `, `(RayWorkerWrapper pid=9, ip=10.0.0.2) `.
_PREFIX = re.compile(r"^\s*\((?P<process>[A-Za-z_][\w.\-]*) pid=(?P<pid>\d{1,18})(?:, ip=[^)]*)?\)[ \t]?")

# vLLM's format: "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s", datefmt "%m-%d %H:%M:%S"; before
# 0.6 the file had no opening bracket ("ERROR 03-05 07:15:39 engine.py:387] ..."); builds that log through their own
# copy of the format put the year in front (NVIDIA NIM: "ERROR 2025-07-21 14:34:24.934 factory.py:62] ...").
# A paste (or a copy begun inside the line) may cut the level word's first letters (`RROR 12-18 19:47:34
# engine.py:366] ValueError: ...`): two or more of its last letters, before the date, the time and the source, are
# that level (`header_level`); none of them ends two levels.
_CUT_LEVELS = {word[i:]: word for word in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
               for i in range(1, len(word) - 1)}
VLLM_HEADER = re.compile(
    r"^(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)|(?P<cut>" + "|".join(sorted(_CUT_LEVELS, key=len, reverse=True))
    + r")) (?P<time>(?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[?(?P<source>[^\[\]\s]+)\](?: |$)"
)


def header_level(m: re.Match[str]) -> str:
    """The level of a :data:`VLLM_HEADER` match, whole where a paste cut it."""
    return m.group("level") or _CUT_LEVELS[m.group("cut")]


@dataclass(frozen=True)
class LogLine:
    """One log line with its decoration taken apart."""

    text: str  # the current frame, without colour or process prefix
    process: str | None  # e.g. "APIServer", "Worker_TP1"; None when undecorated
    pid: int | None
    level: str | None  # vLLM's levelname when the line has vLLM's header
    source: str | None  # "file.py:123" from vLLM's header
    message: str  # text after vLLM's header (== text when there is no header)


def strip_ansi(raw: str) -> str:
    return _ANSI.sub("", raw)


def _strip_prefix(s: str) -> tuple[str, str | None, int | None]:
    """`s` without the process prefixes in front of it (a launcher's around vLLM's: Ray's engine core, then its worker
    actor, then the worker's own), and the first's process and pid."""
    m = _PREFIX.match(s)
    if m is None:
        return s, None, None
    rest = s[m.end() :]
    while (inner := _PREFIX.match(rest)) is not None:
        rest = rest[inner.end() :]
    return rest, m.group("process"), int(m.group("pid"))


def _frames(raw: str) -> tuple[tuple[str, ...], str | None, int | None]:
    s = strip_ansi(raw).rstrip("\r\n")
    s, process, pid = _strip_prefix(s)
    frames: list[str] = []
    for part in s.split("\r"):
        part, p2, pid2 = _strip_prefix(part)
        if process is None and p2 is not None:
            process, pid = p2, pid2
        part = part.rstrip()
        if part.strip():
            frames.append(part)
    return tuple(frames), process, pid


def segments_of(raw: str) -> tuple[tuple[str, ...], str | None]:
    """(every non-blank frame of a raw line, undecorated, oldest first; the process its prefix names, if any)."""
    frames, process, _ = _frames(raw)
    return frames, process


def segments_of_process(raw: str) -> tuple[tuple[str, ...], str | None, int | None]:
    """(every non-blank frame of a raw line, undecorated, oldest first; the process and pid its prefix names)."""
    return _frames(raw)


def segments(raw: str) -> tuple[str, ...]:
    """Every non-blank `\\r`-separated frame of a raw line, undecorated, oldest first."""
    return _frames(raw)[0]


def clean(raw: str) -> str:
    """The current (last) frame of a raw line, undecorated; "" for a blank line."""
    frames = _frames(raw)[0]
    return frames[-1] if frames else ""


def parse(raw: str) -> LogLine:
    frames, process, pid = _frames(raw)
    text = frames[-1] if frames else ""
    m = VLLM_HEADER.match(text)
    if m is None:
        return LogLine(text=text, process=process, pid=pid, level=None, source=None, message=text)
    return LogLine(
        text=text,
        process=process,
        pid=pid,
        level=header_level(m),
        source=m.group("source"),
        message=text[m.end() :],
    )
