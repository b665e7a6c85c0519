"""The manifest of a model directory: every file's relative path, size and mtime; the sha256 of the small files
that change answers (``[weights] always_hash``: config, tokenizer, ``*.index.json``) every time; of every shard
on demand (``full``) or when its size or mtime changed since it was last hashed.

Hashes are kept per file in ``<state_dir>/weights-hashes.json`` (path → size, mtime, sha256), so a restart of an
unchanged directory stats its files and re-reads only the small ones: 600 GB of shards are not read again.
Hashing runs in a thread at the idle I/O class (:mod:`sparkd.preflight.ioprio`), drops what it read from the
page cache as it goes (``POSIX_FADV_DONTNEED``: hashing must not undo preflight's cache drop), and stops at a
deadline: what is left is ``pending`` (hashed later, compared by size until then). The directory is walked and
its files opened inside the model only (:mod:`sparkd.preflight.modelwalk`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkd.host.logs import Logger
from sparkd.preflight import ioprio
from sparkd.preflight.modelwalk import TooBig, matches, open_within, walk
from sparkd.state.files import StateFile
from sparkd.state.schema import Field, Schema

CHUNK = 8 << 20
CACHE_NAME = "weights-hashes.json"
CACHE = Schema("weights hash cache", {"root": Field((str,), True), "files": Field((dict,), True)})


@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int
    sha256: str | None = None  # None: not hashed (yet)
    always: bool = False  # hashed at every start ([weights] always_hash)


@dataclass
class Manifest:
    root: str
    files: dict[str, Entry] = field(default_factory=dict)
    hashed: list[str] = field(default_factory=list)  # hashed by this build
    pending: list[str] = field(default_factory=list)  # changed or new shards not hashed before the deadline
    problem: str | None = None  # the directory cannot be read
    skipped: str | None = None  # no local model directory to look at (a hub id): why
    duration_s: float = 0.0
    low_priority: bool = True  # the hashing ran at the idle I/O class

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "problem": self.problem, "skipped": self.skipped,
                "duration_s": round(self.duration_s, 3), "hashed": self.hashed, "pending": self.pending,
                "low_priority": self.low_priority,
                "files": {path: [e.size, e.mtime_ns, e.sha256] for path, e in sorted(self.files.items())}}

    @classmethod
    def from_json(cls, data: Any) -> Manifest | None:
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            return None
        files = {}
        for path, row in data["files"].items():
            if isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) for x in row[:2]):
                files[str(path)] = Entry(row[0], row[1], row[2] if isinstance(row[2], str) else None)
        text = {k: data.get(k) if isinstance(data.get(k), str) else None for k in ("problem", "skipped")}
        return cls(str(data.get("root") or ""), files, list(data.get("hashed") or []),
                   list(data.get("pending") or []), text["problem"], text["skipped"],
                   float(data.get("duration_s") or 0.0))


Stop = Callable[[], bool]


def never() -> bool:
    return False


def sha256_of(path: Path, stop: Stop = never, *, root: Path | None = None,
              expected: os.stat_result | None = None) -> str | None:
    """The file's sha256, or None when ``stop()`` said so first. Read pages leave the cache. With ``root``, the
    file is opened only inside the model (:func:`sparkd.preflight.modelwalk.open_within`)."""
    digest = hashlib.sha256()
    fd = open_within(root, str(path.relative_to(root)), expected) if root is not None else os.open(path, os.O_RDONLY)
    with open(fd, "rb", buffering=0) as f:
        fd, offset = f.fileno(), 0
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            os.posix_fadvise(fd, offset, len(chunk), os.POSIX_FADV_DONTNEED)
            offset += len(chunk)
            if stop():
                return None
    return digest.hexdigest()


def deadline(budget_s: float | None) -> Stop:
    """A ``stop`` that says so once ``budget_s`` has passed (never, for None)."""
    if budget_s is None:
        return never
    at = time.monotonic() + budget_s
    return lambda: time.monotonic() > at


def build(root: Path, *, always: Sequence[str], ignore: Sequence[str], known: dict[str, Entry],
          stop: Stop = never, full: bool = False) -> Manifest:
    """The manifest of ``root`` (blocking). ``known``: hashes from earlier builds, reused where size and mtime
    still match (unless ``full``). Always-hashed files are hashed whatever ``stop`` says; the others only until
    it says stop (the rest are ``pending``)."""
    started = time.monotonic()
    manifest = Manifest(str(root))
    if not root.is_dir():
        manifest.problem = f"{root} is not a directory" if root.exists() else f"{root} does not exist"
        return manifest
    try:
        listing = list(walk(root, ignore))
    except TooBig as exc:
        manifest.problem = str(exc)
        return manifest
    except OSError as exc:
        manifest.problem = f"{root} cannot be read: {exc.strerror or exc}"
        return manifest
    seen = dict(listing)
    todo: list[str] = []
    for rel, st in listing:
        entry = Entry(st.st_size, st.st_mtime_ns, always=matches(Path(rel).name, always))
        old = known.get(rel)
        if not entry.always and not full and old is not None and (old.size, old.mtime_ns) == (entry.size,
                                                                                               entry.mtime_ns):
            entry = replace(entry, sha256=old.sha256)
        manifest.files[rel] = entry
        if entry.sha256 is None:
            todo.append(rel)
    todo.sort(key=lambda rel: (not manifest.files[rel].always, rel))
    with ioprio.idle_io() as low:
        manifest.low_priority = low
        for rel in todo:
            entry = manifest.files[rel]
            if not entry.always and stop():
                manifest.pending.append(rel)
                continue
            try:
                digest = sha256_of(root / rel, never if entry.always else stop, root=root, expected=seen[rel])
            except OSError as exc:
                manifest.problem = f"{root / rel} cannot be read: {exc.strerror or exc}"
                return manifest
            if digest is None:
                manifest.pending.append(rel)
            else:
                manifest.files[rel] = replace(entry, sha256=digest)
                manifest.hashed.append(rel)
    manifest.duration_s = time.monotonic() - started
    return manifest


class HashCache:
    """The per-file hashes of one model directory, kept in the state folder between builds."""

    def __init__(self, state_dir: Path, log: Logger | None = None) -> None:
        self.file = StateFile(state_dir / CACHE_NAME, CACHE, parse=lambda d: d, dump=lambda d: d, log=log)

    def load(self, root: Path) -> dict[str, Entry]:
        data = self.file.read() or {}
        if data.get("root") != str(root):
            return {}
        out = {}
        for rel, row in data.get("files", {}).items():
            if isinstance(row, dict) and isinstance(row.get("size"), int) and isinstance(row.get("mtime_ns"), int) \
                    and isinstance(row.get("sha256"), str):
                out[rel] = Entry(row["size"], row["mtime_ns"], row["sha256"])
        return out

    def save(self, manifest: Manifest) -> None:
        files = {rel: {k: v for k, v in asdict(e).items() if k != "always"}
                 for rel, e in manifest.files.items() if e.sha256 is not None}
        self.file.write({"root": manifest.root, "files": files, "at": time.time()})
