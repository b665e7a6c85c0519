"""The acceptance gate carried out (issue 37): the ``RunGate`` action — between starting and ready, and while vLLM
serves (a replay while idle, after a wake, after an adoption) — and ``sparkctl accept`` (the commands'
:class:`~sparkd.commands.port.Acceptance` port, through ``DaemonControl``).

What this node knows of the start becomes the gate's :class:`~sparkd.acceptance.runner.GateFacts`: the model, the
identity the answers are made by (the image's id, or the program's on the process runtime; the weights by their
manifest, no shard read; the rendered launch less what cannot change an answer), the capacity vLLM logged, whether the
launch sets a speculative decoder or ``VLLM_COMPUTE_NANS_IN_LOGITS=1``. :func:`sparkd.acceptance.runner.run_gate`
asks and decides; its progress and verdict go to the loop (``GateProgress``, ``GateDone``). One run at a time: a
replay due while a gate runs gives way. A run is cancelled when its instance stops; it is bounded by the gate's own
budget, and whatever goes wrong in it is an unfinished gate, said (never the daemon's end).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import anyio

from sparkd.acceptance.client import AnswerClient, Target
from sparkd.acceptance.identity import launch_identity, program_identity, weights_identity
from sparkd.acceptance.runner import Asker, GateFacts, run_gate
from sparkd.config import Config
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.watch.probes import probe_base_url
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.launch.render import api_key, effective_env
from sparkd.state.golden import GoldenStore
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.answers import Capacity, Identity
from sparkd.supervisor.acceptance.gate import GateResult, Part, decide
from sparkd.supervisor.acceptance.parts import incomplete_part
from sparkd.supervisor.acceptance.standing import REPLAYS, GateKind
from sparkd.supervisor.states import RUNNING

__all__ = ["AcceptanceGate", "AnswerSource", "gate_facts", "http_answers"]

WAKE_POLL_S = 1.0


class AnswerSource(Asker, Protocol):
    """What the gate asks one vLLM, and how its client ends (:class:`sparkd.acceptance.client.AnswerClient`)."""

    async def awake(self) -> bool: ...

    async def aclose(self) -> None: ...


def http_answers(cfg: Config) -> AnswerClient:
    """vLLM's own API, where the launch says it listens, asked as the probes ask it."""
    target = Target(probe_base_url(cfg.launch.host, cfg.launch.port), cfg.served_name, api_key(cfg))
    return AnswerClient(target, timeout_s=cfg.acceptance.request_timeout_s)


def _weights(cfg: Config) -> str | None:
    """The weights' identity from their manifest, no shard read (blocking: a stat per file, the small files hashed).
    The manifest's modules load with the first gate (a daemon without one never loads them)."""
    from sparkd.preflight.manifest import build
    from sparkd.preflight.weights_local import model_dir

    root, _ = model_dir(cfg)
    if root is None:
        return None
    manifest = build(root, always=cfg.weights.always_hash, ignore=cfg.weights.ignore, known={}, stop=lambda: True)
    return weights_identity(manifest)


def _band_source(cfg: Config) -> str:
    name = cfg.launch.profile
    if name and cfg.acceptance.kv_cache_tokens:
        from sparkd.config.profiles import profile_tables

        try:
            if profile_tables(name).get("acceptance", {}).get("kv_cache_tokens") == cfg.acceptance.kv_cache_tokens:
                return f"the {name} profile"
        except LookupError:
            pass
    return "[acceptance]"


async def gate_facts(state: NodeState, plan: LaunchPlan, container: ContainerFacts) -> GateFacts:
    """What this node knows of the start its gate judges."""
    cfg, startup = state.config, state.startup
    spec = plan.spec(cfg)
    image = container.identity()
    env = {k: s.value for k, s in effective_env(cfg, image.env if image else None).items()}
    weights = await anyio.to_thread.run_sync(_weights, cfg)
    program = image.id if image is not None else await anyio.to_thread.run_sync(program_identity,
                                                                                   cfg.launch.executable)
    drafts = cfg.launch.speculative_config or {}
    positions = drafts.get("num_speculative_tokens")
    return GateFacts(
        cfg.launch.model, Identity(program, weights, launch_identity(spec.argv, spec.env)),
        Capacity(startup.kv_cache_tokens, startup.max_concurrency, startup.max_concurrency_tokens,
                 startup.kv_cache_gib),
        speculative=bool(drafts), speculative_positions=positions if isinstance(positions, int) else None,
        nans_in_logits=env.get("VLLM_COMPUTE_NANS_IN_LOGITS") == "1", band_source=_band_source(cfg))


class AcceptanceGate:
    def __init__(self, plan: LaunchPlan, container: ContainerFacts, post: Callable[[v.Posted], None],
                 answers: Callable[[Config], AnswerSource], state_dir: Path, clock: Clock, log: Logger) -> None:
        self.plan = plan
        self.container = container  # the image the answers are made by
        self.post = post
        self.answers = answers  # a client of the instance's API (http_answers, or a test's)
        self.store = GoldenStore(state_dir, log)
        self.clock = clock
        self.log = log
        self._lock = anyio.Lock()  # one gate at a time
        self._scope: anyio.CancelScope | None = None

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """The instance a run asks is stopping or gone: the run ends with it, its verdict unsaid."""
        if self._scope is not None and after.state not in RUNNING:
            self._scope.cancel()

    async def run(self, action: v.RunGate, state: NodeState) -> None:
        """The lifecycle's ``RunGate``: the verdict posted as ``GateDone`` (nothing when the run was cancelled)."""
        kind = GateKind(action.kind)
        if kind in REPLAYS and self._lock.locked():
            self.log.info("acceptance_skipped", kind=kind.value, why=f"{action.why}; a gate runs already")
            return
        result = await self.gate(state, kind)
        if result is not None:
            self.post(v.GateDone(result, kind.value))

    async def gate(self, state: NodeState, kind: GateKind) -> GateResult | None:
        """One run against ``state``'s instance (``accept``: its answers become the golden); None: cancelled."""
        async with self._lock:
            with anyio.CancelScope() as scope:
                self._scope = scope
                try:
                    result = await self._run(state, kind)
                finally:
                    self._scope = None
            if scope.cancelled_caught:
                self.post(v.GateProgress(None, kind.value))
                return None
        self.log.info("acceptance", kind=kind.value, verdict=result.verdict.value, refuse=result.refuse,
                      seconds=round(result.seconds, 3), sentence=result.sentence)
        return result

    async def _run(self, state: NodeState, kind: GateKind) -> GateResult:
        cfg, began = state.config, self.clock.now()
        budget = cfg.acceptance.timeout_s + cfg.acceptance.request_timeout_s + 15.0
        answers = self.answers(cfg)
        try:
            with anyio.move_on_after(budget):
                facts = await gate_facts(state, self.plan, self.container)
                if kind is GateKind.wake:
                    await self._awake(answers, cfg.acceptance.request_timeout_s)
                return await run_gate(cfg.acceptance, facts, answers, self.store, clock=self.clock.now,
                                      wall=self.clock.wall, accept=kind is GateKind.accept, replay=kind in REPLAYS,
                                      progress=lambda p: self.post(v.GateProgress(p, kind.value)))
            return self._unfinished(f"it did not finish in {budget:g} s", began)
        except Exception as exc:  # a bug or a host problem: an unfinished gate, said, never the daemon's end
            self.log.exception("acceptance_failed", kind=kind.value, error=repr(exc))
            return self._unfinished(f"sparkd could not run it: {exc!r}", began)
        finally:
            with anyio.CancelScope(shield=True):
                await answers.aclose()

    async def _awake(self, answers: AnswerSource, limit_s: float) -> None:
        """After a wake: ask once vLLM says it is awake (the wake's own request may still be running)."""
        with anyio.move_on_after(limit_s):
            while not await answers.awake():
                await self.clock.sleep(WAKE_POLL_S)

    def _unfinished(self, why: str, began: float) -> GateResult:
        now = self.clock.now()
        return decide([incomplete_part(Part.fingerprint, why, now - began)], started_at=began, now=now)
