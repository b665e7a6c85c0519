"""A Hugging Face hub cache laid out as huggingface_hub lays it out (the unit and integration tests of the model
walk: sparkd/preflight/modelwalk.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def hub_cache(base: Path, files: dict[str, bytes], repo: str = "models--org--tiny") -> Path:
    """A hub cache laid out as huggingface_hub lays it out: each file's content in blobs/<sha256>, the snapshot's
    entries relative links to it, refs/main naming the revision. Returns the snapshot (what a config names)."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    cache = base / "hub" / repo
    (cache / "blobs").mkdir(parents=True)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(revision)
    snapshot = cache / "snapshots" / revision
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (cache / "blobs" / digest).write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(cache / "blobs" / digest, link.parent))
    return snapshot
