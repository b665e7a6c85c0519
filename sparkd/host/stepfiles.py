"""Reading the step probe's files (issue 38): what each vLLM process of this node last recorded of its steps.

The files are written inside vLLM (the ``sparkd-vllm-probe`` plugin, :mod:`sparkd.vllm_probe`) in the directory
sparkd's launch gave it; their format is the plugin's own :mod:`~sparkd.vllm_probe.sparkd_vllm_probe.layout`, read
here through the same definition. They are vLLM's claims, read as untrusted input: only ``*.step`` names, opened
without following a link, a regular file of exactly 512 bytes, at most :data:`MAX_FILES` of them; a block that
changes while it is read is read again (a few times), a file that stays torn or is not a step file is a problem
named in the reading, never an exception.

:func:`read_steps` takes one reading of a directory with this node's monotonic clock; :func:`host_pid` finds the
process a record speaks for as sparkd sees it (a container's PID namespace is not sparkd's), so that a record of a
process that is gone is told from a live one; :func:`process_state` is that process's state letter (``T``: stopped,
``D``: in the kernel's uninterruptible sleep), which the verdicts name.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sparkd.vllm_probe.sparkd_vllm_probe import layout
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord, Torn

__all__ = ["MAX_FILES", "StepReading", "host_pid", "process_stat", "process_state", "read_step_file",
           "read_steps"]

MAX_FILES = 64
TORN_RETRIES = 5


@dataclass(frozen=True)
class StepReading:
    """One node's step files at one instant: ``read_at_ns`` is that node's monotonic clock, the clock of every time
    in its records."""

    read_at_ns: int
    records: tuple[StepRecord, ...]
    problems: tuple[str, ...] = ()  # "name: why" for each file that could not be read


def read_step_file(path: Path) -> StepRecord:
    """One step file. Raises OSError (missing, not regular, the wrong size) or ValueError (not a step file, or torn
    on every retry)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != layout.SIZE:
            raise OSError(f"not a regular file of {layout.SIZE} bytes")

        def read(at: int, size: int) -> bytes:
            data = os.pread(fd, size, at)
            if len(data) != size:
                raise OSError(f"short read at {at}")
            return data

        header = read(0, layout.HEADER.size)
        identity = read(layout.IDENTITY_AT, layout.IDENTITY.size)
        texts = read(layout.TEXT_AT, layout.SIZE - layout.TEXT_AT)
        for _ in range(TORN_RETRIES):
            try:
                blocks = tuple(layout.read_block(read, at, form) for at, form in layout.BLOCKS)
                return layout.decode(header, identity, blocks, texts)
            except Torn:
                time.sleep(0.0001)
        raise ValueError(f"its step blocks kept changing while read ({TORN_RETRIES} tries)")
    finally:
        os.close(fd)


def read_steps(directory: Path, *, now_ns: Callable[[], int] = time.monotonic_ns) -> StepReading:
    """Every step file in ``directory`` (sorted by name), with the monotonic time of the reading. A missing
    directory reads as no files and one problem."""
    read_at = now_ns()
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(layout.SUFFIX))
    except OSError as exc:
        return StepReading(read_at, (), (f"{directory}: {exc.strerror or exc}",))
    problems = [f"{directory}: {len(names)} step files, only the first {MAX_FILES} read"
                ] if len(names) > MAX_FILES else []
    records = []
    for name in names[:MAX_FILES]:
        try:
            records.append(read_step_file(directory / name))
        except (OSError, ValueError) as exc:
            problems.append(f"{name}: {getattr(exc, 'strerror', None) or exc}")
    return StepReading(read_at, tuple(records), tuple(problems))


def _stat_fields(pid: int | str, proc: Path) -> tuple[int, str] | None:
    """(start time in ticks, the /proc/<pid>/status text) of a process, or None when it is gone."""
    seen = process_stat(pid, proc=proc)
    if seen is None:
        return None
    try:
        with open(f"{proc}/{pid}/status") as handle:
            return seen[0], handle.read()
    except OSError:
        return None


def host_pid(record: StepRecord, *, proc: Path = Path("/proc"), hint: int | None = None) -> int | None:
    """The PID, as sparkd sees it, of the process ``record`` speaks for; None when no such process runs. A process
    is the record's when its start time matches and the innermost PID of its ``NSpid`` line is the record's PID
    (the same PID namespace as sparkd: the PIDs are equal). ``hint``: a PID found before, checked first."""
    first = [p for p in dict.fromkeys((hint, record.pid)) if p]
    for pid in itertools.chain(first, _pids(proc)):  # /proc is listed only once neither of those is it
        fields = _stat_fields(pid, proc)
        if fields is None or (record.start_ticks and fields[0] != record.start_ticks):
            continue
        if _inner_pid(fields[1]) == record.pid:
            return pid
    return None


def _pids(proc: Path) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    yield from (int(n) for n in names if n.isdigit())


def _inner_pid(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            return int(parts[-1]) if parts else None
    return None


def process_state(pid: int, *, proc: Path = Path("/proc")) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (R, S, D, T, t, Z, ...); None when the process is gone."""
    fields = _stat(pid, proc)
    return fields[0].decode("ascii", "replace") if fields else None


def process_stat(pid: int | str, *, proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """(start time in ticks, state letter) of ``/proc/<pid>/stat``: one read tells a process found before (the
    same PID and start time) and its state; None when the process is gone."""
    fields = _stat(pid, proc)
    if fields is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19]), fields[0].decode("ascii", "replace")


def _stat(pid: int | str, proc: Path) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (its state first), or None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:  # strings, not pathlib: this runs every few seconds
            text = handle.read()
        return text[text.rindex(b")") + 2:].split() or None
    except (OSError, ValueError):
        return None
