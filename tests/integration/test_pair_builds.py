"""The head compares the ranks' builds before it starts a worker (``build-parity``, issue 40), on the stand-in pair:
each node's launch runs with a site-packages of its own (``PYTHONPATH``: vLLM, torch, the NCCL wheel and a real
libnccl.so.2, tests/fakebuilds.py), which each node's ``builds`` preflight reads and its status carries with its image
facts. A worker whose NCCL differs is refused before its rank starts, the sentence naming both builds;
``[lint] allow = ["build-parity"]`` (a reload, then ``sparkctl reset``) lets the same pair through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from daemon_harness import render_toml
from fakebuilds import fake_site


def test_a_worker_whose_builds_differ_is_refused_naming_both_and_lint_allow_lets_it_through(
        make_pair: Any, tmp_path: Path) -> None:
    (tmp_path / "head-builds").mkdir()
    (tmp_path / "worker-builds").mkdir()
    head_site = fake_site(tmp_path / "head-builds", nccl="2.28.9")
    worker_site = fake_site(tmp_path / "worker-builds", nccl="2.30.4")
    pair = make_pair(launch={"env": {"PYTHONPATH": str(head_site)}},
                     worker_launch={"env": {"PYTHONPATH": str(worker_site), "SPARKD_STANDIN_STARTUP_SECONDS": "0.5"}})
    pair.start()
    status = pair.head.wait_state("failed", timeout=90)
    failure = status["last_failure"]
    worker = pair.link.worker_addr
    assert failure["class"] == "config_error", failure
    assert failure["message"].startswith(f"The group's builds differ: NCCL is 2.28.9 here but 2.30.4 on {worker}; "
                                         f"{worker} runs another NCCL library: libnccl sha256 "), failure
    assert "[lint] allow = [\"build-parity\"]" in failure["message"]
    assert status["image"]["builds"]["nccl"] == "2.28.9"  # the head's own, from its preflight
    worker_status = json.loads(pair.worker.ctl("--json", "status").stdout)  # what the head reads of it
    assert worker_status["image"]["builds"]["nccl"] == "2.30.4" and worker_status["pid"] is None  # never started

    pair.head.config["lint"] = {"allow": ["build-parity"]}
    pair.head.config_path.write_text(render_toml(pair.head.config))
    reloaded = pair.head.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
    reset = pair.head.ctl("reset")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    pair.ready(head_launches=1, timeout=120)
    assert pair.head.status()["last_failure"]["class"] == "config_error"  # the refusal before, nothing since
