"""The ranks' builds (``build-parity``, vllm #42354 and #52504): the probe reads vLLM, torch, torch's CUDA and NCCL
(version from the library itself, and the library's sha256) where vLLM runs, the preflight caches it per image or
executable, and the head refuses to start workers whose builds differ from its own."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import fakebuilds
import pytest
from structlog.testing import CapturingLogger

from sparkd.cluster.addresses import PeerAddresses
from sparkd.cluster.coordinator import Coordinator
from sparkd.cluster.shared import build_differences, builds_of
from sparkd.config import config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.builds import BUILDS_SNIPPET, check_builds, describe, last_builds, parse_builds
from sparkd.runtime.process import ProcessRuntime
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock

HERE = {"vllm": "0.34.0", "torch": "2.9.1", "cuda": "13.0", "nccl": "2.28.9", "nccl_sha256": "a" * 64}


@pytest.mark.parametrize(("there", "said"), [
    (HERE, []),
    ({**HERE, "nccl": "2.30.4", "nccl_sha256": "b" * 64},
     ["NCCL is 2.28.9 here but 2.30.4 on w", "w runs another NCCL library: libnccl sha256 aaaaaaaaaaaa here, "
      "bbbbbbbbbbbb there"]),
    ({**HERE, "nccl_sha256": "c" * 64},
     ["w runs the same NCCL version (2.28.9) but another build: libnccl sha256 aaaaaaaaaaaa here, cccccccccccc "
      "there"]),
    ({**HERE, "vllm": "0.33.1", "cuda": "12.8"}, ["vLLM is 0.34.0 here but 0.33.1 on w",
                                                  "torch's CUDA is 13.0 here but 12.8 on w"]),
    ({**HERE, "nccl": None, "nccl_sha256": None, "torch": None}, []),  # not known there: not compared
])
def test_build_differences_name_both_sides(there: dict[str, Any], said: list[str]) -> None:
    assert build_differences(HERE, there, peer="w") == said


def test_nothing_to_compare_is_no_difference() -> None:
    assert build_differences(None, HERE, peer="w") == build_differences(HERE, {}, peer="w") == []
    assert builds_of({"image": {"id": "sha256:1", "builds": HERE}}) == HERE == builds_of({"builds": HERE})
    assert builds_of(None) is None and builds_of({"image": None}) is None


def test_the_probes_line_is_parsed_and_described() -> None:
    out = 'noise\nSPARKD-BUILDS {"vllm": "0.34.0", "torch": null, "cuda": "13.0", "nccl": "2.28.9", ' \
          '"nccl_sha256": "' + "d" * 64 + '"}\n'
    builds = parse_builds(out)
    assert builds is not None and builds["torch"] is None and builds["nccl"] == "2.28.9"
    assert describe(builds) == "vLLM 0.34.0, torch unknown (CUDA 13.0), NCCL 2.28.9 (libnccl sha256 dddddddddddd)"
    assert parse_builds("SPARKD-BUILDS [1]") is None and parse_builds("nothing") is None


@pytest.fixture
def fake_site(tmp_path: Path) -> Path:
    """A site-packages with vLLM, torch (built for CUDA 12.8) and the NCCL wheel, whose libnccl.so.2 is a real shared
    library answering ncclGetVersion with 2.28.9."""
    return fakebuilds.fake_site(tmp_path)


def test_the_probe_reads_versions_cuda_and_the_nccl_library(fake_site: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", BUILDS_SNIPPET], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(fake_site), "PATH": "/usr/bin:/bin"}, check=False)
    builds = parse_builds(proc.stdout)
    assert builds is not None, proc.stderr
    lib = fake_site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    assert builds == {"vllm": "0.34.0", "torch": "2.9.1", "nccl_wheel": "2.28.9", "cuda": "12.8",
                      "nccl_lib": str(lib), "nccl_sha256": hashlib.sha256(lib.read_bytes()).hexdigest(),
                      "nccl": "2.28.9"}


@pytest.mark.anyio
async def test_the_preflight_reads_the_builds_once_per_executable_and_reports_the_last(tmp_path: Path,
                                                                                        fake_site: Path) -> None:
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n")
    exe.chmod(0o755)
    cfg = config_from_mapping({"runtime": "process", "paths": {"state_dir": str(tmp_path / "state")},
                               "launch": {"executable": str(exe), "model": "/m",
                                          "env": {"PYTHONPATH": str(fake_site)}}}, env={})
    (tmp_path / "state").mkdir()
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path / "run"))
    first = await check_builds(ctx)
    assert first.verdict is Verdict.ok and first.found.startswith("vLLM 0.34.0, torch 2.9.1 (CUDA 12.8), NCCL 2.28.9")
    last = last_builds(tmp_path / "state")
    assert last is not None and last["nccl"] == "2.28.9" and last["identity"].startswith(f"exe:{exe} ")
    (fake_site / "vllm-0.34.0.dist-info").rename(fake_site / "vllm-0.35.0.dist-info")  # read once: cached
    assert (await check_builds(ctx)).found.endswith("(cached)")
    assert last_builds(tmp_path / "state", identity="sha256:other") is None
    data = json.loads((tmp_path / "state" / "builds.json").read_text())
    assert list(data["entries"]) == [data["last"]]


# ---- the head before it starts its workers


class Link:
    def __init__(self, status: dict[str, Any]) -> None:
        self.answer = status
        self.started: list[str] = []

    @property
    def peers(self) -> list[str]:
        return ["w"]

    async def status(self, peer: str, **kw: Any) -> dict[str, Any]:
        return self.answer

    async def call(self, peer: str, command: Any, request: Any, **kw: Any) -> dict[str, Any]:
        self.started.append(peer)
        self.answer = {**self.answer, "state": "starting", "pid": 9, "phase": "rendezvous"}
        return {}


def head(link: Link, mine: dict[str, Any] | None, allow: tuple[str, ...] = ()) -> Coordinator:
    cfg = config_from_mapping({
        "runtime": "process", "node": {"name": "head", "role": "head"}, "lint": {"allow": list(allow)},
        "launch": {"executable": "/usr/bin/true", "model": "/models/m"},
        "cluster": {"master_addr": "10.0.0.1", "nnodes": 2, "peers": ["w"]}}, source="test", env={})
    return Coordinator(lambda: cfg, link, post=lambda obs: None, state=lambda: State.ready,  # type: ignore[arg-type]
                       image=lambda: None if mine is None else {"id": "sha256:1", "builds": mine},
                       clock=FakeClock(), log=CapturingLogger(), addresses=PeerAddresses(cfg.cluster.peers))


@pytest.mark.anyio
async def test_the_head_refuses_workers_whose_builds_differ() -> None:
    link = Link({"state": "stopped", "image": {"id": "sha256:2", "builds": {**HERE, "nccl_sha256": "e" * 64}}})
    failure = await head(link, HERE).start_workers()
    assert failure is not None and failure.cls is FailureClass.config_error and link.started == []
    assert "same NCCL version (2.28.9) but another build" in failure.sentence and "vllm #42354" in failure.sentence


@pytest.mark.anyio
@pytest.mark.parametrize(("mine", "theirs", "allow"), [
    (HERE, HERE, ()), (None, {**HERE, "nccl": "2.30.4"}, ()), (HERE, None, ()),
    (HERE, {**HERE, "nccl": "2.30.4"}, ("build-parity",))])
async def test_the_head_starts_workers_when_the_builds_agree_or_are_unknown_or_allowed(
        mine: dict[str, Any] | None, theirs: dict[str, Any] | None, allow: tuple[str, ...]) -> None:
    link = Link({"state": "stopped", "image": {"id": "sha256:2", **({"builds": theirs} if theirs else {})}})
    assert await head(link, mine, allow).start_workers() is None and link.started == ["w"]
