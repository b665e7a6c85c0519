"""The one rule for what is a secret, and how a secret is shown. Pure.

A secret is ``[launch] api_key`` (or the content of ``api_key_file``), the peers' shared secret, a webhook URL of
``[notify]`` (:mod:`sparkd.config.notify`: it carries the token that lets anyone post there), and the value of
every environment variable (``[launch.env]``, ``[container.env]``) whose name has ``KEY``, ``TOKEN``, ``SECRET``,
``PASSWORD``/``PASSWD`` or ``CREDENTIAL(S)`` at the end of one of its ``_``-separated words (``HF_TOKEN``,
``NGC_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``OPENAI_APIKEY``; not ``TOKENIZERS_PARALLELISM``), or ``PAT`` or
``AUTH`` as a whole word (``GITHUB_PAT``, ``PROXY_AUTH``), or that ``[launch] secret_env`` names. A command-line
flag of such a name (``--hf-token``, ``--api-key``) carries a secret (:func:`secret_flag`). A secret reaches vLLM
through its environment only; everything sparkd shows, keeps or logs says :data:`MASK` instead, and where two
values must be compared (a reload's diff, the ranks' shared settings, a container's drift) a keyed digest stands
for each: equal values, equal digests; nothing else learnt.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

MASK = "(secret)"
_NAME = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)
_WORD = re.compile(r"(?:^|_)(?:PAT|AUTH)(?:_|$)", re.IGNORECASE)  # whole words only: PATH, AUTHOR are not
_PROCESS_KEY = secrets.token_bytes(32)  # digests compared within this process only (a reload, a drift check)


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the environment variable ``name`` holds a secret (the rule above, or listed in ``extra``)."""
    return bool(_NAME.search(name) or _WORD.search(name)) or name in set(extra)


def secret_flag(word: str) -> str | None:
    """The flag of a command-line word that carries a secret (``--api-key``, ``--hf-token``, ``--x-token=v``: a
    name the rule above calls a secret), or None."""
    if not word.startswith("--") or len(word) < 3:
        return None
    flag = word.partition("=")[0]
    return flag if is_secret_name(flag[2:].replace("-", "_")) else None


_SHAPES = re.compile(
    r"""(?P<lead>\bapi_key(?:=|['"]?\s*:\s*\[?\s*)['"]?|\b(?-i:Bearer)\s+)"""
    r"""(?P<value>[^\s'",\]}]+)""",
    re.IGNORECASE,
)
# A flag and its value: --flag=value, --flag value, "--flag", "value" (an argv as JSON); masked for a secret flag.
_FLAG = re.compile(r"""(?P<lead>(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?:=|['"]?,?\s+['"]?))"""
                   r"""(?P<value>[^\s'",\]}-][^\s'",\]}]*)""")
# NAME=value, NAME='value', NAME="value" and "NAME": "value" for any NAME; masked when NAME is a secret's name.
_NAMED = re.compile(r"""(?P<lead>\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=|['"]\s*:\s*['"]))"""
                    r"""(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s'",\]}]+)""")
# scheme://user:password@host
_URL = re.compile(r"""(?P<lead>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'"]*:)(?P<value>[^\s/@'"]+)(?=@)""")
_HINTS = ("api-key", "api_key", "bearer", "key", "token", "secret", "passw", "credential", "pat", "auth", "://")


def mask_shapes(text: str, names: Iterable[str] = ()) -> str:
    """``text`` with every value shaped like a secret masked: after a secret flag (``--api-key``, ``--hf-token``,
    ``=`` or a space), ``api_key=``/``"api_key": ``, ``Bearer``, ``NAME=`` (quoted or not) or ``"NAME": `` for a
    secret ``NAME``, and the password of ``scheme://user:password@``. Cheap when no hint of one is there."""
    extra = frozenset(names)
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS) and not any(name in text for name in extra):
        return text

    def named(match: re.Match[str]) -> str:
        value = match.group("value")
        if value.strip("'\"") != MASK and is_secret_name(match.group("name"), extra):
            quote = value[0] if value[:1] in ("'", '"') else ""
            return match.group("lead") + quote + MASK + quote
        return match.group(0)

    def flagged(match: re.Match[str]) -> str:
        if match.group("value") != MASK and secret_flag(match.group("flag")):
            return match.group("lead") + MASK
        return match.group(0)

    text = _FLAG.sub(flagged, _SHAPES.sub(lambda m: m.group("lead") + MASK, text))
    return _URL.sub(lambda m: m.group("lead") + MASK, _NAMED.sub(named, text))


def digest(value: str, key: str | bytes | None = None) -> str:
    """``(secret <12 hex>)``: an HMAC of ``value`` under ``key`` (the peers' shared secret, so the ranks can compare;
    by default a key of this process's own)."""
    raw = key.encode() if isinstance(key, str) else (key or _PROCESS_KEY)
    return f"(secret {hmac.new(raw, value.encode(), hashlib.sha256).hexdigest()[:12]})"
