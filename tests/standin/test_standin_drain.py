"""The stand-in drains as the real vLLM 0.32 does (issue 36): the same scenarios the real vLLM was recorded in
(tests/realvllm/record_drain.py: tests/data/vllm-drain-032.json and the realvllm-032-drain* logs), run against the
stand-in with the same harness (tests/drainwatch.py), must come out the same: which streams finish with every token,
what a newcomer gets during the drain, what ``/health`` says, whether vLLM exits, and the shapes of the shutdown
lines sparkd reads (sparkd.supervisor.drainlog)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from typing import Any

import drainwatch
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins
from test_standin_032 import DATA, shape

from sparkd.supervisor.drainlog import is_drain_line

RECORDED = json.loads((DATA / "vllm-drain-032.json").read_text())
LOGS = {"drain": "realvllm-032-drain", "abort": "realvllm-032-drain-abort", "deadline": "realvllm-032-drain-deadline",
        "cut": "realvllm-032-drain-cut"}
MODEL = "/models/tinyllm"
TOKENS_PER_S = "60"  # 480 tokens take 8 s: the streams outlast the SIGTERM by seconds, as the recording's did
# The stand-in's own word for the phase the recording's newcomers came in (its log, not a delay after the SIGTERM:
# on a loaded machine a fixed delay can land after a 3 s drain or after the streams' end): the drain, new requests
# refused; with --shutdown-timeout 0 the HTTP server gone.
DRAINING = r"\[shutdown\] API server: stopping engine client mode=drain "
HTTP_GONE = r"^INFO:\s+Shutting down$"
ENGINE_DRAINING = r"\[shutdown\] EngineCore: draining in-flight requests "
HEALTH_ANSWERED = r'"GET /health\?probe=sparkd HTTP/1.1" 200'


def behaviour(summary: dict[str, Any], drains: bool) -> dict[str, Any]:
    """What a client and an operator see of a stop, without the numbers that vary from run to run. ``drains``: the
    stop has a drain (``--shutdown-timeout`` > 0); without one, the first ``/health`` after the SIGTERM races the
    HTTP server's end (a check begun in that tenth of a second may still get its 200), so it is no behaviour."""
    during = [(d.get("status"), _message(d.get("body"))) for d in summary["during"]]
    return {
        "every stream complete": summary["complete"] == summary["streams"],
        "no stream complete": summary["complete"] == 0,
        "streams ended": summary["ended"] == summary["streams"],
        "stream errors": sorted(summary["errors"]),
        "newcomers": during,
        "health during the drain": summary["health_after_sigterm"][0] if drains else None,
        "exit": summary["exit_code"],
    }


def _message(body: str | None) -> str | None:
    if not body:
        return None
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:80]


def real_drain_shapes(scenario: str) -> set[str]:
    text = (DATA / "vllm-logs" / f"{LOGS[scenario]}.log").read_text(encoding="utf-8")
    body = text.partition("\n---\n")[2]
    model = re.search(r"model='([^']+)'", body)
    return {shape(raw, model.group(1) if model else MODEL) for raw in body.splitlines() if is_drain_line(raw)}


def run(launch: Standins, scenario: str) -> tuple[dict[str, Any], set[str]]:
    recorded = RECORDED[scenario]
    port = free_port()
    standin = launch.start(
        MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--dtype", "bfloat16",
        "--served-model-name", "tinyllm", "--shutdown-timeout", str(recorded["shutdown_timeout"]),
        env={"SPARKD_STANDIN_VLLM_VERSION": "0.32.0", "NO_COLOR": "1", "SPARKD_STANDIN_TOKENS_PER_S": TOKENS_PER_S},
    )
    standin.wait_ready()

    def cut() -> None:
        """The recording's cut came while the engine drained, after /health had answered during the drain: two
        answers logged after the engine's drain line (the second was asked after the SIGTERM, surely)."""
        index = line_after(standin, ENGINE_DRAINING, 0)
        line_after(standin, HEALTH_ANSWERED, line_after(standin, HEALTH_ANSWERED, index + 1) + 1)
        engine = next(p for p in standin.tree() if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()))
        engine.kill()

    def newcomers_when() -> None:
        standin.wait_for(HTTP_GONE if recorded["shutdown_timeout"] == 0 else DRAINING, timeout=60)

    result = drainwatch.drain(f"http://127.0.0.1:{port}", "tinyllm", signal_it=lambda: standin.send(signal.SIGTERM),
                              wait_exit=lambda timeout: exit_status(standin, timeout), n=recorded["streams"],
                              max_tokens=480, newcomers_when=newcomers_when,
                              after_signal=cut if scenario == "cut" else None,
                              exit_timeout_s=20 if RECORDED[scenario]["exit_code"] == 0 else 6)
    ours = {shape(raw, MODEL) for raw in standin.lines if is_drain_line(raw)}
    return result.summary(), ours


def line_after(standin: Standin, pattern: str, start: int) -> int:
    """The index of the first line from ``start`` that matches ``pattern``, once there is one."""
    standin.wait_for(pattern, timeout=60, start=start)
    return next(i for i, line in enumerate(standin.lines[start:], start) if re.search(pattern, line))


def exit_status(standin: Standin, timeout: float) -> int | None:
    try:
        return standin.wait_exit(timeout)
    except subprocess.TimeoutExpired:
        return None  # vLLM waits for its clients forever (the stranded scenarios)


@pytest.mark.parametrize("scenario", sorted(LOGS))
def test_the_standin_stops_as_the_real_vllm_did(launch: Standins, scenario: str) -> None:
    summary, ours = run(launch, scenario)
    drains = RECORDED[scenario]["shutdown_timeout"] > 0
    assert behaviour(summary, drains) == behaviour(RECORDED[scenario], drains), (summary, RECORDED[scenario])
    real = real_drain_shapes(scenario)
    assert ours == real, f"shutdown lines: only the stand-in's {sorted(ours - real)}, only vLLM's {sorted(real - ours)}"


def test_the_recording_holds_what_issue_36_rests_on() -> None:
    """The facts sparkd's drain is built on, as the real vLLM showed them (so a re-recording that changes one is
    seen): a drain finishes every stream and refuses newcomers at once; vLLM's abort strands them."""
    drain, abort = RECORDED["drain"], RECORDED["abort"]
    assert drain["complete"] == drain["streams"] > 0 and drain["least_chunks_after_sigterm"] > 0
    assert all(d["status"] == 500 and d["seconds"] < 5 for d in drain["during"])
    assert drain["health_after_sigterm"][0] == "200" and drain["exit_code"] == 0
    assert abort["complete"] == 0 and abort["ended"] == 0 and abort["exit_code"] is None
