"""A terminal's hard wrap undone before a pasted log is read. Pure.

A log copied from a terminal that wraps at its width (and pasted into an issue as it showed) holds every long line
cut into pieces of exactly that width, the last piece shorter: `... Rank 1] Failed t` / `o check the "should dump"
flag ...`. The cut falls anywhere, mid-word included, so no family can read the words it splits. The wrap is exact,
which makes it recognisable without guessing at words: the terminal's width is the longest line of the log, several
different lines are exactly that wide, and the piece after each is no record of its own. Joined back character for
character (no space added: the terminal cut a line, it did not break it), the pieces are the line as its writer wrote
it, and every reader after this one (`events.py`) sees it whole.

It is conservative: a log whose longest lines are not shared by two different lines, each followed by a piece, is
left as it is (a log read from a pipe or `docker logs` is never wrapped, and its longest line is rarely repeated at
exactly its width); a piece is joined only when nothing in it starts a record (a process prefix, a level, a time or
a date, a bracket, a traceback's line, an exception, a writer's `name: `, a table's border, an indent). The looser
reading of a wrap where the widths do not say it (a line that goes on into a bare one) is `Event.more`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sparkd.supervisor.tracebacks import exception_line

__all__ = ["WRAP_MIN_WIDTH", "unwrapped", "wrap_width"]

WRAP_MIN_WIDTH = 60  # narrower than any terminal a log is read in: a log this narrow holds no wrap worth undoing
_MIN_WRAPPED = 2  # different lines that must be cut at the width before it is read as a terminal's
# A terminal's piece that goes on into the next is the width long, or short of it only by the spaces a copy strips from
# a line's end (a cut that fell on them): one shorter still that goes on was wrapped at words
_STRIPPED = 2
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


def _wrapped_at_words(piece: str, after: str, width: int) -> bool:
    """A piece that ends short of the width (more than a copy's stripped spaces) where the next line, a piece too,
    starts with a word too long to have fitted after it: an editor's or a viewer's wrap at words, whose lines are
    exactly the width only by chance and lose the space between them — no terminal's cut, left alone."""
    short = _width(piece.rstrip()) if piece.strip() else 0
    words = after.split()
    return (short < width - _STRIPPED and _piece(after) and bool(words)
            and short + 1 + len(words[0]) > width)


def wrap_width(lines: Sequence[str]) -> int | None:
    """The width a terminal wrapped `lines` at, or None where they show no wrap: the longest line's width, at least
    `WRAP_MIN_WIDTH`, when at least two different lines of exactly that width are each followed by a piece, and
    none of those pieces shows a wrap at words (`_wrapped_at_words`)."""
    if not lines:
        return None
    width = max(_width(line) for line in lines)
    if width < WRAP_MIN_WIDTH:
        return None
    cut: set[str] = set()
    for at, line in enumerate(lines[:-1]):
        piece = lines[at + 1]
        if _width(line) != width or not _head(line) or not _piece(piece):
            continue
        cut.add(line.rstrip("\n"))
        if at + 2 < len(lines) and _wrapped_at_words(piece, lines[at + 2], width):
            return None
    return width if len(cut) >= _MIN_WRAPPED else None


def unwrapped(lines: Sequence[str]) -> list[str]:
    """`lines` with each piece a terminal wrapped a line onto joined back to it, character for character (a piece
    follows a line exactly the terminal's width and has none of a record's starts); a log with no wrap as it is."""
    width = wrap_width(lines)
    if width is None:
        return list(lines)
    out: list[str] = []
    last_cut = False  # the line (or the last piece) above is exactly the width: the terminal cut it there
    for line in lines:
        if last_cut and _piece(line):
            out[-1] = out[-1].rstrip("\n") + line
        else:
            out.append(line)
        last_cut = _width(line) == width and _head(line)
    return out
