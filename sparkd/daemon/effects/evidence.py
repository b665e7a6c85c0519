"""What a failure leaves behind: it is counted, classified with every fact sparkd has, and its incident folder
is written (off the loop; the memory guard's own before it signals anything).

The facts beyond vLLM's log tail: the exit, the launch target and ports from the config, MemAvailable from the
guard's latest sample, the kernel's lines (NVRM, Xid, AER, OOM kills) since the launch, the container's state,
every rank's last step records (the step probe's, in the record's ``steps``). Everything written is redacted: no
secret reaches an incident.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from sparkd.daemon.effects.redaction import Redaction
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock
from sparkd.host.gpu.smi import query_text
from sparkd.host.logs import Logger, VllmLog
from sparkd.launch.facts import config_context
from sparkd.preflight.base import Verdict
from sparkd.preflight.runner import PreflightReport
from sparkd.runtime.base import Runtime
from sparkd.state.incidents import GpuEvidence, IncidentWriter, attach_stop, incident_record
from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.failures import Evidence, Failure, FailureClass
from sparkd.supervisor.marks import attempt, preflight_line, this_launch, verdict_line, vllm_lines
from sparkd.supervisor.states import UP

__all__ = ["LOG_TAIL_LINES", "Counters", "FailureEvidence"]

LOG_TAIL_LINES = 300  # what an incident and the classifier read of vLLM's output


@dataclass
class Counters:
    """What happened, counted as it happens (everything else is read when asked)."""

    failures: Counter[str] = field(default_factory=Counter)  # by class
    last_exit_code: int | None = None
    failure_at: float | None = None  # wall time of the last failure


class FailureEvidence:
    """Built before the memory guard (whose hooks write through it): what it reads of the guard is handed to the
    call that needs it (``guard``), and the guard hands over its own evidence when it writes."""

    def __init__(self, runtime: Runtime, redaction: Redaction, incidents: Path, *, vllm_log: VllmLog, clock: Clock,
                 log: Logger, gpu: Callable[[], dict[str, Any] | None] = lambda: None,
                 steps: Callable[[], str | None] = lambda: None) -> None:
        self.runtime = runtime
        self.redaction = redaction
        self.incidents = IncidentWriter(incidents, log=log)
        self.vllm_log = vllm_log
        self.clock = clock
        self.gpu = gpu  # the GPU sampler's evidence
        self.steps = steps  # every rank's last step records (the step probe's sense), when it read any
        self.counters = Counters()
        self.kernel_mark = 0  # the guard's kernel-log lines kept before the current launch
        self.folders: dict[Failure, Path | None] = {}  # the incident folder of each recent failure, once written
        self._written: dict[Failure, anyio.Event] = {}  # set once that failure's folder is written (or failed)

    def mark_launch(self, guard: Guard | None) -> None:
        """A launch begins: kernel lines from now on belong to it."""
        kernel = _kernel(guard)
        self.kernel_mark = kernel.kept if kernel is not None else 0

    async def record(self, failure: Failure, *, written: bool, state: NodeState, preflight: list[dict[str, Any]],
                     guard: Guard | None) -> None:
        """Count the failure and write its incident with what its class asks for — unless ``written``: the guard
        counted and wrote it (``write_guard_evidence``) before it signalled. ``state``: the node's when the
        failure was decided (its instance, its config)."""
        if written:
            return
        self._done(failure)  # the stop that answers it waits for this
        at = self._count(failure)
        evidence = failure.treatment.evidence
        redact = self.redaction.of(state.config)
        container = None
        if Evidence.container in evidence and state.instance is not None:
            container = redact.mapping(await self.runtime.inspect(state.instance))
        record = self._incident(failure, at, state, preflight=preflight, **_gate(failure, state))
        gpu = self.gpu()
        smi_q = await query_text() if gpu is not None and (gpu.get("view") or {}).get("skipped") is None else None
        folder = await self.incidents.write(record, self._tail(failure, state), evidence=evidence,
                                            keep=state.config.supervisor.incidents_keep, container=container,
                                            guard=guard.evidence() if guard else None,
                                            gpu=None if gpu is None else GpuEvidence(gpu, smi_q))
        self._keep(failure, folder)

    def _done(self, failure: Failure) -> anyio.Event:
        return self._written.setdefault(failure, anyio.Event())

    def _keep(self, failure: Failure, folder: Path | None) -> None:
        self.folders[failure] = folder
        self._done(failure).set()
        while len(self.folders) > 8:
            oldest = next(iter(self.folders))
            del self.folders[oldest]
            self._written.pop(oldest, None)

    async def note_stop(self, failure: Failure, stop: dict[str, Any], wait_s: float = 30.0) -> None:
        """The stop that answered ``failure``, into its incident folder (written beside the stop: waited for, in
        real seconds: the write runs in a worker thread)."""
        with anyio.move_on_after(wait_s):
            await self._done(failure).wait()
        folder = self.folders.get(failure)
        if folder is None:
            return
        try:
            await anyio.to_thread.run_sync(attach_stop, folder, self.redaction().mapping(stop))
        except OSError as exc:
            self.incidents.log.error("incident_write_failed", failure=failure.cls.value, error=str(exc))

    def log_preflight_failure(self, report: PreflightReport) -> None:
        """A preflight that stops the launch starts an attempt of its own in vLLM's log: its line, then what the
        failing check's program printed (vLLM's parser: its traceback, argparse's complaint), so the incident and
        `sparkd explain` read this attempt, not the previous launch."""
        failed = next((r for r in report.results if r.verdict is Verdict.fail), None)
        if failed is None:
            return
        self.vllm_log.append(preflight_line(failed.id))
        redact = self.redaction()
        for line in failed.output.splitlines():
            self.vllm_log.append(redact(line))

    def write_guard_evidence(self, failure: Failure, guard: dict[str, Any], state: NodeState) -> None:
        """The memory guard's evidence, now, before it signals anything (synchronous and quick)."""
        record = self._incident(failure, self._count(failure), state)
        self._keep(failure, self.incidents.write_now(record, self._tail(failure, state),
                                                     keep=state.config.supervisor.incidents_keep, guard=guard))

    def _tail(self, failure: Failure, state: NodeState) -> list[str]:
        """sparkd's verdict goes into vLLM's log (some rest on nothing vLLM logged: a canary unanswered, the guard);
        the incident keeps this attempt's lines only, from its launch (or failed preflight) line on."""
        line = verdict_line(failure.cls.value, failure.sentence, failure.evidence)
        self.vllm_log.append(self.redaction.of(state.config)(line))
        return attempt(self.vllm_log.last(LOG_TAIL_LINES))

    async def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                            engine_gone: bool = False, *, guard: Guard | None, state: NodeState) -> Failure:
        """The facts gathered here, on the loop; the classifier run in a worker thread (a pathological tail costs it
        seconds, which the loop's other work must not wait for)."""
        from sparkd.supervisor.classify import classify  # the classifier's tables load with the first failure

        lines = vllm_lines(this_launch(self.vllm_log.last(LOG_TAIL_LINES)))
        context = self.context(guard, state, engine_gone)
        return await anyio.to_thread.run_sync(partial(classify, exit_code, sig, lines, hint=hint, context=context))

    def context(self, guard: Guard | None, state: NodeState, engine_gone: bool = False) -> ClassifyContext:
        """The config's facts (:func:`sparkd.launch.facts.config_context`, which `sparkd explain --config` uses
        alone) and what was observed: ready or not, MemAvailable, the kernel's lines since the launch."""
        sample = guard.latest if guard is not None else None
        kernel = _kernel(guard)
        return replace(config_context(state.config), was_ready=state.state in UP,
                       mem_available_bytes=sample.available if sample is not None else None,
                       kernel_lines=kernel.since(self.kernel_mark) if kernel is not None else (),
                       engine_gone=engine_gone)

    def _count(self, failure: Failure) -> float:
        self.counters.failure_at = at = self.clock.wall()
        self.counters.failures[failure.cls.value] += 1
        if failure.exit_code is not None:
            self.counters.last_exit_code = failure.exit_code
        return at

    def _incident(self, failure: Failure, at: float, state: NodeState, **facts: Any) -> dict[str, Any]:
        cfg, instance, timing = state.config, state.instance, state.timing
        if timing is not None and timing.ready_at is None and not timing.adopted:  # where a failed start's time went
            facts["start_timing"] = timing.to_json(until=self.clock.now())
        steps = self.steps()
        if steps is not None:
            facts["steps"] = steps
        record = incident_record(failure, at=at, config_hash=cfg.launch_hash(), node=cfg.node.name,
                                 state=state.state.value, pid=instance.pid if instance else None, **facts)
        redacted: dict[str, Any] = self.redaction.of(cfg).mapping(record)
        return redacted


def _gate(failure: Failure, state: NodeState) -> dict[str, Any]:
    """An acceptance gate's verdict in full (every part's facts: the golden answer and the new one, the bad outputs
    per level, the capacity lost), when ``failure`` is that verdict's."""
    last = state.acceptance.last
    return {"acceptance": last.to_json()} if last is not None and last.failure is failure else {}


def _kernel(guard: Guard | None) -> Any:
    """The guard's kernel-log reader (Xid, AER, NVRM, OOM kills), when the guard runs and can read it."""
    return guard.sampler.kernel if guard is not None else None
