"""Weights parity: the manifest of a model directory the test builds (sparkd/preflight/manifest.py) with its hash
cache, deadline and idle I/O class; the comparison across nodes (sparkd/cluster/weights.py) with a corrupted
shard, a swapped tokenizer and a truncated index; ``sparkd weights verify``; where the directory is on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sparkd.cluster.weights import compare, refusal
from sparkd.config import config_from_mapping
from sparkd.config.fabric import ALWAYS_HASHED
from sparkd.preflight import ioprio
from sparkd.preflight.manifest import HashCache, Manifest, build, deadline, sha256_of
from sparkd.preflight.weights_local import LocalWeights, model_dir
from sparkd.preflight.weights_verify import changed_in_place, index_problems, read_indexes
from sparkd.supervisor.failures import FailureClass

SHARDS = 4
IGNORE = [".*", "*.md"]


def model(root: Path, shard_bytes: int = 64 * 1024) -> Path:
    root.mkdir(parents=True)
    names = [f"model-{k:05d}-of-{SHARDS:05d}.safetensors" for k in range(1, SHARDS + 1)]
    for k, name in enumerate(names):
        (root / name).write_bytes(bytes([k]) * shard_bytes)
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"layer.{k}": name for k, name in enumerate(names)}}))
    (root / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}')
    (root / "tokenizer.json").write_text('{"version": "1.0", "vocab": {"a": 1}}')
    (root / "README.md").write_text("ignored")
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("ignored")
    return root


def manifest_of(root: Path, known: dict[str, Any] | None = None, **kw: Any) -> Manifest:
    return build(root, always=ALWAYS_HASHED, ignore=IGNORE, known=known or {}, **kw)


def corrupt(path: Path) -> None:
    """Flip one byte in the middle, keeping the size (mtime moves, as a torn copy's does)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_manifest_holds_every_file_but_the_ignored_with_its_sha256(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    m = manifest_of(root)
    assert sorted(m.files) == ["config.json", "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                               "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                               "model.safetensors.index.json", "tokenizer.json"]
    assert m.files["config.json"].sha256 == sha256_of(root / "config.json")
    assert len(m.hashed) == 7 and m.pending == [] and m.problem is None


def test_an_unchanged_directory_rehashes_only_the_always_files(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    first = manifest_of(root)
    second = manifest_of(root, known=first.files)
    assert sorted(second.hashed) == ["config.json", "model.safetensors.index.json", "tokenizer.json"]
    assert {k: e.sha256 for k, e in second.files.items()} == {k: e.sha256 for k, e in first.files.items()}


def test_a_shard_whose_mtime_moved_is_hashed_again_and_full_hashes_all(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    first = manifest_of(root)
    shard = root / "model-00002-of-00004.safetensors"
    corrupt(shard)
    again = manifest_of(root, known=first.files)
    assert "model-00002-of-00004.safetensors" in again.hashed and len(again.hashed) == 4
    assert again.files[shard.name].sha256 != first.files[shard.name].sha256
    full = manifest_of(root, known=again.files, full=True)
    assert len(full.hashed) == 7


def test_shards_past_the_deadline_are_pending_and_the_always_files_are_hashed_anyway(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    m = manifest_of(root, stop=deadline(0.0))
    assert sorted(m.hashed) == ["config.json", "model.safetensors.index.json", "tokenizer.json"]
    assert len(m.pending) == SHARDS and all(m.files[p].sha256 is None for p in m.pending)


def test_hashing_runs_at_the_idle_io_class_and_gives_it_back(tmp_path: Path) -> None:
    if ioprio.get() is None:
        pytest.skip("no ioprio syscall known for this machine")
    seen: list[int | None] = []
    with ioprio.idle_io() as done:
        seen.append(ioprio.get())
    assert done and seen == [ioprio.IDLE] and ioprio.get() != ioprio.IDLE
    assert manifest_of(model(tmp_path / "m")).low_priority


def test_the_hash_cache_survives_a_restart_and_forgets_another_directory(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    cache = HashCache(tmp_path / "state")
    cache.save(manifest_of(root))
    assert len(HashCache(tmp_path / "state").load(root)) == 7
    assert HashCache(tmp_path / "state").load(tmp_path / "other") == {}


def nodes(tmp_path: Path) -> tuple[Path, Path]:
    return model(tmp_path / "head"), model(tmp_path / "worker")


def differ(head: Path, worker: Path) -> list[str]:
    return compare(manifest_of(head), manifest_of(worker), "spark1").differ


def test_identical_copies_do_not_differ(tmp_path: Path) -> None:
    head, worker = nodes(tmp_path)
    os.utime(worker / "config.json", (1, 1))  # a copy need not keep mtimes
    assert differ(head, worker) == []


def test_a_corrupted_shard_on_the_worker_is_named_with_the_node(tmp_path: Path) -> None:
    head, worker = nodes(tmp_path)
    corrupt(worker / "model-00003-of-00004.safetensors")
    found = differ(head, worker)
    assert len(found) == 1 and found[0].startswith("model-00003-of-00004.safetensors has sha256 ")
    assert found[0].endswith("on spark1")
    failure = refusal([], [compare(manifest_of(head), manifest_of(worker), "spark1")])
    assert failure is not None and failure.cls is FailureClass.config_error
    assert "1 file(s) differ on spark1: model-00003-of-00004.safetensors" in failure.sentence


def test_a_swapped_tokenizer_and_a_truncated_index_are_named(tmp_path: Path) -> None:
    head, worker = nodes(tmp_path)
    (worker / "tokenizer.json").write_text('{"version": "1.0", "vocab": {"b": 1}}')  # same size, other content
    index = worker / "model.safetensors.index.json"
    index.write_text(index.read_text()[:40])
    found = differ(head, worker)
    assert any(f.startswith("tokenizer.json has sha256") for f in found)
    assert any(f.startswith("model.safetensors.index.json is ") and "bytes on the head but" in f for f in found)


def test_a_missing_shard_and_a_shard_without_hash_yet(tmp_path: Path) -> None:
    head, worker = nodes(tmp_path)
    (worker / "model-00004-of-00004.safetensors").unlink()
    pending = manifest_of(head, stop=deadline(0.0))
    c = compare(pending, manifest_of(worker), "spark1")
    assert c.differ == ["model-00004-of-00004.safetensors is missing on spark1"]
    assert len(c.by_size) == SHARDS - 1


def test_verify_finds_a_shard_changed_in_place_and_a_truncated_index(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    before = manifest_of(root)
    shard = root / "model-00001-of-00004.safetensors"
    st = shard.stat()
    corrupt(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as recorded: bit rot
    now = manifest_of(root, known=before.files, full=True)
    assert changed_in_place(before.files, now)[0].startswith("model-00001-of-00004.safetensors changed in place")
    assert manifest_of(root, known=before.files).files[shard.name].sha256 == before.files[shard.name].sha256
    (root / "model-00002-of-00004.safetensors").unlink()
    index = root / "model.safetensors.index.json"
    m = manifest_of(root)
    assert index_problems(read_indexes(root, m), m) == [
        "model.safetensors.index.json lists 1 shard(s) that are not there: model-00002-of-00004.safetensors"]
    index.write_text(index.read_text()[:30])
    assert "not a readable index" in index_problems(read_indexes(root, m), m)[0]


def config(tmp_path: Path, **over: Any) -> Any:
    data: dict[str, Any] = {"runtime": "process", "launch": {"model": str(tmp_path / "m")},
                            "paths": {"state_dir": str(tmp_path / "state")}}
    data.update(over)
    return config_from_mapping(data, env={})


def test_the_model_directory_on_the_host(tmp_path: Path) -> None:
    assert model_dir(config(tmp_path))[0] == tmp_path / "m"
    assert model_dir(config(tmp_path, launch={"model": "org/name"}))[0] is None
    docker = config(tmp_path, runtime="docker-run", container={"image": "i", "mounts": [
        {"source": "/srv/models", "target": "/models"}, {"source": "/srv/models/big", "target": "/models/big"}]},
        launch={"model": "/models/big/ds4"})
    assert model_dir(docker) == (Path("/srv/models/big/ds4"), "[launch] model through the mount "
                                                               "/srv/models/big:/models/big")
    named = config(tmp_path, runtime="docker-run", container={"image": "i", "mounts": [
        {"source": "hf", "target": "/models"}]}, launch={"model": "/models/x"})
    assert model_dir(named)[0] is None
    assert model_dir(config(tmp_path, weights={"path": "/data/x"}))[0] == Path("/data/x")


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append((event, kw))


def test_a_start_does_not_wait_for_background_hashing(tmp_path: Path) -> None:
    """A start interrupts the background hashing between two chunks and goes first."""
    model(tmp_path / "m", shard_bytes=32 << 20)
    cfg = config(tmp_path, weights={"hash_budget_s": 0})
    keeper = LocalWeights(lambda: cfg, log=Log())
    spawned: list[Any] = []
    keeper.spawn = spawned.append

    async def main() -> tuple[int, int]:
        first = await keeper.manifest()  # budget 0: every shard pending, the rest for the background
        assert len(first.pending) == SHARDS and spawned
        entered, interrupt = threading.Event(), keeper._interrupt

        def slow_stop() -> bool:  # the background, between two chunks: it carries on unless a start interrupts
            entered.set()
            interrupt.wait(10)
            return interrupt.is_set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper._finish_with, slow_stop)
            await anyio.to_thread.run_sync(entered.wait)
            started = time.monotonic()
            second = await keeper.manifest()
            took = time.monotonic() - started
            tg.cancel_scope.cancel()
        assert took < 5, f"the start waited {took:.1f} s for the background"
        return len(first.pending), len(second.hashed)

    pending, hashed = anyio.run(main)
    assert pending == SHARDS and hashed >= 3


def test_sparkd_weights_verify_reports_and_exits(tmp_path: Path) -> None:
    root = model(tmp_path / "m")
    cfg = tmp_path / "sparkd.toml"
    cfg.write_text(f'runtime = "process"\n[launch]\nmodel = "{root}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).parent / "sparkd"), "weights", "verify", "--config",
                               str(cfg), *args], capture_output=True, text=True, timeout=60)

    first = run()
    assert first.returncode == 0, first.stderr
    assert "7 files, 7 hashed now, 0 unchanged since last hashed" in first.stdout and "sound" in first.stdout
    second = run()
    assert "3 hashed now, 4 unchanged since last hashed" in second.stdout
    shard = root / "model-00004-of-00004.safetensors"
    st = shard.stat()
    corrupt(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run().returncode == 0  # size and mtime unchanged: only --full reads it
    full = run("--full", "--json")
    assert full.returncode == 1
    assert "model-00004-of-00004.safetensors changed in place" in json.loads(full.stdout)["problems"][0]
