"""An event as each kind of webhook takes it. Pure.

- ``json``: the event as one JSON object (``source``, ``version``, ``kind``, ``severity``, ``node``, ``title``,
  ``text``, ``class``, ``anchor``, ``runbook``, ``at``; ``held_back`` for a summary), for any receiver of one's own.
- ``ntfy``: ntfy's publish shape (https://docs.ntfy.sh/publish/): the text as the body, ``Title``, ``Priority``
  (critical 5, warning 4, info 3), ``Tags`` (an emoji ntfy shows) and ``Click`` (the runbook) as headers. A title
  that is not ASCII goes as an RFC 2047 encoded-word, which ntfy (2.4 or newer) decodes.
- ``slack``: a Slack-compatible incoming webhook's ``{"text": ...}`` in Slack's mrkdwn (a bold title, the text, a
  link to the runbook); Mattermost, Rocket.Chat and Discord's ``/slack`` endpoint take the same.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from sparkd import __version__
from sparkd.config.notify import Severity
from sparkd.notify.events import Event

__all__ = ["Payload", "payload", "runbook_link"]

Payload = tuple[bytes, dict[str, str]]

_NTFY_PRIORITY = {Severity.critical: "5", Severity.warning: "4", Severity.info: "3"}
_NTFY_TAGS = {Severity.critical: "rotating_light", Severity.warning: "warning", Severity.info: "white_check_mark"}
_SLACK_MARK = {Severity.critical: ":rotating_light:", Severity.warning: ":warning:",
               Severity.info: ":white_check_mark:"}


def runbook_link(base: str | None, event: Event) -> str | None:
    """``<base>#<anchor>`` (``base``: sparkd's ``http://host:port/runbook``), or None when either is unknown."""
    return f"{base}#{event.anchor}" if base and event.anchor else None


def payload(shape: str, event: Event, runbook: str | None = None) -> Payload:
    if shape == "ntfy":
        return _ntfy(event, runbook)
    if shape == "slack":
        return _slack(event, runbook)
    return _json(event, runbook)


def _when(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def _json(event: Event, runbook: str | None) -> Payload:
    body = {"source": "sparkd", "version": __version__, **event.to_json(), "runbook": runbook,
            "at": _when(event.at)}
    return _encode(body), {"Content-Type": "application/json"}


def _header(text: str) -> str:
    one_line = " ".join(text.split())
    if one_line.isascii():
        return one_line
    return f"=?utf-8?b?{base64.b64encode(one_line.encode()).decode()}?="


def _ntfy(event: Event, runbook: str | None) -> Payload:
    headers = {"Content-Type": "text/plain; charset=utf-8", "Title": _header(event.title),
               "Priority": _NTFY_PRIORITY[event.severity], "Tags": f"{_NTFY_TAGS[event.severity]},sparkd"}
    if runbook:
        headers["Click"] = runbook
    return event.text.encode("utf-8"), headers


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack(event: Event, runbook: str | None) -> Payload:
    lines = [f"{_SLACK_MARK[event.severity]} *{_slack_escape(event.title)}*", _slack_escape(event.text)]
    if runbook:
        lines.append(f"<{runbook}|What to do: the runbook>")
    return _encode({"text": "\n".join(lines)}), {"Content-Type": "application/json"}


def _encode(body: object) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
