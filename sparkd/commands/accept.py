"""``POST /v1/accept`` — ``sparkctl accept``: after an intended change (an upgrade, new weights, new flags) the
acceptance gate's answers differ from the golden and the start is kept from ready (``answers_changed``); this runs
the gate again against the running vLLM with its answers recorded as the model's new golden. The other parts are
judged as ever: garbled answers or NaNs are never recorded, and refuse as before. On a group's worker: the head's
gate speaks for the group. Answers the gate's result; exit status 0 when it passed.

The daemon provides the gate as ``DaemonControl.acceptance`` (:class:`sparkd.commands.port.Acceptance`) while
``[acceptance]`` is on; otherwise it answers that it runs no acceptance gate, and the command changes nothing. A
passing run lets a start the gate held in ``accepting`` be ready; one that finds wrong answers keeps it there (or, while
vLLM serves, marks it degraded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import NoParams, Reply, ok, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Acceptance, Control

__all__ = ["COMMAND", "Request", "execute", "exit_code", "render", "status_lines"]

Request = NoParams
ANSWERING = ("accepting", "ready", "degraded")  # the lifecycle states in which vLLM's API answers


async def execute(control: Control, request: Request) -> Reply:
    gate: Acceptance | None = getattr(control, "acceptance", None)
    if gate is None:
        return refused("this sparkd runs no acceptance gate, so there are no answers to accept", control.status())
    if control.worker:
        return refused("a group's answers are its head's: run `sparkctl accept` on the head", control.status())
    status = control.status()
    if not control.running():
        return refused("vLLM is not running: start it (`sparkctl start`), then accept its answers", status)
    if status.get("state") not in ANSWERING:
        return refused(f"vLLM does not answer yet ({status.get('state')}): wait until it is accepting or ready, "
                       "then accept its answers", status)
    return ok(await gate.accept())


def render(result: Mapping[str, Any]) -> str:
    lines = [f"accept: {result.get('verdict')} in {float(result.get('seconds') or 0):.1f} s — {result.get('sentence')}"]
    for part in result.get("parts") or ():
        mark = {True: "ok", False: "FAILED", None: "-"}.get(part.get("ok"), "-")
        lines.append(f"  {part.get('part'):<12} {mark:<6} {part.get('sentence')}")
    return "\n".join(lines)


def status_lines(gate: Mapping[str, Any]) -> list[str]:
    """What ``sparkctl status`` says of the acceptance gate: the run in progress, the verdict standing for the running
    vLLM (its sentence when it is not a pass), the last runs."""
    lines = []
    running = gate.get("running")
    if running:
        lines.append(f"  acceptance gate ({running.get('kind')}): {running.get('line')}")
    verdict = gate.get("verdict")
    if verdict == "pass":
        lines.append(f"  acceptance gate: pass ({gate.get('kind')}, {float(gate.get('seconds') or 0):.1f} s)")
    elif verdict and gate.get("refused"):
        lines.append(f"  acceptance gate REFUSED ready ({verdict}): {gate.get('sentence')}")
    elif verdict:
        lines.append(f"  acceptance gate: {verdict} ({gate.get('kind')}): {gate.get('sentence')}")
    history = gate.get("history") or []
    if len(history) > 1:
        lines.append("  acceptance history: " + ", ".join(f"{h.get('kind')} {h.get('verdict')}" for h in history[-5:]))
    return lines


def exit_code(result: Mapping[str, Any]) -> int:
    return 0 if result.get("verdict") == "pass" else 1


COMMAND = Command("accept", "POST", Request, execute, render, exit_code, cli=Cli(
    help="Record the running vLLM's answers as its golden after an intended change (an upgrade, new weights, new "
         "flags); the gate's other parts are judged as ever.", timeout_s=600),
    root_only=True)  # the control socket, uid 0: what counts as a right answer is the operator's word
