"""Files the command-line programs write, and the folders they create, as the daemon would.

``import-compose -o`` wrote through a symlink, over any file, 0644 with the compose secrets in it; a state
folder ``weights verify`` created before the daemon's first start was 0755 (security review 2, #32, #21). Now:

- an output is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode 0600: an existing name (a file, a link, a FIFO) is
  refused; with ``--force`` an existing regular file is replaced (a new file renamed over it), never a link;
- the programs run under the daemon's umask (027, :data:`sparkd.cli.common.DAEMON_UMASK`): what they create has
  the daemon's modes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sparkd.host.safefile import create_new, replace_file


class OutputRefused(OSError):
    """One sentence: why the output was not written."""


def write_output(path: Path, text: str, *, force: bool = False, mode: int = 0o600) -> None:
    """Write ``text`` to a new ``path`` (``force``: replacing a regular file there). Raises :class:`OutputRefused`
    or another OSError."""
    data = text.encode("utf-8")
    if not force:
        try:
            create_new(path, data, mode)
        except FileExistsError:
            if _kind(path) != "a regular file":
                raise OutputRefused(f"{path} is {_kind(path)}: never written through") from None
            raise OutputRefused(f"{path} exists: not written over (--force replaces a regular file)") from None
        return
    if _kind(path) not in ("a regular file", None):
        raise OutputRefused(f"{path} is {_kind(path)}: never written through, even with --force")
    replace_file(path, data, mode)


def _kind(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    return "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"
