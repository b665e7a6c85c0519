"""Only root (or the user sparkd runs as) may change a directory sparkd writes in, or a program it runs: the
check sshd's StrictModes makes of ``~/.ssh``.

Root once wrote through a symlink a user planted in a state directory under their home, and ran what they fed
it (security review §3). :func:`unsafe` walks a path from ``/`` down, component by component, resolving
symlinks as the kernel would (each link is judged by the directory holding it, then followed), and names the
first component that is owned by someone else than the trusted owners or that its group or others may write.
A sticky directory (``/tmp``) may be written by others above the path: nobody but an entry's owner may rename
or remove it there. Components that do not exist yet are sparkd's to create (under umask 027).

The trusted owners are root and the user sparkd runs as: a demo run by alice in her checkout keeps its state
under her home, which only she and root can change; root in alice's checkout is refused, because alice could
swap what root writes there.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from sparkd.host.pathwalk import MAX_LINKS, Components


def trusted_owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _loose(path: str, st: os.stat_result, owners: frozenset[int], *, last: bool) -> str | None:
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if st.st_uid not in owners:
        allowed = " or ".join(_who(uid) for uid in sorted(owners))
        return f"{path} is owned by {_who(st.st_uid)}, not {allowed} (mode {mode})"
    if st.st_mode & 0o022:
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if not (sticky_dir and not last):
            return f"{path} is writable by its group or others (mode {mode}, owner {_who(st.st_uid)})"
    return None


def unsafe(path: Path | str, owners: frozenset[int] | None = None) -> str | None:
    """Why someone other than ``owners`` (default: root and this user) could change what ``path`` names, or
    None. Raises nothing: an unreadable component is a reason too."""
    owners = trusted_owners() if owners is None else owners
    walk = Components(os.path.abspath(path))
    try:
        why = _loose("/", os.lstat("/"), owners, last=walk.last)
        while why is None and (candidate := walk.next()) is not None:
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                return None  # sparkd creates the rest, under a directory found safe
            if stat.S_ISLNK(st.st_mode):
                if not walk.follow(candidate):
                    return f"{path} has more than {MAX_LINKS} symlinks on its way"
                continue
            why = _loose(candidate, st, owners, last=walk.last)
            walk.enter(candidate)
    except OSError as exc:
        return f"{walk.current} cannot be examined: {exc.strerror or exc}"
    return why


def first_unsafe(paths: Iterable[tuple[str, Path]], owners: frozenset[int] | None = None) -> str | None:
    """The first problem among ``(key, path)`` pairs, as one sentence naming the key."""
    for key, path in paths:
        why = unsafe(path, owners)
        if why is not None:
            runner = "root" if os.geteuid() == 0 else _who(os.geteuid())
            return (f"{key} {path} is not safe for sparkd, which runs as {runner}: {why}, so another user could "
                    "swap what sparkd writes there for a link or a FIFO (sshd's StrictModes refuses the same); "
                    "fix that owner or mode, or choose another directory in [paths]")
    return None
