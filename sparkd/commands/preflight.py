"""``POST /v1/preflight?dry_run=1`` — ``sparkctl preflight [--dry-run]``: run the preflight checks now, through the
daemon, never touching the instance it watches (with vLLM running only a dry run is possible). Exit 0 ready to
launch, 1 a check failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import Reply, flag, ok, refused
from sparkd.commands.command import Cli, Command, Flag

if TYPE_CHECKING:
    from sparkd.commands.port import Control


@dataclass(frozen=True)
class Request:
    dry_run: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        return cls(dry_run=flag(params, "dry_run"))

    def to_params(self) -> dict[str, str]:
        return {"dry_run": "1" if self.dry_run else "0"}


async def execute(control: Control, request: Request) -> Reply:
    if not request.dry_run and control.running():
        return refused("vLLM is running: only a dry run is possible now (sparkctl preflight --dry-run)")
    report = await control.preflight(dry_run=request.dry_run)
    return ok({"ok": report.ok, "dry_run": request.dry_run, "results": report.to_json()})


def render(result: Mapping[str, Any]) -> str:
    lines = []
    for r in result["results"]:
        did = f" -> {r['did']}" if r.get("did") else ""
        lines.append(f"{r['verdict']:<6} {r['id']:<18} {r['found']}{did} ({r['duration_s'] * 1000:.0f} ms)")
    return "\n".join(lines)


def exit_code(result: Mapping[str, Any]) -> int:
    return 0 if result["ok"] else 1


COMMAND = Command("preflight", "POST", Request, execute, render, exit_code, Cli(
    help="Run the preflight checks now through the daemon. Exit 0 ready to launch, 1 a check failed.",
    flags=(Flag("dry_run", "Report what would be fixed; change nothing."),), timeout_s=600))
