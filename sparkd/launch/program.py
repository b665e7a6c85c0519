"""Whether this process could run a program: the launch's program is started by sparkd itself, so the answer is
for sparkd's effective user and capabilities (``access(2)`` with ``AT_EACCESS``). ``shutil.which`` asks for the
real user, whose capabilities the kernel drops for the check: it calls a program unreachable that sparkd, running
with ``CAP_DAC_READ_SEARCH`` or set-uid, starts fine."""

from __future__ import annotations

import os
from pathlib import Path

_EFFECTIVE = os.access in os.supports_effective_ids


def executable(path: Path) -> bool:
    """A file this process may execute."""
    return path.is_file() and os.access(path, os.X_OK, effective_ids=_EFFECTIVE)


def which(name: str, search: str | None = None) -> str | None:
    """``name`` as ``execvp`` finds it on ``search`` (by default this process's PATH), or None."""
    for folder in (search if search is not None else os.environ.get("PATH", os.defpath)).split(os.pathsep):
        candidate = Path(folder or ".") / name
        if executable(candidate):
            return str(candidate)
    return None
