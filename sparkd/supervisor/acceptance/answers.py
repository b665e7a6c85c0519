"""What the fingerprint compares: one answer, the identity a golden was recorded under, the golden. Pure data, with
the JSON shape the golden's state file keeps (:mod:`sparkd.state.golden`).

An answer is keyed ``<prompt>/<api>`` (``capital/chat``). Its token ids are vLLM's own (``return_token_ids``); its
``tokens`` are the decoded strings and ``top`` the top log-probabilities of each position, best first, where vLLM
gave them (``logprobs``). A golden keeps the request's shape (``Shape``: max_tokens, seed, top_logprobs): an answer
asked with another shape is not compared, it is recorded anew.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Answer", "Capacity", "Golden", "Identity", "Shape", "answer_key"]

TopK = tuple[tuple[str, float], ...]


def answer_key(prompt: str, api: str) -> str:
    return f"{prompt}/{api}"


@dataclass(frozen=True)
class Answer:
    prompt: str  # the prompt's name
    api: str  # "chat" | "completion"
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    tokens: tuple[str, ...] = ()  # the decoded token of each position (from the logprobs)
    top: tuple[TopK, ...] = ()  # per position: (token, logprob), best first

    @property
    def key(self) -> str:
        return answer_key(self.prompt, self.api)

    def token(self, position: int) -> str:
        """The token at ``position`` as an operator reads it: its text and id (``" Paris" (id 3681)``), or the end."""
        if position >= len(self.token_ids):
            return "the end of the answer"
        text = f"{self.tokens[position]!r} " if position < len(self.tokens) else ""
        return f"{text}(id {self.token_ids[position]})"

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "api": self.api, "token_ids": list(self.token_ids), "text": self.text,
                "finish_reason": self.finish_reason, "tokens": list(self.tokens),
                "top": [[[t, lp] for t, lp in pos] for pos in self.top]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        """Raises ValueError/TypeError/KeyError on a bad shape (the state file's reader sets the file aside)."""
        top = tuple(tuple((str(t), float(lp)) for t, lp in pos) for pos in data.get("top") or ())
        finish = data.get("finish_reason")
        return cls(str(data["prompt"]), str(data["api"]), tuple(int(i) for i in data["token_ids"]), str(data["text"]),
                   None if finish is None else str(finish), tuple(str(t) for t in data.get("tokens") or ()), top)


@dataclass(frozen=True)
class Identity:
    """What the answers were made by: the image (its digest, or the program's identity on the process runtime), the
    weights (the manifest's digest) and the launch (the hash of the rendered argv and environment, less what cannot
    change an answer: :mod:`sparkd.acceptance.identity`). None: not known."""

    image: str | None = None
    weights: str | None = None
    launch: str | None = None

    def changes(self, now: Identity) -> list[str]:
        """What differs from ``now``, each named with both values (``the weights … 3f2a91c0 → 77b0e2d4``)."""
        out = []
        for name, what in IDENTITY_PARTS.items():
            was, is_ = getattr(self, name), getattr(now, name)
            if was != is_:
                out.append(f"{what} {_short(was)} → {_short(is_)}")
        return out

    def to_json(self) -> dict[str, str | None]:
        return {"image": self.image, "weights": self.weights, "launch": self.launch}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Identity:
        return cls(*(None if data.get(k) is None else str(data[k]) for k in ("image", "weights", "launch")))


IDENTITY_PARTS = {"image": "the image", "weights": "the weights (the model directory's manifest)",
                  "launch": "the launch's flags or environment"}


def _short(value: str | None) -> str:
    if value is None:
        return "unknown"
    digest = value.split(":", 1)[1] if value.startswith("sha256:") else value
    return digest[:12] if len(digest) >= 32 else value


@dataclass(frozen=True)
class Shape:
    """The request every answer was asked with: another shape makes another answer, so it is not compared."""

    max_tokens: int
    seed: int
    top_logprobs: int

    def to_json(self) -> dict[str, int]:
        return {"max_tokens": self.max_tokens, "seed": self.seed, "top_logprobs": self.top_logprobs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Shape:
        return cls(int(data["max_tokens"]), int(data["seed"]), int(data["top_logprobs"]))


@dataclass(frozen=True)
class Capacity:
    """What vLLM logged of its KV cache at startup (:class:`sparkd.supervisor.progress.Startup`)."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None  # T of "Maximum concurrency for T tokens per request"
    kv_cache_gib: float | None = None  # "Available KV cache memory: X GiB"

    def to_json(self) -> dict[str, Any]:
        return {"kv_cache_tokens": self.kv_cache_tokens, "max_concurrency": self.max_concurrency,
                "max_concurrency_tokens": self.max_concurrency_tokens, "kv_cache_gib": self.kv_cache_gib}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Capacity:
        def num(name: str, kind: type) -> Any:
            value = data.get(name)
            return None if value is None else kind(value)
        return cls(num("kv_cache_tokens", int), num("max_concurrency", float), num("max_concurrency_tokens", int),
                   num("kv_cache_gib", float))


@dataclass(frozen=True)
class Golden:
    """The answers of the model's first accepted pass (or of ``sparkctl accept``), with what made them."""

    identity: Identity
    shape: Shape
    answers: Mapping[str, Answer] = field(default_factory=dict)  # by key
    capacity: Capacity | None = None
    recorded_at: float = 0.0  # wall time
    model: str = ""  # the launch's model (path or hub id): a golden answers for one model

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "identity": self.identity.to_json(), "shape": self.shape.to_json(),
                "answers": {k: a.to_json() for k, a in sorted(self.answers.items())},
                "capacity": None if self.capacity is None else self.capacity.to_json(),
                "recorded_at": self.recorded_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Golden:
        answers = {str(k): Answer.from_json(v) for k, v in dict(data["answers"]).items()}
        capacity = data.get("capacity")
        return cls(Identity.from_json(data["identity"]), Shape.from_json(data["shape"]), answers,
                   None if capacity is None else Capacity.from_json(capacity), float(data.get("recorded_at") or 0.0),
                   str(data.get("model") or ""))
