"""Faults switched on at run time, for a rank that is already serving (the soak's stall, hang and leak).

The launch knobs (``STALL_AFTER``, ``HANG_AFTER``, ``LEAK_MB_PER_S``) are read once, at launch, so every later
launch of the same config would repeat them. ``CONTROL_FILE`` names a file the stand-in's processes poll
instead; a test writes one command to it, and only the processes running at that moment act on it.

Rules:

- A command is one line ending in a newline: ``<id> stall``, ``<id> hang``, ``<id> leak MB_PER_S MAX_MB``, or what
  the engine answers from now on: ``<id> answers MODE`` (``sparkd_standin.answers.ANSWER_MODES``), ``<id> spec on|off``
  (the speculative decoder accepts, or not), ``<id> nans on|off`` (NaNs in the logits). Anything else is ignored (a
  partial write has no newline yet).
- What the file holds when a process starts was meant for an earlier launch: the process never acts on it.
  A process acts on each new ``id`` once.
- The process that acted on a command writes its id to ``<CONTROL_FILE>.done`` (a test waits for it before the next
  one: a command written over before a poll saw it would be lost).
- The head's API server takes ``stall``, ``hang``, ``answers``, ``spec`` and ``nans`` (as ``STALL_AFTER``,
  ``HANG_AFTER``, ``ANSWERS``, ``SPEC_DECODE_ACCEPTS`` and ``NAN_LOGITS`` do); every worker takes ``leak`` (as
  ``LEAK_MB_PER_S`` does). Each process ignores the commands that are not its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkd_standin.answers import ANSWER_MODES

POLL_S = 0.2
FAULTS = ("stall", "hang", "leak", "answers", "spec", "nans")
SWITCHES = ("on", "off")


@dataclass(frozen=True)
class Command:
    id: str
    fault: str  # one of FAULTS
    leak_mb_per_s: float = 0.0
    leak_max_mb: float = 0.0
    value: str = ""  # answers: the mode; spec, nans: on | off


def parse(text: str) -> Command | None:
    """The command in ``text``, or None when it holds none (empty, partial, or not a command)."""
    if not text.endswith("\n"):
        return None
    words = text.split()
    if len(words) < 2 or words[1] not in FAULTS:
        return None
    ident, fault, args = words[0], words[1], words[2:]
    if fault in ("answers", "spec", "nans"):
        allowed = ANSWER_MODES if fault == "answers" else SWITCHES
        return Command(ident, fault, value=args[0]) if len(args) == 1 and args[0] in allowed else None
    if fault != "leak":
        return Command(ident, fault) if not args else None
    try:
        rate, cap = (float(a) for a in args)
    except ValueError:
        return None
    return Command(ident, fault, rate, cap) if rate > 0 and cap > 0 else None


class ControlFile:
    """One process's view of the control file: the command there at its start is old, each new one is news."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        old = parse(self._read())
        self._seen = old.id if old is not None else None

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def poll(self) -> Command | None:
        """A command not seen before, once; None otherwise."""
        command = parse(self._read())
        if command is None or command.id == self._seen:
            return None
        self._seen = command.id
        return command

    def done(self, command: Command) -> None:
        """Say that ``command`` was acted on (``<file>.done`` holds its id)."""
        marker = self.path.with_name(self.path.name + ".done")
        try:
            partial = marker.with_name(marker.name + ".part")
            partial.write_text(f"{command.id}\n", encoding="utf-8")
            partial.replace(marker)
        except OSError:
            pass


def watch_in_thread(control: ControlFile, act: Callable[[Command], None], stop: threading.Event) -> None:
    """Poll ``control`` in a daemon thread until ``stop`` is set, calling ``act`` with each new command."""

    def loop() -> None:
        while not stop.wait(POLL_S):
            command = control.poll()
            if command is not None:
                act(command)

    threading.Thread(target=loop, daemon=True, name="control").start()
