"""The model directory read as the data it is: root walks a directory that is often a user's, and nothing outside
it is stat'ed, hashed or reported.

``os.walk(followlinks=True)`` and ``open()`` followed any link: a shard linked to ``/etc/shadow`` had its size,
mtime and sha256 reported by ``weights verify`` and sent to the head, and three links to ``.`` made the walk
exponential in the root daemon's preflight (security review 2, #33, #34). Here:

- a symlink is followed only when its target resolves, link by link, under the model root or under the ``blobs/``
  of the Hugging Face hub cache the root lies in (``<cache>/models--org--name/snapshots/<rev>/`` links its files to
  ``../../blobs/<sha256>``); each step is checked before it is looked at, so a link that leaves those places is
  passed over without a ``stat`` of where it leads;
- each directory is visited once, by ``(st_dev, st_ino)``;
- the walk stops after :data:`MAX_ENTRIES` entries or :data:`MAX_WALK_S` seconds with a sentence (:class:`TooBig`);
- a file is opened without following a link in its last component, and its descriptor's real path and identity
  are checked again before a byte is read (a link swapped after the walk gains nothing).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from sparkd.host.pathwalk import Components

MAX_ENTRIES = 200_000
MAX_WALK_S = 60.0


class TooBig(Exception):
    """The walk gave up (a sentence: how far it went, and why that is not a model directory)."""


class Outside(OSError):
    """A file that resolves outside the model root and the hub cache's blobs (raised by :func:`open_within`)."""


def matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class Places:
    """Where the walk may go: the model root and, inside a hub cache, that repository's ``blobs/``."""

    roots: tuple[str, ...]

    @classmethod
    def of(cls, root: Path) -> Places:
        real = os.path.realpath(root)
        places = [real]
        path = PurePosixPath(real)
        for parent in path.parents:
            if parent.name.startswith(("models--", "datasets--")) and path.is_relative_to(parent / "snapshots"):
                places.append(str(parent / "blobs"))
                break
        return cls(tuple(places))

    def inside(self, path: str) -> bool:
        return any(path == r or path.startswith(r + "/") for r in self.roots)

    def above(self, path: str) -> bool:
        """``path`` is a directory on the way down to one of the places (known real: no link to judge there)."""
        return any(r.startswith(path.rstrip("/") + "/") for r in self.roots)


def resolve_within(path: str, places: Places) -> str | None:
    """The real path of ``path`` (absolute) when every link on its way keeps it inside ``places``; None when it
    leaves them, loops or does not exist. Only what lies inside the places is looked at."""
    walk = Components(path)
    while (candidate := walk.next()) is not None:
        if not places.inside(candidate):
            if not places.above(candidate):
                return None
            walk.enter(candidate)
            continue
        try:
            st = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            if not walk.follow(candidate):
                return None
            continue
        walk.enter(candidate)
    return walk.current if places.inside(walk.current) else None


def walk(root: Path, ignore: Sequence[str], *, max_entries: int = MAX_ENTRIES, max_s: float = MAX_WALK_S,
         clock: Callable[[], float] = time.monotonic) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, stat) of every regular file under ``root``, links followed only inside the places
    (:class:`Places`), leaving out what ``ignore`` matches at any level. Raises :class:`TooBig`."""
    places = Places.of(root)
    seen: set[tuple[int, int]] = set()
    todo: list[tuple[str, str]] = [(places.roots[0], "")]
    count, began = 0, clock()
    while todo:
        folder, rel = todo.pop()
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        subfolders = []
        for entry in entries:
            count += 1
            if count > max_entries or clock() - began > max_s:
                raise TooBig(f"{root}: the walk stopped after {count - 1} entries and {clock() - began:.0f} s "
                             f"(at most {max_entries} entries, {max_s:.0f} s): a model directory is far smaller; "
                             "look for a link loop or a folder that is not the model's")
            if matches(entry.name, ignore):
                continue
            relpath = f"{rel}{entry.name}"
            path = os.path.join(folder, entry.name)
            if entry.is_symlink():
                real = resolve_within(path, places)
                if real is None:
                    continue  # leads outside the model (or nowhere): not looked at, not reported
                path = real
            try:
                info = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                subfolders.append((path, relpath + "/"))
            elif stat.S_ISREG(info.st_mode):
                yield relpath, info
        todo.extend(reversed(subfolders))


def open_within(root: Path, rel: str, expected: os.stat_result | None = None) -> int:
    """A descriptor of ``root/rel`` opened for reading, only when it resolves inside the places and (given) is
    still the file the walk saw. Raises :class:`Outside` (an OSError) otherwise."""
    places = Places.of(root)
    real = resolve_within(os.path.join(places.roots[0], rel), places)
    if real is None:
        raise Outside(f"{root / rel} leads outside the model directory")
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        where = os.readlink(f"/proc/self/fd/{fd}")
        same = expected is None or (st.st_dev, st.st_ino) == (expected.st_dev, expected.st_ino)
        if not stat.S_ISREG(st.st_mode) or not places.inside(where) or not same:
            raise Outside(f"{root / rel} changed while it was read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
