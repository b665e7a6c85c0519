"""The step probe's sense (issue 38): this node's step files, and on a group's head its workers' too.

Every node reads its own files (:mod:`sparkd.host.stepfiles`, in the launch's ``<run_dir>/probe``) when asked: each
record's process is found as sparkd sees it (a container's PID namespace is not sparkd's: the record then carries the
host's PID, which the verdicts name; a record of a process that is gone is dropped) with its state letter (``T``:
stopped). A worker answers its head's ``rank/steps`` with that
reading (:func:`sparkd.supervisor.stepwire.reading_json`, on its own clock); the head's watch asks every worker
(:meth:`readings`) and stamps each answer with its own clock when it came. What the watch makes of the readings is
the core's (:mod:`sparkd.supervisor.stepwatch`); this part keeps the last readings (an incident's evidence holds every
rank's last records) and the step history of each identity (the image and the launch) in
``<state_dir>/step-history/``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkd.config import Config
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.host.stepfiles import host_pid, process_stat, process_state, read_steps
from sparkd.launch.probe import probe_dir
from sparkd.state.files import read_json
from sparkd.supervisor.stephistory import StepHistory
from sparkd.supervisor.steps import NodeSteps, records_text, views
from sparkd.supervisor.stepwire import node_steps, reading_json
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

__all__ = ["SAVE_EVERY_S", "StepSense", "WorkerSteps"]

SAVE_EVERY_S = 60.0  # the history of a running identity is written at most this often (and when its watch ends)

# A head's question to its workers: (peer, its answer) for each worker that answered.
WorkerSteps = Callable[[], Awaitable[list[tuple[str, dict[str, Any]]]]]
_Key = tuple[int, int, int]  # a record's process: PID in its namespace, the namespace, its start time


class StepSense:
    def __init__(self, config: Callable[[], Config], save: Callable[[Path, Mapping[str, Any]], None], clock: Clock,
                 log: Logger, *, image: Callable[[], str | None], workers: WorkerSteps | None = None,
                 proc: Path = Path("/proc")) -> None:
        """``save``: writes a state file off the loop (the daemon's ``StateWriter.put``); ``image``: the image's id
        (None on the host); ``workers``: a head's question to its workers."""
        self.config = config
        self.save = save
        self.clock = clock
        self.log = log
        self.image = image
        self.workers = workers
        self.proc = proc
        self.last: tuple[NodeSteps, ...] = ()  # the last reading of every node (an incident's evidence)
        self.problems: list[str] = []  # what the last reading could not read
        self._pids: dict[_Key, int | None] = {}  # each record's process as sparkd sees it (None: gone)
        self._saved: dict[str, tuple[float, int]] = {}  # per identity: when its history was written, how learned

    # ---- this node's files
    def _local(self) -> tuple[NodeSteps, list[str]] | None:
        """This node's reading on its own clock; None when the probe is off."""
        cfg = self.config()
        folder = probe_dir(cfg)
        if folder is None:
            return None
        reading = read_steps(folder)
        records, states = [], {}
        for record in reading.records:
            seen = self._host_process(record)
            if seen is None:
                continue  # its process is gone: an earlier launch's, or dead
            pid, state = seen
            records.append(record if pid == record.pid else replace(record, pid=pid))  # named as the host sees it
            if state:
                states[(record.role, record.rank)] = state
        steps = NodeSteps(cfg.node.name, reading.read_at_ns, tuple(records), self.clock.now(), states)
        return steps, list(reading.problems)

    def _host_process(self, record: StepRecord) -> tuple[int, str | None] | None:
        """The record's process as the host sees it, and its state letter; None when it is gone. A process found
        before is the same one while its start time is the record's: one read of its ``stat`` at each reading."""
        key = (record.pid, record.pid_ns, record.start_ticks)
        known = self._pids.get(key, 0)  # 0: not looked for yet
        if known is None:
            return None  # a process once gone never comes back
        if known and record.start_ticks:
            seen = process_stat(known, proc=self.proc)
            if seen is not None and seen[0] == record.start_ticks:
                return known, seen[1]
        found = host_pid(record, proc=self.proc, hint=known or record.pid)
        if len(self._pids) > 256:
            self._pids.clear()
        self._pids[key] = found
        return None if found is None else (found, process_state(found, proc=self.proc))

    def answer(self) -> dict[str, Any]:
        """This node's reading as the peer link carries it (a worker's answer to ``rank/steps``)."""
        local = self._local()
        if local is None:
            return reading_json(self.config().node.name, 0, (), {}, ("the step probe is off ([health] step_probe)",))
        steps, problems = local
        return reading_json(steps.node, steps.read_at_ns, steps.records, steps.states, problems)

    async def readings(self) -> list[NodeSteps]:
        """Every node's reading now: this node's, and a head's workers' (those that answered)."""
        local = self._local()
        nodes, problems = ([local[0]], local[1]) if local is not None else ([], [])
        if self.workers is not None:
            for peer, answer in await self.workers():
                steps, said = node_steps(answer, peer=peer, received_at=self.clock.now())
                nodes.append(steps)
                problems.extend(said)
        if problems and problems != self.problems:
            self.log.warning("step_files_unread", problems=problems[:8])
        self.last, self.problems = tuple(nodes), problems
        return nodes

    def evidence(self) -> str | None:
        """Every rank's last records (an incident's): None when the probe read nothing."""
        if not any(n.records for n in self.last):
            return None
        return records_text(views(self.last, self.clock.now()))

    def forget(self) -> None:
        """The instance is gone: its readings are no one's now."""
        self.last = ()

    # ---- the step history of each identity
    def identity(self, cfg: Config) -> str:
        """The launch as vLLM runs it: its image and everything that shapes it (model, argv, environment)."""
        return hashlib.sha256(f"{self.image() or 'host'}\0{cfg.launch_hash()}".encode()).hexdigest()[:16]

    def _history_path(self, identity: str) -> Path:
        return self.config().paths.state_dir / "step-history" / f"{identity}.json"

    def load_history(self, identity: str) -> StepHistory:
        history = StepHistory.from_json(read_json(self._history_path(identity)))
        self._saved[identity] = (self.clock.now(), history.learned)
        return history

    def keep_history(self, identity: str, history: StepHistory, *, now: bool = False) -> None:
        """Write ``history`` when it learned since it was last written, at most every :data:`SAVE_EVERY_S` (``now``:
        whatever the time, when its watch ends)."""
        at, learned = self._saved.get(identity, (-SAVE_EVERY_S, -1))
        if history.learned == learned or (not now and self.clock.now() - at < SAVE_EVERY_S):
            return
        path = self._history_path(identity)
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            self.log.warning("step_history_unwritable", path=str(path.parent), error=str(exc))
            return
        self.save(path, history.to_json())
        self._saved[identity] = (self.clock.now(), history.learned)
