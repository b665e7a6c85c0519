"""What vLLM runs from and how its container differs from the config: the image (read at boot and every preflight)
and the drift (the last preflight's; cleared by a recreate). One owner, read by the status, the group and the
group's checks; written only here."""

from __future__ import annotations

from typing import Any

from sparkd.runtime.base import ImageIdentity, LaunchError, Runtime


class ContainerFacts:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.image: ImageIdentity | None = None
        self.drift: list[dict[str, Any]] = []  # how the container differs from the config (the last preflight)

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

    def image_json(self) -> dict[str, Any] | None:
        return self.image.to_json() if self.image else None
