"""sparkd supervising the real vLLM 0.32 (issue 25): every scenario against one shared daemon and vLLM, in order.

Each fault asserts the class, the facts of the sentence, that ``sparkd explain`` on the incident folder's own log
tail gives the same class, and recovery (ready again, or for the errors retrying cannot fix: the breaker open at once,
and ready again once the config is fixed and the breaker reset). The tier's wall time is printed at the end
(``real-vLLM tier timings``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from tier import START_S, Tier

pytestmark = pytest.mark.timeout(900)

EXPECTED_PHASES = {"launching", "loading_weights", "compiling", "kv_cache", "api_starting"}


def fault(tier: Tier, name: str, act: Callable[[], None], cls: str | tuple[str, ...], *words: str,
          absent: tuple[str, ...] = ()) -> dict[str, Any]:
    """From ready: do ``act``; the new incident has class ``cls`` (or one of them) and a sentence with ``words``;
    explain agrees; ready again."""
    tier.wait_ready()
    seen = len(tier.incidents())
    began = time.monotonic()
    act()
    incident = tier.new_incident(seen)
    tier.timed(f"{name}: detected", began)
    assert incident["class"] in ((cls,) if isinstance(cls, str) else cls), incident
    for word in words:
        assert word in incident["message"], (word, incident["message"])
    for word in absent:
        assert word not in incident["message"], (word, incident["message"])
    assert tier.explain(incident)["class"] == incident["class"]
    passed_the_gate(tier, tier.wait_ready())
    tier.timed(f"{name}: ready again", began)
    return incident


def passed_the_gate(tier: Tier, status: dict[str, Any]) -> None:
    """Ready through the acceptance gate (issue 37): this launch's answers matched the golden the first start
    recorded — a restart of the same model gives the same answers (the tier counts them: `tier.gates`)."""
    gate = status["acceptance"]
    assert gate["verdict"] == "pass" and gate["kind"] == "start", gate
    fingerprint = next(p for p in gate["parts"] if p["part"] == "fingerprint")
    assert "6 answers match the golden" in fingerprint["sentence"], fingerprint
    tier.gates.append(fingerprint["sentence"])


def test_ready_with_every_phase_timed(tier: Tier) -> None:
    status = tier.wait_ready()
    tier.timed("first start", tier.began)
    phases = status["start_timing"]["phases_s"]
    assert set(phases) >= EXPECTED_PHASES, phases
    assert "waiting_for_peer" not in phases, "a world of one waits for no peer"
    assert phases["launching"] > 1.0, "imports and the engine core's spawn take seconds, and are timed"
    assert status["kv_cache_tokens"] and status["kv_cache_tokens"] > 0, "CPU KV cache size: N tokens is read"
    assert status["shards"] == [1, 1]
    gate = status["acceptance"]
    assert "accepting" in [h["state"] for h in status["history"]] and status["start_timing"]["accept_s"] > 0
    assert gate["verdict"] == "pass" and "6 answers recorded as the golden (no golden yet)" in gate["parts"][1][
        "sentence"], gate
    assert list((tier.tmp / "d" / "state" / "acceptance").glob("golden-*.json")), "the golden is kept"


def test_probes_stay_out_of_the_log_and_clients_do_not(tier: Tier) -> None:
    tier.wait_ready()
    assert tier.complete("hello there") == 200
    time.sleep(4)  # several /health, /metrics and canary probes
    logs = tier.ctl("logs", "-n", "400").stdout
    assert '"POST /v1/completions HTTP/1.1" 200' in logs, "an operator's own request stays in the log"
    assert "probe=sparkd" not in logs and "probe=sparkd" not in tier.vllm_log()
    assert '"GET /health' not in logs


def test_handover_and_adoption(tier: Tier) -> None:
    pid = tier.wait_ready()["pid"]
    result = tier.ctl("handover")
    assert result.returncode == 0, result.stdout + result.stderr
    assert tier.daemon.proc is not None and tier.daemon.proc.wait(60) == 0
    assert psutil.pid_exists(pid) and tier.complete("still serving") == 200, "vLLM outlives its daemon"
    began = time.monotonic()
    tier.daemon.start()
    status = tier.daemon.wait_for(lambda s: s.get("state") == "ready" and (s.get("start_timing") or {}).get(
        "adopted") is True, 60, "the new daemon's status: ready, adopted")
    assert status["pid"] == pid
    assert tier.timed("adoption", began) < 30
    # ready at once, then its answers replayed beside it: the same as the golden the first start recorded
    gate = tier.daemon.wait_for(lambda s: (s.get("acceptance") or {}).get("verdict") is not None, 60,
                                "the adopted vLLM's answers replayed")["acceptance"]
    assert gate["kind"] == "adopted" and gate["verdict"] == "pass", gate
    assert [p["part"] for p in gate["parts"]] == ["fingerprint"], "a replay: no capacity (its start was not seen)"
    assert gate["parts"][0]["sentence"] == "6 answers match the golden exactly.", gate


def test_engine_core_sigkill_is_engine_dead(tier: Tier) -> None:
    fault(tier, "EngineCore SIGKILL", lambda: tier.child("EngineCore").kill(), "engine_dead",
          "engine core process exited unexpectedly")


def warmed(tier: Tier) -> None:
    """Ready, and past the first requests' compile: vLLM's CPU build compiles (g++) for the first shapes it serves,
    and sparkd rightly holds every wedge verdict while a compile runs in vLLM's tree (up to vLLM's execute timeout),
    so a stop during that compile would be a different scenario."""
    tier.wait_ready()
    assert tier.complete("warm up", max_tokens=4) == 200
    time.sleep(5)  # a canary answered and a scrape saw the step: the compile hold is over


def test_engine_core_sigstop_idle_is_named_by_its_pid(tier: Tier) -> None:
    """The step probe (on by default) names the stopped engine core when the canary's request gets no step: by its
    PID and state, before the canary's own timeout; one engine, so no tensor-parallel group is blamed."""
    warmed(tier)
    engine = tier.child("EngineCore")
    incident = fault(tier, "EngineCore SIGSTOP idle", engine.suspend, ("stall", "hang"),
                     f"PID {engine.pid}, stopped (SIGSTOP)", absent=("tensor-parallel", "idle batch"))
    assert "the engine core (engine 0) on realvllm" in (incident.get("steps") or ""), incident


def test_engine_core_sigstop_with_requests_in_flight(tier: Tier) -> None:
    """Which rule names it depends on where the engine stopped: inside a step (the only rank stuck in it: a `stall`),
    between steps holding the requests (it stopped scheduling: a `stall`), or in its own part of a step while its
    worker waits (a `hang`). Either way the process is named, and never the single node's missing peer."""
    warmed(tier)
    engine = tier.child("EngineCore")

    def stop_mid_generation() -> None:
        tier.clients_in_flight(3)
        time.sleep(3)  # the clients' generations are running
        engine.suspend()

    fault(tier, "EngineCore SIGSTOP in flight", stop_mid_generation, ("stall", "hang"),
          f"PID {engine.pid}, stopped (SIGSTOP)", absent=("tensor-parallel", "idle batch", "while idle"))


def test_api_server_sigkill_leaves_no_orphans(tier: Tier) -> None:
    tier.wait_ready()
    orphans = [p.pid for p in tier.main().children(recursive=True)]
    assert orphans, "the API server has children (the engine core, its worker)"
    incident = fault(tier, "API server SIGKILL", lambda: tier.main().kill(), "unknown",
                     "killed by SIGKILL from outside sparkd")
    assert incident["evidence"] is None or "WARNING" not in incident["evidence"], incident["evidence"]
    left = [pid for pid in orphans if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not left, f"the old engine core and worker were swept: {left} remain"


def test_outside_sigterm_to_the_engine_core_is_named(tier: Tier) -> None:
    fault(tier, "EngineCore outside SIGTERM", lambda: tier.child("EngineCore").terminate(), "engine_dead",
          "received SIGTERM from outside sparkd", absent=("parent process",))


def test_a_bad_flag_is_caught_by_the_vllm_args_preflight(tier: Tier) -> None:
    tier.wait_ready()
    seen = len(tier.incidents())
    launches = tier.vllm_log().count("---- sparkd: launch ")
    tier.reconfigure(extra_args=("--dtype", "float8"))
    began = time.monotonic()
    assert tier.ctl("restart").returncode == 0
    status = tier.wait_state("failed", 120)
    tier.timed("bad flag: failed", began)
    incident = tier.new_incident(seen)
    assert incident["class"] == "config_error", incident
    assert "vLLM rejects the rendered argv" in incident["message"] and "invalid choice: 'float8'" in incident["message"]
    assert "config error" in status["breaker"]["reason"]
    assert tier.vllm_log().count("---- sparkd: launch ") == launches, "nothing was launched"
    assert tier.explain(incident)["class"] == "config_error"


def test_a_broken_install_is_an_image_error_from_preflight(tier: Tier) -> None:
    """The CUDA build of torchvision that pip took from PyPI (ensure.py kept it aside) first on vLLM's path: the
    review's first blocker (reviews/real-vllm.md §1)."""
    seen = len(tier.incidents())
    tier.reconfigure(env={"PYTHONPATH": str(tier.venv / "broken-image")})
    began = time.monotonic()
    assert tier.ctl("reset").returncode == 0
    incident = tier.new_incident(seen, timeout=180)
    tier.wait_state("failed", 30)
    tier.timed("broken install (preflight): failed", began)
    assert incident["class"] == "image_error", incident
    message = incident["message"]
    assert "importing torchvision" in message and "operator torchvision::nms does not exist" in message, message
    assert "rejects the rendered argv" not in message and "unknown" not in message
    assert tier.explain(incident)["class"] == "image_error"


def test_a_broken_install_is_an_image_error_from_the_log(tier: Tier) -> None:
    seen = len(tier.incidents())
    tier.reconfigure(env={"PYTHONPATH": str(tier.venv / "broken-image")}, skip=("vllm_args",))
    began = time.monotonic()
    assert tier.ctl("reset").returncode == 0
    incident = tier.new_incident(seen, timeout=180)
    status = tier.wait_state("failed", 30)
    tier.timed("broken install (log): failed", began)
    assert incident["class"] == "image_error", incident
    assert "importing torchvision" in incident["message"] and "(exit 1)" in incident["message"], incident["message"]
    assert "image error" in status["breaker"]["reason"], "no backoff: retrying cannot help"
    assert tier.explain(incident)["class"] == "image_error"


def test_fixed_then_restart_wait_follows_the_phases_to_ready(tier: Tier) -> None:
    """Recovery from the errors retrying cannot fix: the config fixed, `sparkctl restart --wait` closes the breaker
    and follows the cold start phase by phase (a world of one never waits for a peer)."""
    tier.reconfigure()
    began = time.monotonic()
    result = tier.ctl("restart", "--wait", timeout=START_S)
    tier.timed("fixed, restart --wait: ready again", began)
    assert result.returncode == 0, result.stdout + result.stderr
    for step in ("starting", "starting: loading weights", "starting: compiling and profiling", "starting: KV cache",
                 "accepting", "ready after"):
        assert step in result.stdout, (step, result.stdout)
    assert "waiting for the peer" not in result.stdout
    assert tier.complete("back") == 200
    passed_the_gate(tier, tier.wait_ready())
    print(f"realvllm: the acceptance gate passed {len(tier.gates)} restarts of the tier, "
          f"{sum('exactly' in g for g in tier.gates)} exactly (the same launch), the rest closely")


def test_explain_gives_every_incidents_own_class(tier: Tier) -> None:
    incidents = tier.incidents()
    classes = [i["class"] for i in incidents]
    assert classes[1] in ("stall", "hang") and classes[2] in ("stall", "hang"), classes
    assert classes[:1] + classes[3:] == ["engine_dead", "unknown", "engine_dead", "config_error", "image_error",
                                         "image_error"], classes
    for incident in incidents:
        assert tier.explain(incident)["class"] == incident["class"], incident["path"]
