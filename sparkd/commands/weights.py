"""``POST /v1/weights?full=1`` — ``sparkctl weights [--full]``: the model directory's manifest. On a group's head,
every node's manifest compared (the check a start runs); elsewhere this node's. ``--full`` hashes every shard
again, whatever its size and mtime (long: the whole directory is read, at the idle I/O class). Exit 0 when the
weights are the same everywhere (or, alone, readable), 1 when not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import Reply, ok
from sparkd.commands.command import Cli, Command, Flag
from sparkd.commands.groupcheck import WeightsRequest

if TYPE_CHECKING:
    from sparkd.commands.port import Control

FULL_TIMEOUT_S = 24 * 3600.0  # a --full run reads every shard

Request = WeightsRequest


async def execute(control: Control, request: Request) -> Reply:
    return ok(await control.checks.weights_view(full=request.full))


def _node_line(node: str, n: Mapping[str, Any]) -> str:
    if n.get("problem"):
        return f"  {node}: {n['problem']}"
    return (f"  {node}: {n.get('root')}: {n.get('files')} files, {n.get('hashed')} hashed now, "
            f"{n.get('pending')} pending ({n.get('duration_s')} s)")


def render(result: Mapping[str, Any]) -> str:
    if result.get("skipped"):
        return f"weights: not compared: {result['skipped']}"
    verdict = {True: "the same on every node" if result.get("scope") == "group" else "readable",
               False: "DIFFER" if result.get("scope") == "group" else "NOT readable", None: "not compared"}
    lines = [f"weights: {verdict[result.get('ok')]}"]
    lines += [_node_line(node, n) for node, n in sorted((result.get("nodes") or {}).items())]
    for c in result.get("comparisons") or []:
        lines += [f"  differs on {c['node']}: {d}" for d in c.get("differ", [])]
        if c.get("by_size"):
            lines.append(f"  {len(c['by_size'])} file(s) compared by size only on {c['node']} (hashing pending)")
    return "\n".join(lines)


def exit_code(result: Mapping[str, Any]) -> int:
    return 1 if result.get("ok") is False else 0


COMMAND = Command("weights", "POST", Request, execute, render, exit_code, Cli(
    help="The model directory on every node compared (on a group's head), or this node's. Exit 0 same, 1 differ.",
    flags=(Flag("full", "Hash every shard again on every node (reads the whole directory)."),), timeout_s=600,
    long_flag="full", long_timeout_s=FULL_TIMEOUT_S))
