"""Secrets stay secret: the text sparkd logs, keeps or shows never holds the API key or the peer token.

A :class:`Redactor` knows the secret values (``[launch] api_key``, ``VLLM_API_KEY`` in the launch's
environment, the peer token from ``[api] token_file``) and also recognises secrets by their shape, for one it
was not told about (a key in ``extra_args``, a bearer header in a traceback): the value after ``--api-key``,
``VLLM_API_KEY=``, ``api_key=``/``"api_key": `` and ``Bearer``. Each becomes :data:`MASK`.

The shell applies it where text leaves sparkd's hands: every vLLM log line before the host log and the ring
(so incidents and ``sparkctl logs`` read redacted text), the launch log line, and the daemon's own events.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkd.config import Config

MASK = "<redacted>"
MIN_SECRET = 4  # shorter values would mask ordinary words; they are still masked by shape
_SHAPES = re.compile(
    r"""(?P<lead>--api-key(?:=|['"]?,?\s+['"]?)|VLLM_API_KEY=|\bapi_key(?:=|['"]?\s*:\s*\[?\s*)['"]?|\b(?-i:Bearer)\s+)"""
    r"""(?P<value>[^\s'",\]}]+)""",
    re.IGNORECASE,
)


class Redactor:
    """Masks known secret values and secret-shaped values in text. Cheap when there is nothing to mask."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        values = {s.strip() for s in secrets if s and len(s.strip()) >= MIN_SECRET}
        self.values = sorted(values, key=len, reverse=True)  # longest first: one secret inside another

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        if _might_hold_a_shape(text):
            text = _SHAPES.sub(lambda m: m.group("lead") + MASK, text)
        return text

    def argv(self, argv: Sequence[str]) -> list[str]:
        """An argv safe to log: the word after ``--api-key`` and every known value masked."""
        out: list[str] = []
        after_flag = False
        for word in argv:
            out.append(MASK if after_flag else self(word))
            after_flag = word.lower() == "--api-key"
        return out

    def mapping(self, data: Any) -> Any:
        """``data`` (JSON-like) with every string redacted: for incident records and status extras."""
        if isinstance(data, str):
            return self(data)
        if isinstance(data, dict):
            return {k: self.mapping(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.mapping(v) for v in data]
        return data


def _might_hold_a_shape(text: str) -> bool:
    lowered = text.lower()
    return "api-key" in lowered or "api_key" in lowered or "bearer" in lowered


def read_secret(path: Path | None) -> str | None:
    """A secret file's content (stripped), or None when unset or unreadable."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def redactor_for(cfg: Config, *, token: str | None = None) -> Redactor:
    """The daemon's redactor: the API key (from the config and the launch's env) and the peer token."""
    launch = cfg.launch
    token = token if token is not None else read_secret(cfg.api.token_file)
    return Redactor([launch.api_key, launch.env.get("VLLM_API_KEY"), cfg.container.env.get("VLLM_API_KEY"), token])
