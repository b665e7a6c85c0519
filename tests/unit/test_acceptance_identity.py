"""What a golden was recorded under (sparkd/acceptance/identity.py) and where it is kept (sparkd/state/golden.py):
the launch's hash ignores where vLLM listens and what it calls the model, not what changes an answer; the weights'
digest follows the content of the files; the golden's file is crash-only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkd.acceptance.identity import answer_argv, launch_identity, program_identity, weights_identity
from sparkd.config import WeightsConfig
from sparkd.preflight.manifest import Manifest, build
from sparkd.state.golden import GoldenStore, golden_path
from sparkd.supervisor.acceptance.answers import Answer, Capacity, Golden, Identity, Shape

ARGV = ["vllm", "serve", "/models/m", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8000",
        "--max-model-len", "512", "--dtype", "bfloat16"]


def test_where_vllm_listens_and_its_names_do_not_change_the_launchs_identity() -> None:
    base = launch_identity(ARGV, {"VLLM_CPU_KVCACHE_SPACE": "1"})
    moved = [*ARGV[:5], "--host=0.0.0.0", "--port", "9001", "--uvicorn-log-level", "warning", *ARGV[9:],
             "--disable-log-requests"]
    assert launch_identity(moved, {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "10.0.0.1",
                                   "SPARKD_REALVLLM_TIER": "/tmp/x"}) == base
    assert answer_argv(moved) == ["vllm", "serve", "/models/m", "--max-model-len", "512", "--dtype", "bfloat16"]


@pytest.mark.parametrize(("argv", "env"), [
    ([*ARGV[:-1], "float32"], {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    ([*ARGV, "--max-num-seqs", "4"], {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    (ARGV, {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ATTENTION_BACKEND": "FLASHINFER"}),
])
def test_what_can_change_an_answer_changes_it(argv: list[str], env: dict[str, str]) -> None:
    assert launch_identity(argv, env) != launch_identity(ARGV, {"VLLM_CPU_KVCACHE_SPACE": "1"})


def manifest(root: Path, *, full: bool = True) -> Manifest:
    cfg = WeightsConfig()
    return build(root, always=cfg.always_hash, ignore=cfg.ignore, known={}, full=full,
                 stop=(lambda: False) if full else (lambda: True))


def test_the_weights_identity_follows_the_files_without_reading_a_shard(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(b"a" * 64)
    os.utime(shard, ns=(10**18, 10**18))
    (tmp_path / ".sparkd-made").write_text("made")
    first = weights_identity(manifest(tmp_path))
    assert first is not None and first.startswith("sha256:")
    assert weights_identity(manifest(tmp_path, full=False)) == first, "a shard hashed or not: the same identity"
    (tmp_path / ".sparkd-made").write_text("again")  # ignored by [weights] ignore
    assert weights_identity(manifest(tmp_path)) == first
    shard.write_bytes(b"b" * 64)  # the same shape, other weights: written anew
    assert weights_identity(manifest(tmp_path, full=False)) not in (None, first)
    os.utime(shard, ns=(10**18, 10**18))
    (tmp_path / "config.json").write_text('{"a": 1}')  # a small file that changes answers: by its content
    assert weights_identity(manifest(tmp_path, full=False)) not in (None, first)
    assert weights_identity(manifest(tmp_path / "absent")) is None


def test_the_program_identity_moves_with_a_reinstall(tmp_path: Path) -> None:
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\n")
    first = program_identity(str(program))
    assert first == f"process:{program}@{program.stat().st_mtime_ns}"
    os.utime(program, ns=(1, 2))
    assert program_identity(str(program)) != first
    assert program_identity(str(tmp_path / "nothing")) is None


def golden(model: str = "/models/m") -> Golden:
    top = (((" Paris", -0.1),), ((".", -0.2),))
    answer = Answer("capital", "chat", (1, 2), " Paris.", "stop", (" Paris", "."), top)
    return Golden(Identity("img", "sha256:" + "1" * 64, "abc"), Shape(48, 1234, 5), {answer.key: answer},
                  Capacity(1000, 2.0, 500, 1.0), 1_800_000_000.0, model)


def test_the_golden_is_kept_per_model_and_a_bad_file_is_set_aside(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path)
    assert store.read("/models/m") is None
    assert store.write(golden()).ok and store.write(golden("/models/other")).ok
    assert store.read("/models/m") == golden() and store.read("/models/other") == golden("/models/other")
    path = golden_path(tmp_path, "/models/m")
    assert path.parent == tmp_path / "acceptance" and oct(path.stat().st_mode & 0o777) == "0o640"
    path.write_text('{"model": "/models/m", "answers": 3}')
    assert store.read("/models/m") is None
    assert not path.exists() and list(path.parent.glob(f"{path.name}.bad-*")), "set aside as evidence, not deleted"


def test_a_golden_that_cannot_be_written_says_where(tmp_path: Path) -> None:
    (tmp_path / "acceptance").write_text("a file where the folder goes")
    result = GoldenStore(tmp_path).write(golden())
    assert not result.ok and str(tmp_path / "acceptance") in (result.problem or "")
