"""``sparkd weights verify``: this node's model directory checked against itself — every shard an index lists is
there, every index parses, and (``--full``) no shard changed in place since it was last hashed (same size and
mtime, another sha256: a torn copy or a disk that lies). Pure, over manifests and index texts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sparkd.preflight.manifest import Entry, Manifest
from sparkd.preflight.modelwalk import open_within

MAX_INDEX_BYTES = 64 << 20


def changed_in_place(before: Mapping[str, Entry], now: Manifest) -> list[str]:
    """Files whose size and mtime are as recorded but whose sha256 is not."""
    out = []
    for rel, entry in sorted(now.files.items()):
        old = before.get(rel)
        if old is not None and old.sha256 and entry.sha256 and (old.size, old.mtime_ns) == (
                entry.size, entry.mtime_ns) and old.sha256 != entry.sha256:
            out.append(f"{rel} changed in place: sha256 {old.sha256[:12]}… when last hashed, {entry.sha256[:12]}… "
                       "now (same size and mtime)")
    return out


def index_problems(indexes: Mapping[str, str | None], manifest: Manifest) -> list[str]:
    """Every ``*.index.json`` (path → text, None unreadable) parses and every shard it lists is in the manifest."""
    out = []
    for rel, text in sorted(indexes.items()):
        try:
            weight_map = json.loads(text or "")["weight_map"]
            listed = sorted({str(Path(rel).parent / name) if Path(rel).parent != Path(".") else str(name)
                             for name in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError):
            out.append(f"{rel} is not a readable index (truncated or not JSON with a weight_map)")
            continue
        missing = [name for name in listed if name not in manifest.files]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            out.append(f"{rel} lists {len(missing)} shard(s) that are not there: {shown}")
    return out


def read_indexes(root: Path, manifest: Manifest) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for rel in manifest.files:
        if rel.endswith(".index.json"):
            try:
                with open(open_within(root, rel), "rb") as f:
                    out[rel] = f.read(MAX_INDEX_BYTES).decode("utf-8", errors="replace")
            except OSError:
                out[rel] = None
    return out
