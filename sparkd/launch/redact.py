"""Secrets stay secret: the text sparkd logs, keeps or shows never holds a secret (:mod:`sparkd.config.secretrule`).

A :class:`Redactor` knows the secret values (the API key, every secret-named value of ``[launch.env]`` and
``[container.env]``, the peers' shared secret) and also recognises secrets by their shape, for one it was not
told about (a key in ``extra_args``, a bearer header in a traceback, another container's ``HF_TOKEN``): the value
after ``--api-key``, ``api_key=``/``"api_key": ``, ``Bearer``, and ``NAME=`` or ``"NAME": `` for a secret
``NAME``. Each becomes :data:`MASK`.

The shell applies it where text leaves sparkd's hands: every vLLM log line before the host log and the ring (so
incidents and ``sparkctl logs`` read redacted text), incident records and the container's inspect, reload
reports, and every event sparkd logs (:func:`log_processor`, a structlog processor, and the final rendered
line); the daemon rebuilds it when a reload changes the secrets (:func:`use_for_logs`).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkd.config.secretrule import MASK, is_secret_name, mask_shapes
from sparkd.launch.render import secret_values

if TYPE_CHECKING:
    from sparkd.config import Config

__all__ = ["MASK", "Redactor", "log_processor", "read_secret", "redactor_for", "use_for_logs"]

MIN_SECRET = 4  # shorter values would mask ordinary words; they are still masked by shape


class Redactor:
    """Masks known secret values and secret-shaped values in text. Cheap when there is nothing to mask."""

    def __init__(self, secrets: Iterable[str | None] = (), names: Iterable[str] = ()) -> None:
        values = {s.strip() for s in secrets if s and len(s.strip()) >= MIN_SECRET}
        self.values = sorted(values, key=len, reverse=True)  # longest first: one secret inside another
        self.names = frozenset(names)  # [launch] secret_env: secret names beyond the rule

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        return mask_shapes(text, self.names)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """An argv safe to log: the word after ``--api-key`` and every known value masked."""
        out: list[str] = []
        after_flag = False
        for word in argv:
            out.append(MASK if after_flag else self(word))
            after_flag = word.lower() == "--api-key"
        return out

    def mapping(self, data: Any) -> Any:
        """``data`` (JSON-like) with every string redacted and the value of every secret-named key masked: for
        incident records, a container's inspect, status extras."""
        if isinstance(data, str):
            return self(data)
        if isinstance(data, dict):
            return {k: MASK if isinstance(k, str) and is_secret_name(k, self.names) and isinstance(v, str) and v
                    else self.mapping(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.mapping(v) for v in data]
        return data


def read_secret(path: Path | None) -> str | None:
    """A secret file's content (stripped), or None when unset or unreadable."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def redactor_for(cfg: Config, *, token: str | None = None) -> Redactor:
    """The daemon's redactor: every secret the config holds or names, and the peers' shared secret."""
    token = token if token is not None else read_secret(cfg.api.token_file)
    return Redactor([*secret_values(cfg), token], names=cfg.launch.secret_env)


_for_logs = Redactor()


def use_for_logs(redactor: Redactor) -> Redactor:
    """Make ``redactor`` the one every log event passes through (the daemon calls it at start and on reload)."""
    global _for_logs
    _for_logs = redactor
    return redactor


def log_processor(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: every value of the event redacted (a secret-named key's value masked)."""
    for key, value in list(event.items()):
        if isinstance(value, str):
            if key not in ("event", "timestamp", "level"):
                event[key] = MASK if value and is_secret_name(key, _for_logs.names) else _for_logs(value)
        elif isinstance(value, dict | list | tuple):
            event[key] = _for_logs.mapping(value)
    return event


def redact_line(text: str) -> str:
    """The rendered log line through the same redactor (what a renderer made of an exception, for one)."""
    return _for_logs(text)
