"""The acceptance gate against the real vLLM 0.32 (issue 37), through the daemon: a daemon of its own (tier.py) over a
copy of the tiny model, so the shared one is never changed.

In order, reusing every start it can: the first start passes and records the golden; ``SPARKD_REALVLLM_RESTARTS``
restarts match it exactly (default 0 here: in the same suite the tier's own fault scenarios restart the shared
daemon's vLLM 7 times and its hand-over adopts it once, each through the gate — test_tier.py's ``passed_the_gate`` —
and a start of the tiny model costs 45-160 s on 2 shared cores; the long run is ``SPARKD_REALVLLM_RESTARTS=10``);
a replay while idle matches it too; the same model directory with other weights of the same shape
(make_tinyllm.py --weights, another seed) is ``answers_changed`` naming the weights, held in ``accepting`` —
running, not ready, never restarted — with the golden and the new answer in its incident and in ``sparkd explain``;
``sparkctl accept`` lets it serve; the garble levels find the random-weight model's answers garbled (``sparkctl
accept`` asks them: no start); a smaller KV budget is ``capacity_lost`` named with its size, served. Three starts in
all by default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tier import START_S, UNCOMPILED, Tier

pytestmark = pytest.mark.timeout(3600)
RESTARTS = int(os.environ.get("SPARKD_REALVLLM_RESTARTS", "0"))
HERE = Path(__file__).resolve().parent
# Replays 8 s after the last gate once vLLM has been idle 3 s: one shows within seconds.
GATE = {"garble_levels": [], "replay_interval_s": 8, "replay_idle_s": 3}


@pytest.fixture(scope="module")
def gated(realvllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    venv, shared = realvllm
    folder = tmp_path_factory.mktemp("gate")
    model = folder / "tinyllm"
    shutil.copytree(shared, model)
    tier = Tier(folder, venv, model, launch_args=UNCOMPILED, sections={"acceptance": GATE})
    try:
        yield tier
    finally:
        tier.close()


STARTS: list[float] = []  # seconds from `sparkctl restart` to the gate's verdict, each restart of the test


def restarted(tier: Tier, timeout: float = START_S) -> dict[str, Any]:
    """``sparkctl restart``, then the next launch's gate's verdict (ready, degraded, or held in accepting)."""
    launches = tier.status()["launches"]
    began = time.monotonic()
    assert tier.ctl("restart").returncode == 0

    def judged(s: dict[str, Any]) -> bool:
        held = (s.get("acceptance") or {}).get("refused") is True
        return s.get("launches", 0) > launches and (s.get("state") in ("ready", "degraded") or held)

    status = tier.daemon.wait_for(judged, timeout, "the restart's acceptance gate")
    STARTS.append(round(time.monotonic() - began, 1))
    if status.get("pid"):
        tier.sessions.add(int(status["pid"]))  # the teardown's proof that its processes are this test's
    return status


def fingerprint(gate: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = next(p for p in gate["parts"] if p["part"] == "fingerprint")
    return part


def test_golden_restarts_replay_new_weights_accept_garble_and_capacity(gated: Tier) -> None:
    tier, gates = gated, []
    first = tier.wait_ready()
    gate = first["acceptance"]
    assert gate["verdict"] == "pass" and gate["kind"] == "start", gate
    assert fingerprint(gate)["sentence"] == "6 answers recorded as the golden (no golden yet).", gate
    gates.append(gate["seconds"])
    for _ in range(RESTARTS):
        gate = restarted(tier)["acceptance"]
        assert gate["verdict"] == "pass" and fingerprint(gate)["sentence"] == "6 answers match the golden exactly.", \
            gate
        gates.append(gate["seconds"])

    # while idle, the answers are asked again and still match
    replay = tier.daemon.wait_for(lambda s: any(h["kind"] == "replay" for h in s["acceptance"]["history"]), 60,
                                  "a replay while idle")["acceptance"]["history"][-1]
    assert replay["verdict"] == "pass", replay

    # other weights of the same shape, in the same directory: changed answers, the weights named, held, no restart
    subprocess.run([str(tier.venv / "bin" / "python"), str(HERE / "make_tinyllm.py"), "--weights", str(tier.model),
                    "26"], check=True, timeout=600,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    seen = len(tier.incidents())
    held = restarted(tier)
    gate = held["acceptance"]
    assert held["state"] == "accepting" and not held["ready"] and gate["refused"], gate
    assert gate["verdict"] == "answers_changed", gate
    assert "since the golden, the weights (the model directory's manifest) " in gate["sentence"], gate["sentence"]
    assert "the image" not in gate["sentence"] and "flags" not in gate["sentence"]
    incident = tier.new_incident(seen)
    assert incident["class"] == "answers_changed"
    first_difference = fingerprint(incident["acceptance"])["facts"]["first_difference"]
    assert first_difference["golden"] != first_difference["now"], first_difference
    explained = tier.explain(incident)
    assert explained["class"] == "answers_changed" and "the golden answered" in explained["evidence"], explained
    launches = held["launches"]
    time.sleep(10)
    still = tier.status()
    assert still["state"] == "accepting" and still["launches"] == launches and still["pid"] == held["pid"], \
        "held: vLLM left running, never restarted"
    shown = tier.ctl("status")
    assert shown.returncode == 3 and "acceptance gate REFUSED ready (answers_changed)" in shown.stdout, shown.stdout

    # sparkctl accept: the new answers are the golden, and it serves
    accepted = tier.ctl("--json", "accept")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    verdict = json.loads(accepted.stdout)
    assert "by `sparkctl accept`; since the old golden the weights" in fingerprint(verdict)["sentence"], verdict
    assert tier.wait_state("ready", 10)["launches"] == launches

    # the garble levels on the random-weight model (`sparkctl accept` asks them, no start): garbled, never recorded
    tier.sections["acceptance"] = {**GATE, "garble_levels": [1, 2]}
    tier.reconfigure()
    garbled = tier.ctl("--json", "accept")
    assert garbled.returncode == 1 and json.loads(garbled.stdout)["verdict"] == "garbled", garbled.stdout
    assert "answers garbled (concurrency: " in json.loads(garbled.stdout)["sentence"]
    assert tier.wait_state("degraded", 10)["acceptance"]["verdict"] == "garbled"
    tier.sections["acceptance"] = GATE

    # a smaller KV budget (vLLM's CPU build lets VLLM_CPU_KVCACHE_SPACE override --kv-cache-memory-bytes, and an
    # empty value is an error in its workers: the variable is removed): lost capacity named with its size, served
    tier.reconfigure(extra_args=("--kv-cache-memory-bytes", str(768 * 1024**2)), env={"VLLM_CPU_KVCACHE_SPACE": None})
    smaller = restarted(tier)
    gate = smaller["acceptance"]
    assert smaller["state"] == "degraded" and smaller["ready"], smaller["state"]
    assert gate["verdict"] == "capacity_lost" and not gate["refused"], gate
    capacity = next(p for p in gate["parts"] if p["part"] == "capacity")
    assert capacity["facts"]["lost_share"] == pytest.approx(0.25, abs=0.01), capacity
    assert "fewer than the golden's" in capacity["sentence"] and "GiB of KV cache" in capacity["sentence"]
    assert fingerprint(gate)["ok"] is True, "its answers still agree (the flags changed, not the model)"
    print(f"\nrealvllm: acceptance through the daemon: gates {gates} s, restarts to a verdict {STARTS} s, "
          f"load {os.getloadavg()[0]:.1f}\nrealvllm: new weights: {held['acceptance']['sentence']}\n"
          f"realvllm: smaller KV cache: {gate['sentence']}", file=sys.stderr)
