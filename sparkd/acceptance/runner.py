"""The acceptance gate run against one serving vLLM: the effect the daemon runs between serving and ready (and for a
replay, and for ``sparkctl accept``). The decisions are :mod:`sparkd.supervisor.acceptance`; this module only asks,
scrapes, times and keeps the golden.

One run: read the model's golden; scrape ``/metrics`` (when speculative decoding or numerics are judged); run the
planned parts in order under the gate's budget (``[acceptance] timeout_s``) — capacity from what startup logged, the
fingerprint's prompts one at a time, the garble levels each at once — scrape again; decide. The golden is written
when the fingerprint recorded or grew one and no answer was wrong (a garbled first pass records nothing). Progress
goes to ``progress`` after every part (status shows it while the gate runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import anyio

from sparkd.acceptance.client import AskFailed
from sparkd.config.acceptance import AcceptanceConfig, AcceptancePrompt
from sparkd.state.files import WriteResult
from sparkd.supervisor.acceptance.answers import Answer, Capacity, Golden, Identity, Shape
from sparkd.supervisor.acceptance.capacity import judge_capacity
from sparkd.supervisor.acceptance.counters import Counters, judge_numerics, judge_spec_decode, read_counters
from sparkd.supervisor.acceptance.fingerprint import Rules, compare
from sparkd.supervisor.acceptance.garble import Finding, LevelResult, check, level_result
from sparkd.supervisor.acceptance.gate import WRONG_ANSWERS, GateResult, Part, PartResult, Progress, decide, plan
from sparkd.supervisor.acceptance.parts import (
    capacity_part,
    counters_part,
    fingerprint_part,
    garble_part,
    incomplete_part,
)
from sparkd.supervisor.acceptance.replay import replay_parts

__all__ = ["Asker", "GateFacts", "GoldenKeeper", "run_gate", "shape_of"]


class Asker(Protocol):
    """What the gate asks vLLM (:class:`sparkd.acceptance.client.AnswerClient`, or a fake)."""

    async def ask(self, prompt_name: str, prompt: str, api: str, shape: Shape,
                  chat_template_kwargs: Mapping[str, object] | None = None) -> Answer: ...

    async def metrics(self) -> str | None: ...


class GoldenKeeper(Protocol):
    """Where goldens are kept (:class:`sparkd.state.golden.GoldenStore`)."""

    def read(self, model: str) -> Golden | None: ...

    def write(self, golden: Golden) -> WriteResult: ...


@dataclass(frozen=True)
class GateFacts:
    """What the shell knows of this start."""

    model: str  # the launch's model (path or hub id): the golden's key
    identity: Identity
    capacity: Capacity  # what startup logged
    speculative: bool = False  # the launch sets a speculative config
    speculative_positions: int | None = None  # its num_speculative_tokens, when known
    nans_in_logits: bool = False  # VLLM_COMPUTE_NANS_IN_LOGITS=1 in the launch's environment
    band_source: str = "the config"  # where [acceptance]'s band came from ("profile 1m-context")


def shape_of(cfg: AcceptanceConfig) -> Shape:
    return Shape(cfg.max_tokens, cfg.seed, cfg.top_logprobs)


def _apis(prompt: AcceptancePrompt) -> tuple[str, ...]:
    return ("chat", "completion") if prompt.api == "both" else (prompt.api,)


class _Run:
    def __init__(self, cfg: AcceptanceConfig, facts: GateFacts, asker: Asker, golden: Golden | None,
                 clock: Callable[[], float], wall: Callable[[], float], accept: bool) -> None:
        self.cfg, self.facts, self.asker, self.golden = cfg, facts, asker, golden
        self.clock, self.wall, self.accept = clock, wall, accept
        self.shape = shape_of(cfg)
        self.before: Counters | None = None
        self.keep: Golden | None = None  # the golden to write if the gate finds no wrong answer

    async def part(self, part: Part) -> PartResult:
        began = self.clock()
        try:
            if part is Part.capacity:
                return self.capacity()
            if part is Part.fingerprint:
                return await self.fingerprint(began)
            if part is Part.garble:
                return await self.garble(began)
            return await self.counters(part, began)
        except AskFailed as exc:
            return incomplete_part(part, str(exc), self.clock() - began)

    def capacity(self) -> PartResult:
        golden = self.golden.capacity if self.golden is not None and not self.accept else None
        return capacity_part(judge_capacity(
            self.facts.capacity, band_tokens=self.cfg.kv_cache_tokens, band_concurrency=self.cfg.max_concurrency,
            golden=golden, tolerance=self.cfg.capacity_tolerance, source=self.facts.band_source))

    async def fingerprint(self, began: float) -> PartResult:
        answers = [await self.asker.ask(p.name, p.prompt, api, self.shape, self.cfg.chat_template_kwargs)
                   for p in self.cfg.prompts for api in _apis(p)]
        rules = Rules(self.cfg.prefix_tokens, self.cfg.tie_margin, self.cfg.min_similarity)
        result = compare(self.golden, answers, self.facts.identity, self.shape, rules, model=self.facts.model,
                         now_wall=self.wall(), capacity=self.facts.capacity, accept=self.accept)
        self.keep = result.golden
        return fingerprint_part(result, self.clock() - began)

    async def garble(self, began: float) -> PartResult:
        levels = [await self.level(n) for n in self.cfg.garble_levels]
        return garble_part(levels, self.clock() - began)

    async def level(self, n: int) -> LevelResult:
        """``n`` requests at once, the prompts in turn (chat where a prompt allows it)."""
        prompts = [self.cfg.prompts[i % len(self.cfg.prompts)] for i in range(n)]
        checked: list[tuple[str, tuple[Finding, ...]]] = []
        errors: list[str] = []

        async def one(i: int, prompt: AcceptancePrompt) -> None:
            api = "chat" if prompt.api in ("chat", "both") else "completion"
            try:
                answer = await self.asker.ask(prompt.name, prompt.prompt, api, self.shape,
                                              self.cfg.chat_template_kwargs)
            except AskFailed as exc:
                errors.append(str(exc))
                return
            found = check(answer.text, prompt=prompt.prompt, finish_reason=answer.finish_reason,
                          tokens=len(answer.token_ids), min_tokens=prompt.min_tokens, scripts=prompt.scripts)
            checked.append((f"{answer.key}#{i}", found))

        async with anyio.create_task_group() as tg:
            for i, prompt in enumerate(prompts):
                tg.start_soon(one, i, prompt)
        return level_result(n, sorted(checked), errors)

    async def counters(self, part: Part, began: float) -> PartResult:
        text = await self.asker.metrics()
        if text is None or self.before is None:
            return incomplete_part(part, "vLLM's /metrics could not be read", self.clock() - began)
        after = read_counters(text)
        verdict = (judge_spec_decode(self.before, after, positions=self.facts.speculative_positions)
                   if part is Part.spec_decode else judge_numerics(self.before, after))
        return counters_part(part, verdict, self.clock() - began)


async def run_gate(cfg: AcceptanceConfig, facts: GateFacts, asker: Asker, store: GoldenKeeper, *,
                   clock: Callable[[], float], wall: Callable[[], float],
                   progress: Callable[[Progress], None] = lambda _: None, accept: bool = False,
                   replay: bool = False) -> GateResult:
    """Run the gate once; ``accept``: the answers become the golden (``sparkctl accept``), the other parts as ever;
    ``replay``: only what a replay while serving runs (``replay_parts``)."""
    started = clock()
    parts = plan(capacity=cfg.capacity, fingerprint=cfg.fingerprint or accept, garble_levels=cfg.garble_levels,
                 spec_decode=cfg.spec_decode, numerics=cfg.numerics, speculative=facts.speculative,
                 nans_in_logits=facts.nans_in_logits)
    if replay:
        parts = replay_parts(parts)
    golden = await anyio.to_thread.run_sync(store.read, facts.model)  # the state disk, off the loop
    run = _Run(cfg, facts, asker, golden, clock, wall, accept)
    state = Progress(started, parts)
    progress(state)
    if {Part.spec_decode, Part.numerics} & set(parts):
        text = await asker.metrics()
        run.before = None if text is None else read_counters(text)
    results: list[PartResult] = []
    with anyio.move_on_after(max(0.0, cfg.timeout_s - (clock() - started))):
        for part in parts:
            results.append(await run.part(part))
            state = state.after(results[-1])
            progress(state)
    results += _ran_out(parts[len(results):], cfg.timeout_s)
    verdict = decide(results, started_at=started, now=clock(), on_wrong_answers=cfg.on_wrong_answers,
                     on_lost_performance=cfg.on_lost_performance)
    if run.keep is not None and verdict.verdict not in WRONG_ANSWERS:
        written = await anyio.to_thread.run_sync(store.write, run.keep)
        if not written.ok:
            verdict = _unkept(verdict, written.problem or "the golden could not be written")
    return verdict


def _ran_out(left: Sequence[Part], budget_s: float) -> list[PartResult]:
    return [incomplete_part(part, f"the gate's budget of {budget_s:g} s ran out before it", 0.0) for part in left]


def _unkept(verdict: GateResult, problem: str) -> GateResult:
    return replace(verdict, sentence=f"{verdict.sentence} The golden was not kept: {problem}.")
