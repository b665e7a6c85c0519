"""The ``[acceptance]`` section: the gate between "serving" and "ready" (issue 37). A start is ready when its answers
and its capacity are what they were, not when ``/health`` says 200. :mod:`sparkd.config` assembles it; the gate's
decisions are :mod:`sparkd.supervisor.acceptance`, its I/O :mod:`sparkd.acceptance`.

The policy defaults, and why:

- ``on_wrong_answers = "refuse"``: answers that differ from the golden, garbled answers or NaNs in the logits are a
  model that serves wrong text with ``/health`` at 200 — the field's "agent garble, loops, Chinese" after an upgrade
  (field report 004), the silent FP4 garbage on GB10. An operator learns of it from sparkd, not from their users.
  A false refusal is bounded by the comparison (same launch: exact; changed launch: the close agreement measured on
  real vLLM, tests/realvllm/README) and ended by one command (``sparkctl accept``). Restarting never fixes a changed
  answer, so a refusal is never a restart loop.
- ``on_lost_performance = "warn"``: a smaller KV cache or a speculative decoder that stopped accepting serves correct
  answers, only fewer or slower: the start goes on, the verdict is said and alerted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sparkd.config.sections import _Section

Policy = Literal["refuse", "warn"]
Api = Literal["chat", "completion", "both"]


class AcceptancePrompt(_Section):
    """One fixed prompt of the answer fingerprint (``[[acceptance.prompts]]``)."""

    name: str = Field(min_length=1, max_length=64, description="The prompt's name: the golden keeps its answers by it.")
    prompt: str = Field(min_length=1, max_length=4000, description=(
        "The text sent: the user message through the chat template, the prompt itself through the raw completion API."))
    api: Api = Field(default="both", description=(
        "Which API asks it: `chat` (`/v1/chat/completions`, the model's chat template), `completion` "
        "(`/v1/completions`, the raw text) or `both`."))
    min_tokens: int = Field(default=1, ge=1, description=(
        "An answer that stops (finish reason `stop`) with fewer tokens than this is cut short."))
    scripts: list[str] = Field(default_factory=list, description=(
        "Writing systems the answer may use beyond the prompt's own (e.g. `[\"han\"]` for a prompt that asks for a "
        "translation into Chinese); others are a script the prompt did not ask for."))


# Short greedy answers that a chat model gives the same way every time: knowledge, arithmetic, code.
DEFAULT_PROMPTS: tuple[AcceptancePrompt, ...] = (
    AcceptancePrompt(name="capital", prompt="What is the capital of France? Answer in one short sentence.",
                     min_tokens=2),
    AcceptancePrompt(name="arithmetic", prompt="What is 17 multiplied by 23? Show the working in one line.",
                     min_tokens=3),
    AcceptancePrompt(name="code", prompt="Write a Python function that returns the n-th Fibonacci number.",
                     min_tokens=8),
)


class AcceptanceConfig(_Section):
    """The acceptance gate: what a start must show, between serving and ready, before it counts as ready; and the
    answers replayed while it serves. docs/design.md §4 and §6."""

    enabled: bool = Field(default=True, description="Run the gate after every start, wake and hand-over.")
    capacity: bool = Field(default=True, description=(
        "Check the KV cache tokens and the maximum concurrency vLLM logged against the band below and against the "
        "golden's."))
    fingerprint: bool = Field(default=True, description=(
        "Ask the prompts at temperature 0 and compare the answers with the golden recorded on the first pass."))
    garble_levels: list[int] = Field(default_factory=lambda: [1, 2, 4, 6], description=(
        "Concurrency levels at which the chat prompts are asked at once and each answer checked for garble (empty, "
        "cut short, a repetition loop, broken characters, a script the prompt did not ask for, leaked special "
        "tokens); any bad output fails the gate. Empty: no garble check (a random-weight test model)."))
    spec_decode: bool = Field(default=True, description=(
        "With `speculative_config` set: every draft position's accepted-token counter must move during the gate."))
    numerics: bool = Field(default=True, description=(
        "With `VLLM_COMPUTE_NANS_IN_LOGITS=1` in the launch environment: `vllm:corrupted_requests` must not move "
        "during the gate."))
    prompts: list[AcceptancePrompt] = Field(default_factory=lambda: list(DEFAULT_PROMPTS), description=(
        "`[[acceptance.prompts]]` tables `{ name, prompt, api, min_tokens, scripts }`; the defaults ask three short "
        "questions (capital, arithmetic, code) through both APIs."))
    max_tokens: int = Field(default=48, ge=1, le=4096, description="The bound on every answer's length (tokens).")
    seed: int = Field(default=1234, ge=0, description="The seed sent with every gate request.")
    top_logprobs: int = Field(default=5, ge=0, le=20, description=(
        "Top log-probabilities kept per answer token in the golden (0: tokens only); they tell a near tie, which a "
        "numerics change may flip, from a token the golden never considered (`tie_margin`)."))
    chat_template_kwargs: dict[str, bool | str | int] = Field(
        default_factory=lambda: dict[str, bool | str | int](enable_thinking=False, thinking=False), description=(
            "Sent with every chat request: a reasoning model answers in its content, not its reasoning."))
    prefix_tokens: int = Field(default=8, ge=0, description=(
        "After a change of image, weights or flags: every answer's first this many tokens must still be the "
        "golden's, unless they part at a near tie."))
    tie_margin: float = Field(default=0.5, ge=0, description=(
        "After a change: two answers may part where the golden's own top log-probabilities of the two tokens were "
        "within this many nats."))
    min_similarity: float = Field(default=0.5, ge=0, le=1, description=(
        "After a change: the share of answer tokens that must still agree with the golden's, over all prompts."))
    on_wrong_answers: Policy = Field(default="refuse", description=(
        "Changed or garbled answers, or NaNs in the logits: `refuse` keeps the start from ready (never a restart: "
        "restarting does not fix an answer), `warn` says so and serves. Why refuse: sparkd/config/acceptance.py."))
    on_lost_performance: Policy = Field(default="warn", description=(
        "Capacity below the band or the golden's, or a speculative decoder that stopped accepting: `warn` says how "
        "much and serves (the answers are right), `refuse` keeps the start from ready."))
    kv_cache_tokens: list[int] = Field(default_factory=list, description=(
        "The expected band `[low, high]` of vLLM's \"KV cache size: N tokens\" (a profile may set it; empty: none)."))
    max_concurrency: list[float] = Field(default_factory=list, description=(
        "The expected band `[low, high]` of vLLM's \"Maximum concurrency for T tokens per request: Xx\" (empty: "
        "none)."))
    capacity_tolerance: float = Field(default=0.03, ge=0, lt=1, description=(
        "A start whose KV cache tokens fall more than this share below the golden's has lost capacity."))
    timeout_s: float = Field(default=300.0, gt=0, description=(
        "The whole gate's budget; past it the verdict is `incomplete` (said, never refused; the parts done are kept)."))
    request_timeout_s: float = Field(default=120.0, gt=0, description="One gate request's budget.")
    replay_interval_s: float = Field(default=900.0, ge=0, description=(
        "While serving: replay the fingerprint this often, only while the engine is idle (0: never)."))
    replay_idle_s: float = Field(default=30.0, ge=0, description=(
        "A replay waits until no request has run for this long (it never competes with users)."))

    @field_validator("garble_levels")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(level < 1 or level > 64 for level in value):
            raise ValueError(f"{value}: every level is a concurrency from 1 to 64")
        return sorted(set(value))

    @field_validator("kv_cache_tokens", "max_concurrency")
    @classmethod
    def _band(cls, value: list[float]) -> list[float]:
        if value and (len(value) != 2 or not 0 < value[0] <= value[1]):
            raise ValueError(f"{value}: a band is [low, high] with 0 < low <= high, or [] for none")
        return value

    @model_validator(mode="after")
    def _unique_prompts(self) -> AcceptanceConfig:
        names = [p.name for p in self.prompts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"prompts: the name {twice[0]!r} is used twice (the golden keeps answers by name)")
        if self.fingerprint and not self.prompts:
            raise ValueError("prompts: the fingerprint needs at least one prompt (or fingerprint = false)")
        return self
