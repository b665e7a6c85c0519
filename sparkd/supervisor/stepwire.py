"""A node's step reading on the peer link (issue 38): how a worker's sparkd reports its ranks' step records to its
head, and how the head takes them. Pure.

The worker reads its own step files (``sparkd.daemon.watch.steps``) and answers the ranks' command ``rank/steps``
with :func:`reading_json`: its node name, the monotonic time of the reading on its own clock, every record as its
fields, the state letter of each process and the files it could not read. The head rebuilds a
:class:`~sparkd.supervisor.steps.NodeSteps` with :func:`node_steps`, stamped with its own clock when the answer came:
durations are taken on the clock that stamped the records, only the reading's age crosses nodes. The answer is a
peer's claim: a record whose fields are not what a step record holds is dropped and named, texts are bounded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sparkd.supervisor.steps import NodeSteps
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

__all__ = ["MAX_RECORDS", "node_steps", "reading_json"]

MAX_RECORDS = 64  # as many files as one node's reader reads (sparkd.host.stepfiles.MAX_FILES)
MAX_TEXT = 200  # characters of a text field kept from a peer's record
_FIELDS = {f.name: f.type for f in dataclasses.fields(StepRecord)}


def reading_json(node: str, read_at_ns: int, records: Sequence[StepRecord], states: Mapping[tuple[str, int], str],
                 problems: Sequence[str] = ()) -> dict[str, Any]:
    """One node's reading as the peer link carries it."""
    return {"node": node, "read_at_ns": read_at_ns, "records": [dataclasses.asdict(r) for r in records],
            "states": [{"role": role, "rank": rank, "state": state} for (role, rank), state in states.items()],
            "problems": list(problems)}


def node_steps(answer: Mapping[str, Any], *, peer: str, received_at: float) -> tuple[NodeSteps, list[str]]:
    """A peer's reading, on this node's clock from ``received_at`` on; with what was wrong in it (each dropped
    record named). ``peer`` names the node when the answer does not."""
    problems = [f"{peer}: {_text(p)}" for p in _list(answer.get("problems"))[:8]]
    node = _text(answer.get("node")) or peer
    read_at = answer.get("read_at_ns")
    if not isinstance(read_at, int) or not _is_int(read_at):
        return NodeSteps(node, 0, (), received_at), [*problems, f"{peer}: its reading has no read_at_ns"]
    records = []
    for i, raw in enumerate(_list(answer.get("records"))[:MAX_RECORDS]):
        record = _record(raw)
        if record is None:
            problems.append(f"{peer}: record {i} is not a step record")
        else:
            records.append(record)
    states: dict[tuple[str, int], str] = {}
    for raw in _list(answer.get("states"))[:MAX_RECORDS]:
        if isinstance(raw, Mapping) and isinstance(raw.get("role"), str) and _is_int(raw.get("rank")) \
                and isinstance(raw.get("state"), str) and len(raw["state"]) == 1:
            states[(raw["role"], raw["rank"])] = raw["state"]
    return NodeSteps(node, read_at, tuple(records), received_at, states), problems


def _record(raw: Any) -> StepRecord | None:
    if not isinstance(raw, Mapping) or set(raw) != set(_FIELDS):
        return None
    values: dict[str, Any] = {}
    for name, kind in _FIELDS.items():
        value = raw[name]
        if kind == "int" and _is_int(value):
            values[name] = value
        elif kind == "str" and isinstance(value, str):
            values[name] = _text(value)
        else:
            return None
    if values["role"] not in ("engine", "worker") or values["phase"] not in ("idle", "step", "collective", "off"):
        return None
    return StepRecord(**values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in str(value or "")).split())
    return flat[:MAX_TEXT]
