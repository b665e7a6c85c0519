"""What the stand-in answers: a deterministic text per prompt, with vLLM's token ids and log-probabilities, and the
ways a broken engine answers instead (``ANSWERS`` knob, or ``<id> answers MODE`` in the control file).

- ``normal``: English words drawn by the prompt's hash: the same prompt gets the same answer, every time, at any
  concurrency (greedy decoding of a healthy model); no loop, no foreign script.
- ``changed``: the same kind of words, drawn by another hash (new weights, another kernel: clean text, other answers).
- ``garble``: fragments of real garbled outputs (text decoded twice, stray Han/Thai/Hebrew letters, U+FFFD).
- ``loop``: one token over and over (``" is is is"``).
- ``empty``: no token; finish reason ``stop``.

Every token's log-probability leads its runners-up by at least 1.5 nats: no near tie, so a changed answer is never
mistaken for a numerics flip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

ANSWER_MODES = ("normal", "changed", "garble", "loop", "empty")
VOCAB = tuple(f" {w}" for w in (
    "the", "river", "stone", "light", "morning", "city", "garden", "seven", "quiet", "window", "paper", "north",
    "music", "bridge", "summer", "answer", "number", "simple", "green", "harbor", "letter", "winter", "orange",
    "valley", "table", "silver", "forest", "planet", "little", "market", "circle", "thunder", "yellow", "island",
    "pencil", "castle", "rabbit", "copper", "meadow", "lantern", "basket", "mirror", "honest", "signal", "travel",
    "engine", "marble", "velvet", "pocket", "ladder", "saddle", "feather", "candle", "tunnel", "harvest", "compass",
    "anchor", "blanket", "cotton", "thread", "puzzle", "ribbon", "shadow", "kettle"))
# Fragments of published garbled outputs (tests/data/garble/: vllm-project/vllm#13828, #6060, #9183).
GARBAGE = ("ÑÑ‚Ð°Ð½", " Ð¿Ñ€Ð¾", "蹩", " \ufffd", "ebx", "(proxy", "该游戏", " ดาร", " האמריק", " Serif", "Î±Î»Î»",
           " cdr")
VOCAB_BASE = 100  # token ids of VOCAB start here
GARBAGE_BASE = 1000
LOOP = (" is", 563)


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]  # best first, the token itself included


def _draws(seed: str) -> Iterator[int]:
    counter = 0
    while True:
        yield from hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1


def _token(choices: tuple[str, ...], base: int, draw: int, position: int) -> Token:
    index = draw % len(choices)
    chosen = -0.05 - (draw % 17) / 100
    runners = [(choices[(index + j) % len(choices)], chosen - 1.5 - 0.5 * j) for j in range(1, 5)]
    return Token(base + index, choices[index], chosen, ((choices[index], chosen), *runners))


def answer(prompt: str, max_tokens: int, mode: str = "normal") -> list[Token]:
    """The tokens the stand-in generates for ``prompt`` (at most ``max_tokens``) in ``mode``."""
    return list(answer_tokens(prompt, max_tokens, mode))


def answer_tokens(prompt: str, max_tokens: int, mode: str = "normal") -> Iterator[Token]:
    """:func:`answer`, one token at a time: a long generation (``max_tokens`` 100000) costs nothing up front."""
    if mode == "empty" or max_tokens <= 0:
        return iter(())
    if mode == "loop":
        return iter([Token(LOOP[1], LOOP[0], -0.01, ((LOOP[0], -0.01), (" was", -3.0)))] * max_tokens)
    draws = islice(_draws(f"{'changed:' if mode == 'changed' else ''}{prompt}"), max_tokens)
    if mode == "garble":
        return (_token(GARBAGE, GARBAGE_BASE, d, i) for i, d in enumerate(draws))
    return (_token(VOCAB, VOCAB_BASE, d, i) for i, d in enumerate(draws))


def prompt_text(kind: str, body: object) -> str:
    """The text a request asks about: the chat's messages' contents, or the completion's prompt."""
    if not isinstance(body, dict):
        return ""
    if kind == "chat":
        messages = body.get("messages") or []
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else str(prompt)
