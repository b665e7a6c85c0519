"""``POST /v1/weights?full=1`` — ``sparkctl weights [--full] [--local]``: the model directory's manifest. On a group's
head, every node's manifest compared (the check a start runs); on a worker the same, asked of its head (``--local``:
this node's alone); on a single node its own. ``--full`` hashes every shard again, whatever its size and mtime (long:
the whole directory is read, at the idle I/O class). Exit 0 when the weights are the same everywhere (or, alone,
readable), 1 when not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import Reply, flag, ok, refused
from sparkd.commands.command import Cli, Command, Flag
from sparkd.commands.groupcheck import WeightsRequest

if TYPE_CHECKING:
    from sparkd.commands.port import Control

FULL_TIMEOUT_S = 24 * 3600.0  # a --full run reads every shard

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Request:
    full: bool = False
    local: bool = False  # on a worker: this node's manifest alone, not the group's through the head

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        local = params.get("local", False)
        return cls(WeightsRequest.from_params(params).full, local if isinstance(local, bool) else flag(params, "local"))

    def to_params(self) -> dict[str, bool]:
        return {"full": self.full, **({"local": True} if self.local else {})}


async def execute(control: Control, request: Request) -> Reply:
    if control.worker and not request.local and control.group is not None:
        done, answer = await control.group.forward(COMMAND, WeightsRequest(request.full),
                                                   timeout_s=FULL_TIMEOUT_S if request.full else TIMEOUT_S)
        if not done:
            return refused(answer.get("error") or "the head refused")
        return ok({**(answer.get("result") or {}), "forwarded_to": answer["forwarded_to"]})
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
    by = f" (asked of the head {result['forwarded_to']})" if result.get("forwarded_to") else ""
    lines = [f"weights{by}: {verdict[result.get('ok')]}"]
    lines += [_node_line(node, n) for node, n in sorted((result.get("nodes") or {}).items())]
    for c in result.get("comparisons") or []:
        lines += [f"  differs on {c['node']}: {d}" for d in c.get("differ", [])]
        if c.get("by_size"):
            lines.append(f"  {len(c['by_size'])} file(s) compared by size only on {c['node']} (hashing pending)")
    return "\n".join(lines)


def exit_code(result: Mapping[str, Any]) -> int:
    return 1 if result.get("ok") is False else 0


COMMAND: Command[Request, dict[str, Any]] = Command("weights", "POST", Request, execute, render, exit_code, Cli(
    help="The model directory on every node compared (a group's: on a worker through its head), or this node's. "
         "Exit 0 same, 1 differ.",
    flags=(Flag("full", "Hash every shard again on every node (reads the whole directory)."),
           Flag("local", "On a group's worker: this node's manifest alone, not the group's.")),
    timeout_s=TIMEOUT_S, long_flag="full", long_timeout_s=FULL_TIMEOUT_S))
