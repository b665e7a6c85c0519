"""This node's weights manifest, kept: where the model directory is on the host, the hash cache, one build at a
time, and the shards a start had no time for hashed afterwards in the background.

A start never waits for background hashing (nor for an operator's ``--full`` run): it interrupts it (between two
chunks), builds with the cache — an unchanged directory costs a ``stat`` per file and the small always-hashed
files — and the background resumes where it stopped. The budget of a start (``[weights] hash_budget_s``)
bounds the shards it hashes itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.config import Config
from sparkd.preflight.manifest import HashCache, Manifest, Stop, build, deadline
from sparkd.preflight.target import local_model

if TYPE_CHECKING:
    from sparkd.host.logs import Logger


def model_dir(cfg: Config) -> tuple[Path | None, str]:
    """(the model directory on the host, or None; how it was found, or why not)."""
    if cfg.weights.path:
        return Path(cfg.weights.path), "[weights] path"
    model = local_model(cfg.launch.model)
    if model is None:
        return None, f"the model {cfg.launch.model} is a hub id (set [weights] path to compare a local copy)"
    if not cfg.runtime.in_container:
        return Path(model), "[launch] model"
    best = None
    for mount in cfg.container.mounts:
        target = mount.target.rstrip("/") or "/"
        if (model == target or model.startswith(target + "/")) and (best is None or len(target) > len(best[0])):
            best = (target, mount.source)
    if best is None:
        return None, f"no [container] mounts entry holds {model} (set [weights] path)"
    target, source = best
    source = str(Path(source).expanduser())
    if not source.startswith("/"):
        return None, f"{model} is in the named volume {source!r} (set [weights] path)"
    return Path(source + model[len(target):]), f"[launch] model through the mount {source}:{target}"


class LocalWeights:
    def __init__(self, config: Callable[[], Config], *, log: Logger, spawn: Callable[..., Any] | None = None) -> None:
        self.config = config  # the config in force, read when a manifest is made
        self.log = log
        self.spawn = spawn  # runs the background hashing beside the daemon; None: no background (one-shot)
        self.cache = HashCache(config().paths.state_dir, log=log)
        self.last: Manifest | None = None
        self._lock = anyio.Lock()
        self._interrupt = threading.Event()
        self._background = False

    @property
    def cfg(self) -> Config:
        """The config in force (a reload is read from the next use on)."""
        return self.config()

    async def manifest(self, *, full: bool = False, bounded: bool = True) -> Manifest:
        """The manifest now: changed shards hashed within ``[weights] hash_budget_s`` (``full`` or not ``bounded``:
        no bound; ``full``: every shard again); what is left is hashed in the background."""
        root, how = model_dir(self.cfg)
        if root is None:
            return Manifest("", skipped=how)
        self._interrupt.set()  # a start does not wait for the background (nor for an operator's --full)
        async with self._lock:
            self._interrupt.clear()
            late = deadline(self.cfg.weights.hash_budget_s if bounded and not full else None)
            manifest = await self._build(root, lambda: self._interrupt.is_set() or late(), full)
        if manifest.pending:
            self.log.warning("weights_hash_deferred", root=str(root), pending=len(manifest.pending),
                             compared="by size until hashed")
            self._later()
        return manifest

    async def _build(self, root: Path, stop: Stop, full: bool) -> Manifest:
        known = {} if full else await anyio.to_thread.run_sync(self.cache.load, root)
        w = self.cfg.weights
        manifest = await anyio.to_thread.run_sync(
            lambda: build(root, always=w.always_hash, ignore=w.ignore, known=known, stop=stop, full=full))
        hashes = {rel: (e.size, e.mtime_ns, e.sha256) for rel, e in manifest.files.items() if e.sha256}
        if manifest.problem is None and hashes != {rel: (e.size, e.mtime_ns, e.sha256) for rel, e in known.items()}:
            await anyio.to_thread.run_sync(self.cache.save, manifest)  # an unchanged directory writes nothing
        self.last = manifest
        self.log.info("weights_manifest", root=str(root), files=len(manifest.files), hashed=len(manifest.hashed),
                      pending=len(manifest.pending), duration_s=round(manifest.duration_s, 3),
                      low_priority=manifest.low_priority, problem=manifest.problem)
        return manifest

    def _later(self) -> None:
        if self.spawn is None or self._background:
            return
        self._background = True
        self.spawn(self._finish)

    async def _finish(self) -> None:
        """Hash what the last start left, at the idle I/O class, yielding to any start that asks meanwhile."""
        await self._finish_with(self._interrupt.is_set)

    async def _finish_with(self, stop: Stop) -> None:
        try:
            root, _ = model_dir(self.cfg)
            while root is not None:
                async with self._lock:
                    done = await self._build(root, stop, False)
                if not done.pending or done.problem:
                    return
                await anyio.sleep(1.0)
        finally:
            self._background = False
