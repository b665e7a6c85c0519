"""The model directory walked as data (sparkd/preflight/modelwalk.py): a Hugging Face hub cache's snapshot, whose
files are links to ``../../blobs/<sha256>``, is read whole; a link out of the model is passed over without a look
at where it leads (security review 2, #33: /etc/shadow's size, mtime and sha256 were reported); link loops are
walked once (#34: three links to `.` made the walk exponential); the walk is bounded with a sentence."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubcache import hub_cache

from sparkd.preflight import modelwalk
from sparkd.preflight.manifest import build
from sparkd.preflight.modelwalk import Outside, Places, TooBig, open_within, resolve_within, walk

FILES = {"config.json": b'{"architectures": ["X"]}', "model-00001-of-00001.safetensors": b"\0" * 4096,
         "tokenizer.json": b"{}", "sub/extra.json": b"[]"}


def test_a_hub_cache_snapshot_is_walked_through_its_blobs(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path, FILES)
    assert Places.of(snapshot).roots == (str(snapshot.resolve()), str(tmp_path / "hub" / "models--org--tiny" / "blobs"))
    manifest = build(snapshot, always=["*.json"], ignore=[], known={}, full=True)
    assert manifest.problem is None and sorted(manifest.files) == sorted(FILES)
    for name, data in FILES.items():
        entry = manifest.files[name]
        assert entry.sha256 == hashlib.sha256(data).hexdigest() and entry.size == len(data)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path the walker stat'ed or opened."""
    seen: list[str] = []
    for name in ("lstat", "stat", "open", "readlink"):
        real = getattr(os, name)

        def spy(path: object, *args: object, _real: object = real, **kw: object) -> object:
            seen.append(str(path))
            return _real(path, *args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(modelwalk.os, name, spy)
    yield seen


def test_a_link_out_of_the_model_is_neither_looked_at_nor_reported(tmp_path: Path, looks: list[str]) -> None:
    secret = tmp_path / "etc" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    snapshot = hub_cache(tmp_path, FILES)
    (snapshot / "model-00002-of-00002.safetensors").symlink_to(secret)
    (snapshot / "via-parent.json").symlink_to("../../../../etc/shadow")
    (snapshot / "blobs-escape").symlink_to("../../blobs/../../../etc")
    manifest = build(snapshot, always=["*.json"], ignore=[], known={}, full=True)
    assert sorted(manifest.files) == sorted(FILES) and manifest.problem is None
    assert not [p for p in looks if p.startswith(str(tmp_path / "etc"))], looks
    with pytest.raises(Outside):
        open_within(snapshot, "model-00002-of-00002.safetensors")
    assert resolve_within(str(snapshot / "via-parent.json"), Places.of(snapshot)) is None


def test_link_loops_are_walked_once_and_quickly(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "deep").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "deep" / "w.safetensors").write_bytes(b"x")
    for name in ("a", "b", "c"):
        (root / name).symlink_to(".")
    (root / "deep" / "up").symlink_to("..")
    (root / "self").symlink_to("self")
    began = time.monotonic()
    files = dict(walk(root, ignore=[]))
    assert time.monotonic() - began < 5
    assert sorted(files) == ["config.json", "deep/w.safetensors"]


def test_the_walk_gives_up_with_a_sentence(tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    for i in range(30):
        (root / f"f{i}").write_text("x")
    with pytest.raises(TooBig, match=r"the walk stopped after 10 entries .*\(at most 10 entries"):
        list(walk(root, [], max_entries=10))
    ticks = iter(range(100))
    with pytest.raises(TooBig, match="look for a link loop"):
        list(walk(root, [], max_s=5, clock=lambda: float(next(ticks))))
    manifest = build(root, always=[], ignore=[], known={})
    assert manifest.problem is None and len(manifest.files) == 30
