"""What vLLM runs from and how its container differs from the config: the image (read at boot and every preflight),
the builds in it (vLLM, torch, CUDA, NCCL: what this node's last ``builds`` preflight read, kept in the state
directory, so also an operator's or the head's preflight of this rank) and the drift (the last preflight's; cleared by
a recreate). One owner, read by the status, the group and the group's checks; written only here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkd.preflight.builds import BUILDS_FILE, last_builds
from sparkd.runtime.base import ImageIdentity, LaunchError, Runtime


class ContainerFacts:
    def __init__(self, runtime: Runtime, state_dir: Path) -> None:
        self.runtime = runtime
        self.state_dir = state_dir  # where the builds preflight keeps what it read
        self.image: ImageIdentity | None = None
        self.drift: list[dict[str, Any]] = []  # how the container differs from the config (the last preflight)
        self._builds: tuple[tuple[int, str | None], dict[str, Any] | None] | None = None

    async def read_image(self) -> None:
        self.image = await self.runtime.image_identity()

    def saw_image(self, image: ImageIdentity | None) -> None:
        """The image a preflight read (None: it could not; the last one stands)."""
        self.image = image or self.image

    async def read_drift(self) -> None:
        self.drift = [d.to_json() for d in await self.runtime.drift()]

    async def recreate(self) -> tuple[bool, str]:
        """Replace vLLM's container with one made from ``[container]``: (done, the runtime's sentence)."""
        try:
            sentence = await self.runtime.recreate()
        except LaunchError as exc:
            return False, str(exc)
        self.drift = []
        return True, sentence

    def identity(self) -> ImageIdentity | None:
        return self.image

    def image_id(self) -> str | None:
        return self.image.id if self.image is not None else None
    def builds(self) -> dict[str, Any] | None:
        """The builds the last preflight read for the image in use (on the host: for the launch's executable), or
        None; read again only when the preflight wrote them again."""
        try:
            written = (self.state_dir / BUILDS_FILE).stat().st_mtime_ns
        except OSError:
            return None
        image = self.image.id if self.image is not None else None
        if self._builds is None or self._builds[0] != (written, image):
            self._builds = ((written, image), last_builds(self.state_dir, image))
        return self._builds[1]

    def image_json(self) -> dict[str, Any] | None:
        """The image's id, digests and labels, and the builds in it (``builds``; on the host, the builds alone): what
        the head compares across the group before a start (``sparkd.cluster.shared``)."""
        builds = self.builds()
        with_builds = {"builds": builds} if builds else {}
        if self.image is None:
            return with_builds or None
        return {**self.image.to_json(), **with_builds}
