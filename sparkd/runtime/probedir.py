"""The step probe's directory on this host (issue 38): made before a launch, cleared of an earlier launch's files. The
launch names it (:func:`sparkd.launch.probe.probe_dir`, in ``LaunchSpec.probe_dir``); every runtime calls
:func:`prepare` before it starts vLLM, so the files the reader finds are this launch's. Only what the probe wrote and
no live process writes any more is removed — a ``*.step`` file whose process is gone (or that is no step file), a
writer's ``*.tmp`` file a minute old; regular files only, never through a link: a neighbour's live files stay even
where a config shares the folder by mistake — and a failure to make or clear the directory is no reason to refuse the
launch: vLLM runs, and the probe says in vLLM's log that it cannot write there. A container that runs as another user
(``[container] user`` as a numeric uid) gets the directory owned by that uid, so its ranks may write.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from sparkd.host.stepfiles import host_pid, read_step_file
from sparkd.vllm_probe.sparkd_vllm_probe.layout import SUFFIX

__all__ = ["prepare"]


def prepare(directory: str | None, *, user: str | None = None) -> str | None:
    """Make ``directory`` (mode 0750, whatever the umask: the daemon's modes) and remove the step files in it; a
    sentence when that failed, else None."""
    if directory is None:
        return None
    path = Path(directory)
    try:
        made = not os.path.lexists(path)
        path.mkdir(mode=0o750, parents=True, exist_ok=True)  # a file or a link in its place: FileExistsError
        if not stat.S_ISDIR(path.lstat().st_mode):
            return f"the step probe's directory {path} is a link, not a directory"
        if made:
            path.chmod(0o750)
        _own(path, user)
        for name in os.listdir(path):
            done = not _live(path / name) if name.endswith(SUFFIX) else name.endswith(".tmp") and _stale(path / name)
            if done:
                _remove_file(path / name)
    except OSError as exc:
        return f"cannot prepare the step probe's directory {path}: {exc.strerror or exc}"
    return None


def _own(path: Path, user: str | None) -> None:
    uid_gid = (user or "").split(":")
    if not uid_gid[0].isdigit():
        return
    uid = int(uid_gid[0])
    gid = int(uid_gid[1]) if len(uid_gid) > 1 and uid_gid[1].isdigit() else -1
    with contextlib.suppress(PermissionError):  # not root: the ranks may still be sparkd's own user
        os.chown(path, uid, gid, follow_symlinks=False)


def _live(path: Path) -> bool:
    """A step file whose writer still runs."""
    try:
        record = read_step_file(path)
    except (OSError, ValueError):
        return False
    return host_pid(record, hint=record.pid) is not None


def _stale(path: Path, age_s: float = 60.0) -> bool:
    """A writer's temporary file old enough that no writer is still making it."""
    with contextlib.suppress(OSError):
        return time.time() - path.lstat().st_mtime > age_s
    return False


def _remove_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISREG(path.lstat().st_mode):
            path.unlink()
