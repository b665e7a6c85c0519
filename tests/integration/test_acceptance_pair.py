"""The acceptance gate on a pair (issue 37): two daemons in two network namespaces, the stand-in's ranks, the head's
gate speaking for the group. Each part is caught with the stand-in told how to go wrong (its control file, or its
launch knobs): answers that change while it serves (a replay finds them), a repetition loop and garbled text (the
garble levels), a speculative decoder that stops accepting drafts, NaNs in the logits, a capacity below the band.
Never a restart: the launches stay what they were."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from daemon_harness import render_toml
from pair_harness import NodeDaemon, Pair

# Replays a second after the last gate once the engine is idle for half a second: a drift shows in seconds.
GATE = {"enabled": True, "replay_interval_s": 1, "replay_idle_s": 0.5, "garble_levels": [1, 2, 4]}
DRAFTS = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
_IDS = itertools.count(1)


def tell(control: Path, what: str) -> None:
    """One command to the stand-in's head (sparkd_standin/control.py), once it has taken the one before: it polls
    the file, so a command written over before a poll saw it would be lost on a busy machine."""
    ident = str(next(_IDS))
    control.write_text(f"{ident} {what}\n")
    done = control.with_name(control.name + ".done")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if done.exists() and done.read_text().strip() == ident:
            return
        time.sleep(0.05)
    raise AssertionError(f"the stand-in did not take {what!r} within 30 s")


def gate_of(daemon: NodeDaemon) -> dict[str, Any]:
    return daemon.status().get("acceptance") or {}


def accept(daemon: NodeDaemon) -> Any:
    return daemon.ctl("--json", "accept", timeout=120)


def incident_of(daemon: NodeDaemon, cls: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [i for i in daemon.incidents() if i["class"] == cls]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {cls} incident: {daemon.incidents()}")


def no_restart(pair: Pair, launches: int, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = pair.head.status()
        assert status.get("launches") == launches and status.get("state") != "stopping", status
        time.sleep(0.2)


def test_the_head_gates_the_pair_and_every_part_is_caught_without_a_restart(make_pair: Any, tmp_path: Path) -> None:
    control = tmp_path / "standin-control"
    control.write_text("")
    pair = make_pair(acceptance=GATE, launch={"speculative_config": DRAFTS,
                                              "env": {"SPARKD_STANDIN_CONTROL_FILE": str(control),
                                                      "VLLM_COMPUTE_NANS_IN_LOGITS": "1"}}).start()
    pair.ready()
    before = len(pair.head.incidents())  # the first start may have waited for the worker's sparkd (peer_lost)
    head = pair.head.status()
    gate = head["acceptance"]
    assert gate["verdict"] == "pass" and gate["kind"] == "start", gate
    assert [p["part"] for p in gate["parts"]] == ["capacity", "fingerprint", "garble", "spec_decode", "numerics"]
    assert "accepting" in [h["state"] for h in head["history"]]
    assert head["start_timing"]["accept_s"] is not None
    worker = pair.worker.status()
    assert worker["acceptance"]["verdict"] is None and "accepting" not in [h["state"] for h in worker["history"]], \
        "a led rank: the head's gate speaks for the group"
    refused = pair.worker.ctl("accept")
    assert refused.returncode != 0 and "run `sparkctl accept` on the head" in refused.stdout + refused.stderr

    # answers that change while it serves: a replay (idle) finds them; degraded, an incident, no restart
    tell(control, "answers changed")
    status = pair.head.wait_for(lambda s: s.get("state") == "degraded", 30, "the replay finds the drift")
    assert status["acceptance"]["verdict"] == "answers_changed" and status["acceptance"]["kind"] == "replay"
    assert status["last_failure"]["class"] == "answers_changed"
    incident = incident_of(pair.head, "answers_changed")
    assert "the golden answered" in incident["evidence"] and "; now " in incident["evidence"]
    no_restart(pair, 1)
    passed = accept(pair.head)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    pair.head.wait_state("ready", 10)

    # a repetition loop: the garble levels of `sparkctl accept` catch it (a replay asks no garble levels)
    tell(control, "answers loop")
    looped = accept(pair.head)
    assert looped.returncode == 1 and '"verdict": "garbled"' in looped.stdout and "loop" in looped.stdout, \
        looped.stdout
    pair.head.wait_state("degraded", 10)  # status.json follows the verdict (written off the loop)

    # garbled text, likewise
    tell(control, "answers garble")
    garbled = accept(pair.head)
    assert '"verdict": "garbled"' in garbled.stdout, garbled.stdout

    # a speculative decoder that stops accepting: lost performance, said, served (the default warn)
    tell(control, "answers changed")
    tell(control, "spec off")
    inactive = accept(pair.head)
    assert '"verdict": "spec_decode_inactive"' in inactive.stdout, inactive.stdout
    status = pair.head.wait_for(lambda s: (s.get("acceptance") or {}).get("verdict") == "spec_decode_inactive", 10,
                                "status.json has the accept's verdict")
    assert status["state"] == "degraded" and status["ready"] and not status["acceptance"]["refused"]
    assert status["last_failure"]["class"] == "capacity_lost"

    # NaNs in the logits: vllm:corrupted_requests moves
    tell(control, "spec on")
    tell(control, "nans on")
    corrupted = accept(pair.head)
    assert '"verdict": "corrupted"' in corrupted.stdout, corrupted.stdout
    pair.head.wait_for(lambda s: (s.get("last_failure") or {}).get("class") == "answers_garbled", 10,
                       "status.json has the NaNs' verdict")
    tell(control, "nans off")
    assert accept(pair.head).returncode == 0
    pair.head.wait_state("ready", 10)
    no_restart(pair, 1, seconds=1.0)
    assert {i["class"] for i in pair.head.incidents()[before:]} == {"answers_changed", "answers_garbled",
                                                                     "capacity_lost"}
    assert pair.worker.status()["launches"] == 1


def test_a_start_that_garbles_or_lost_capacity_is_held_or_warned_never_restarted(make_pair: Any) -> None:
    pair = make_pair(acceptance={**GATE, "replay_interval_s": 0},
                     launch={"env": {"SPARKD_STANDIN_ANSWERS": "garble"}}).start()
    status = pair.head.wait_for(lambda s: (s.get("acceptance") or {}).get("refused") is True, 90,
                                "the head's gate refuses the garbled start")
    assert status["state"] == "accepting" and not status["ready"]
    assert status["last_failure"]["class"] == "answers_garbled"
    assert "sparkd keeps it from ready and does not restart it" in status["acceptance"]["sentence"]
    launches = status["launches"]
    no_restart(pair, launches, seconds=5.0)
    assert pair.head.ctl("status").returncode == 3, "held: not serving"

    # the capacity band above what the stand-in logs: lost capacity named with its size, served (warn)
    kv = pair.head.status()["kv_cache_tokens"]
    assert kv, "the stand-in logs its KV cache size"
    head = pair.head
    head.config["acceptance"] = {**head.config["acceptance"], "kv_cache_tokens": [kv * 2, kv * 3]}
    head.config["launch"]["env"].pop("SPARKD_STANDIN_ANSWERS")
    head.config_path.write_text(render_toml(head.config))
    assert head.ctl("reload").returncode == 0
    assert head.ctl("restart").returncode == 0
    status = head.wait_for(lambda s: s.get("launches", 0) > launches and s.get("state") == "degraded", 90,
                           "the restarted pair serves degraded")
    gate = status["acceptance"]
    assert gate["verdict"] == "capacity_lost" and not gate["refused"], gate
    capacity = next(p for p in gate["parts"] if p["part"] == "capacity")
    assert capacity["facts"]["lost_tokens"] == kv and capacity["facts"]["lost_share"] == 0.5, capacity
    assert "below [acceptance]'s band" in capacity["sentence"] and "vLLM serves anyway" in gate["sentence"]
