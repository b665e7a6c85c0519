"""Which GPUs a launch uses: the one answer the ``gpu`` check (and any GPU memory reasoning) is scoped to.

Pure. The launch's GPUs are chosen in stages, each picking from what the one before left, in index order:
1. in a container, the container's request: ``[container] gpus`` (``--gpus``: ``all``, a count — the first N —
   or ``device=0,1`` / UUIDs); when it requests none, ``NVIDIA_VISIBLE_DEVICES`` from the launch's environment
   (the nvidia runtime reads it; unset: all, as the CUDA images set it);
2. ``CUDA_VISIBLE_DEVICES`` from the launch's environment: indices into what stage 1 left (a container
   renumbers its GPUs from 0), or UUIDs (``GPU-…``, ``MIG-…``, a unique prefix is enough, as CUDA takes it).
   CUDA stops at the first entry that names no device; an empty value or ``-1`` hides every GPU.
A stage that names nothing (unset) keeps everything: a launch that names no GPU uses them all.
Indices are nvidia-smi's (PCI order); CUDA's own order matches it with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and on a
box of identical GPUs.

The launch's environment is the one vLLM starts with (:func:`sparkd.launch.render.effective_env`): on the host (the
process runtime) sparkd's own environment — what a systemd unit's ``Environment=`` sets — under what the launch
script exports; in a container, the image's ENV and ``[container] env`` under the script's exports (sparkd's own
environment stays outside).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NONE_WORDS = ("", "none", "void", "-1")


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str


@dataclass(frozen=True)
class Stage:
    ids: tuple[str, ...] | None  # None: every device; (): none
    source: str  # "CUDA_VISIBLE_DEVICES=0,1", for sentences
    count: int | None = None  # ``--gpus N``: the first N


@dataclass(frozen=True)
class Devices:
    stages: tuple[Stage, ...] = ()

    @property
    def every(self) -> bool:
        """The launch names no GPU: it uses them all."""
        return all(s.ids is None and s.count is None for s in self.stages)

    def describe(self) -> str:
        named = [s.source for s in self.stages if s.ids is not None or s.count is not None]
        return ", then ".join(named) if named else "every GPU (the launch names none)"

    def select(self, gpus: Sequence[Gpu]) -> list[Gpu]:
        """The GPUs among ``gpus`` (the host's) that the launch uses."""
        current = sorted(gpus, key=lambda g: g.index)
        for stage in self.stages:
            current = _pick(stage, current)
        return current


def _pick(stage: Stage, current: list[Gpu]) -> list[Gpu]:
    if stage.count is not None:
        return current[:stage.count]
    if stage.ids is None:
        return current
    out: list[Gpu] = []
    for item in stage.ids:
        found = _find(item, current)
        if found is None:
            break  # CUDA ignores the rest of the list after an entry it cannot find
        if found not in out:
            out.append(found)
    return out


def _find(item: str, current: list[Gpu]) -> Gpu | None:
    if item.isdigit():
        position = int(item)
        return current[position] if position < len(current) else None
    matches = [g for g in current if g.uuid.lower().startswith(item.lower())]
    return matches[0] if len(matches) == 1 else None


def parse_ids(text: str | None) -> tuple[str, ...] | None:
    """A device list as CUDA/NVIDIA variables write it; None for unset or ``all``, () for none."""
    if text is None:
        return None
    value = text.strip()
    if value.lower() == "all":
        return None
    if value.lower() in NONE_WORDS:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def container_stage(gpus: str | None, env: Mapping[str, str]) -> Stage:
    """What the container is given: its ``--gpus`` request, else NVIDIA_VISIBLE_DEVICES, else every GPU."""
    if gpus is not None and gpus.strip():
        spec = gpus.strip().strip("\"'")
        if spec.isdigit():
            return Stage(None, f"[container] gpus = {spec} (the first {spec})", count=int(spec))
        ids = parse_ids(spec.removeprefix("device="))
        return Stage(ids, f"[container] gpus = {spec}")
    if "NVIDIA_VISIBLE_DEVICES" in env:
        value = env["NVIDIA_VISIBLE_DEVICES"]
        return Stage(parse_ids(value), f"NVIDIA_VISIBLE_DEVICES={value}")
    return Stage(None, "the container's GPUs")


def launch_devices(env: Mapping[str, str], *, container: bool, gpus: str | None = None) -> Devices:
    """The launch's GPUs from its environment (and, in a container, its GPU request). See the module doc."""
    stages = [container_stage(gpus, env)] if container else []
    if "CUDA_VISIBLE_DEVICES" in env:
        stages.append(Stage(parse_ids(env["CUDA_VISIBLE_DEVICES"]),
                            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"))
    return Devices(tuple(stages))
