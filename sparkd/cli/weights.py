"""``sparkd weights verify``: this node's manifest, built and checked in the foreground (no daemon needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import click

from sparkd.config import Config
from sparkd.preflight.weights_local import LocalWeights, model_dir
from sparkd.preflight.weights_verify import changed_in_place, index_problems, read_indexes


class _Quiet:
    """The manifest's log events: what this command prints says it all (stdout stays the report's)."""

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: None


def verify(cfg: Config, *, full: bool, as_json: bool) -> int:
    root, how = model_dir(cfg)
    if root is None:
        click.echo(json.dumps({"ok": None, "skipped": how}) if as_json else f"weights: not checked: {how}")
        return 0
    keeper = LocalWeights(lambda: cfg, log=_Quiet())
    before = keeper.cache.load(root)
    manifest = anyio.run(lambda: keeper.manifest(full=full, bounded=False))
    problems = [manifest.problem] if manifest.problem else []
    if not problems:
        problems += index_problems(read_indexes(Path(root), manifest), manifest)
        problems += changed_in_place(before, manifest) if full else []
    if as_json:
        click.echo(json.dumps({"ok": not problems, "problems": problems, "found_by": how,
                               "manifest": manifest.to_json()}, indent=2))
        return 1 if problems else 0
    reused = sum(1 for e in manifest.files.values() if e.sha256) - len(manifest.hashed)
    priority = "idle I/O class" if manifest.low_priority else "normal I/O priority (ioprio_set refused)"
    click.echo(f"weights: {root} ({how}): {len(manifest.files)} files, {len(manifest.hashed)} hashed now, "
               f"{reused} unchanged since last hashed ({manifest.duration_s:.2f} s, {priority})")
    for problem in problems:
        click.echo(f"  problem: {problem}")
    click.echo("weights: " + ("not sound" if problems else "sound"))
    return 1 if problems else 0
