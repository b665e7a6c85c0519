"""The one rule for what is a secret, and how a secret is shown. Pure.

A secret is ``[launch] api_key`` (or the content of ``api_key_file``), the peers' shared secret, a webhook URL of
``[notify]`` (:mod:`sparkd.config.notify`: it carries the token that lets anyone post there), and the value of
every environment variable (``[launch.env]``, ``[container.env]``) whose name has ``KEY``, ``TOKEN``, ``SECRET``,
``PASSWORD``/``PASSWD`` or ``CREDENTIAL(S)`` at the end of one of its ``_``-separated words (``HF_TOKEN``,
``NGC_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``OPENAI_APIKEY``; not ``TOKENIZERS_PARALLELISM``), or that
``[launch] secret_env`` names. A secret reaches vLLM through its environment only; everything sparkd shows, keeps
or logs says :data:`MASK` instead, and where two values must be compared (a reload's diff, the ranks' shared
settings, a container's drift) a keyed digest stands for each: equal values, equal digests; nothing else learnt.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

MASK = "(secret)"
_NAME = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)
_PROCESS_KEY = secrets.token_bytes(32)  # digests compared within this process only (a reload, a drift check)


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the environment variable ``name`` holds a secret (the rule above, or listed in ``extra``)."""
    return bool(_NAME.search(name)) or name in set(extra)


_SHAPES = re.compile(
    r"""(?P<lead>--api-key(?:=|['"]?,?\s+['"]?)|\bapi_key(?:=|['"]?\s*:\s*\[?\s*)['"]?|\b(?-i:Bearer)\s+)"""
    r"""(?P<value>[^\s'",\]}]+)""",
    re.IGNORECASE,
)
# NAME=value and "NAME": "value" for any NAME; the replacement masks the value when NAME is a secret's name.
_NAMED = re.compile(r"""(?P<lead>\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=|['"]\s*:\s*['"]))(?P<value>[^\s'",\]}]+)""")
_HINTS = ("api-key", "api_key", "bearer", "key", "token", "secret", "passw", "credential")


def mask_shapes(text: str, names: Iterable[str] = ()) -> str:
    """``text`` with every value shaped like a secret masked: after ``--api-key``, ``api_key=``/``"api_key": ``,
    ``Bearer``, and ``NAME=`` or ``"NAME": `` for a secret ``NAME``. Cheap when no hint of one is there."""
    extra = frozenset(names)
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS) and not any(name in text for name in extra):
        return text

    def named(match: re.Match[str]) -> str:
        if match.group("value") != MASK and is_secret_name(match.group("name"), extra):
            return match.group("lead") + MASK
        return match.group(0)

    return _NAMED.sub(named, _SHAPES.sub(lambda m: m.group("lead") + MASK, text))


def digest(value: str, key: str | bytes | None = None) -> str:
    """``(secret <12 hex>)``: an HMAC of ``value`` under ``key`` (the peers' shared secret, so the ranks can compare;
    by default a key of this process's own)."""
    raw = key.encode() if isinstance(key, str) else (key or _PROCESS_KEY)
    return f"(secret {hmac.new(raw, value.encode(), hashlib.sha256).hexdigest()[:12]})"
