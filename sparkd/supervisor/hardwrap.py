"""A terminal's hard wrap undone before a pasted log is read. Pure.

A log copied from a terminal that wraps at its width (and pasted into an issue as it showed) holds every long line
cut into pieces of exactly that width, the last piece shorter: `... torch.OutOfMemoryError: CUDA out of mem` / `ory.
Tried to allocate ...`. The cut falls anywhere, mid-word included, so no family can read the words it splits. The
wrap is exact, which makes it recognisable without guessing at words: the terminal's width is the longest line of the
log, several different lines are exactly that wide, and the piece after each is no record of its own. Joined back
character for character (no space added: the terminal cut a line, it did not break it), the pieces are the line as
its writer wrote it, and every reader after this one (`events.py`) sees it whole.

It is conservative: a log whose longest lines are not shared by two different lines, each followed by a piece, is
left as it is (a log read from a pipe or `docker logs` is never wrapped, and its longest line is rarely repeated at
exactly its width); a piece is joined only when nothing in it starts a record (a process prefix, a level, a time or
a date, a bracket, a traceback's line, an exception, a writer's `name: `, a table's border, an indent); and a text an
editor or a viewer wrapped at words is left alone where one of its lines ends short of the width before a word too
long to have fitted (a terminal cuts wherever the width falls). A text wrapped at words whose every wrapped line
fills the width exactly cannot be told from a terminal's cut by its widths: it is joined, its words meeting without
their space. The looser reading of a wrap where the widths do not say it (a line that goes on into a bare one) is
`Event.more`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise

from sparkd.supervisor.tracebacks import exception_line

__all__ = ["WRAP_MIN_WIDTH", "unwrapped", "wrap_width"]

WRAP_MIN_WIDTH = 60  # narrower than any terminal a log is read in: a log this narrow holds no wrap worth undoing
_MIN_WRAPPED = 2  # different lines that must be cut at the width before it is read as a terminal's
# A terminal's piece that goes on into the next is the width long, or short of it only by the space a copy strips from
# a line's end (a cut that fell on it): one shorter still that goes on was wrapped at words
_STRIPPED = 1
# What starts a record of its own, never the rest of a cut line: an indent (a traceback's frame or source, a
# continuation its writer indented), a bracket or parenthesis (a process prefix, torch's `[rank0]:[W...]`, a bracketed
# time, kubectl's `[pod/...]`), a level, a time, a date or a line's number, NCCL's `host:pid:tid [dev]`, a traceback's
# own lines (and multiprocessing's `Process Name:`, faulthandler's, threading's heads of one), a writer's `name: ` or
# compose's `name | `, a table's or a box's border, a shell's prompt, a colour code.
_RECORD = re.compile(
    r"^(?:\s{2}|\t|[\[(<{|+=\-*#>$│┃║╭╰┌└├─━\x1b^]|"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE)\b|"
    r"\d+[-/.:,]|[A-Z][a-z]{2} [ \d]\d |"
    r"\S+:\d+:\d+ \[\d+\] |"
    r"Traceback \(most recent|During handling of|The above exception|\s?File \"|Process [\w.\-]+:\s*$|"
    r"Fatal Python error|Exception in thread|"
    r"[A-Za-z_][\w.\-]*(?::| +\|)(?: |$))")
_BORDER = re.compile(r"^[\W_]*$")  # a line of punctuation alone: a rule, a table's border


def _width(line: str) -> int:
    return len(line.rstrip("\n"))


def _piece(line: str) -> bool:
    """Whether `line` can be the rest of the line above it: not blank, no record's start, no exception of its own."""
    text = line.rstrip("\n")
    return (bool(text.strip()) and "\r" not in text and _RECORD.match(text) is None
            and exception_line(text, in_traceback=False) is None)


def _head(line: str) -> bool:
    """Whether `line` can be a piece the terminal cut at its width: anything but a rule or a border."""
    text = line.rstrip("\n")
    return "\r" not in text and _BORDER.match(text) is None


def _wrapped_at_words(line: str, after: str, width: int) -> bool:
    """A line that ends short of the width (by more than a copy's stripped space) where the next, a piece, starts with
    a word too long to have fitted after it: an editor's or a viewer's wrap at words, whose lines are the width only by
    chance and lose the space between them — no terminal's cut."""
    short = _width(line.rstrip())
    if not 0 < short < width - _STRIPPED:
        return False
    first = after.split(None, 1)
    return bool(first) and short + 1 + len(first[0]) > width and _piece(after)


def wrap_width(lines: Sequence[str]) -> int | None:
    """The width a terminal wrapped `lines` at, or None where they show no wrap: the longest line's width, at least
    `WRAP_MIN_WIDTH`, when at least two different lines of exactly that width are each followed by a piece, and no
    line shows a wrap at words (`_wrapped_at_words`)."""
    if not lines:
        return None
    width = max(_width(line) for line in lines)
    if width < WRAP_MIN_WIDTH:
        return None
    pairs = list(pairwise(lines))
    cut = {line.rstrip("\n") for line, piece in pairs if _width(line) == width and _head(line) and _piece(piece)}
    if len(cut) < _MIN_WRAPPED or any(_wrapped_at_words(line, after, width) for line, after in pairs):
        return None
    return width


def unwrapped(lines: Sequence[str]) -> list[str]:
    """`lines` with each piece a terminal wrapped a line onto joined back to it, character for character (a piece
    follows a line exactly the terminal's width and has none of a record's starts); a log with no wrap as it is."""
    width = wrap_width(lines)
    if width is None:
        return list(lines)
    out: list[list[str]] = []  # each line's pieces, joined at the end
    last_cut = False  # the line (or the last piece) above is exactly the width: the terminal cut it there
    for line in lines:
        if last_cut and _piece(line):
            out[-1].append(line)
        else:
            out.append([line])
        last_cut = _width(line) == width and _head(line)
    return ["".join(piece.rstrip("\n") for piece in pieces[:-1]) + pieces[-1] for pieces in out]
