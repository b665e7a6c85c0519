"""An absolute path walked component by component as the kernel resolves it: ``.`` and ``..`` as they come, a
symlink's target put in its place, so that whoever walks it may judge each component before going on
(:mod:`sparkd.host.trustedpaths`, :mod:`sparkd.preflight.modelwalk`)."""

from __future__ import annotations

import os
from collections import deque
from pathlib import PurePosixPath

MAX_LINKS = 40


class Components:
    def __init__(self, path: str) -> None:
        self.parts = deque(PurePosixPath(path).parts[1:])
        self.current = "/"  # the directory resolved so far
        self.links = 0

    def next(self) -> str | None:
        """The next component's path under :attr:`current`, or None at the end."""
        while self.parts:
            name = self.parts.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                self.current = os.path.dirname(self.current)
                continue
            return os.path.join(self.current, name)
        return None

    @property
    def last(self) -> bool:
        return not self.parts

    def enter(self, component: str) -> None:
        self.current = component

    def follow(self, link: str) -> bool:
        """Put the target of ``link`` (a component just returned) in its place; False past :data:`MAX_LINKS`."""
        self.links += 1
        if self.links > MAX_LINKS:
            return False
        target = PurePosixPath(os.readlink(link))
        if target.is_absolute():
            self.current = "/"
            self.parts.extendleft(reversed(target.parts[1:]))
        else:
            self.parts.extendleft(reversed(target.parts))
        return True
