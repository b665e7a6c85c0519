"""The ``[notify]`` section: webhooks that tell a person at once, without a monitoring stack (issue 40).

A target's URL is a secret (a Slack or ntfy URL is all it takes to post there), under the secret rule
(:mod:`sparkd.config.secretrule`): it comes from the config (``url``), a file that is root's alone (``url_file``) or
a variable of sparkd's own environment (``url_env``: a systemd drop-in's ``Environment=`` or ``EnvironmentFile=``),
and everything sparkd shows or logs says :func:`masked_url` instead. :mod:`sparkd.config` assembles the section.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sparkd.config.secretfile import SecretFileProblem, read_secret_file
from sparkd.config.secretrule import MASK
from sparkd.config.sections import _ENV_NAME, _Section

__all__ = ["NotifyConfig", "NotifyTarget", "NotifyUrlProblem", "Severity", "masked_url", "notify_secrets",
           "target_url"]


class Severity(StrEnum):
    info = "info"
    warning = "warning"
    critical = "critical"

    @property
    def rank(self) -> int:
        return ("info", "warning", "critical").index(self.value)


Shape = Literal["json", "ntfy", "slack"]


class NotifyTarget(_Section):
    """One webhook: where it is, the payload it takes, and what it wants to hear."""

    name: str | None = Field(default=None, description=(
        "The target's name in status and sparkd's log; default: its shape and place in the list (`slack-1`)."))
    shape: Shape = Field(default="json", description=(
        "The payload: `json` (a generic POST of the event as a JSON object), `ntfy` (an ntfy.sh topic URL: title, "
        "priority and tags as headers, the text as the body) or `slack` (a Slack-compatible incoming webhook: "
        "`{\"text\": ...}`; Mattermost, Rocket.Chat and Discord's `/slack` endpoint take it too)."))
    url: str | None = Field(default=None, description=(
        "The webhook's URL (http or https). A secret: prefer `url_file` or `url_env` and keep the config free of "
        "it; shown as scheme and host only."))
    url_file: Path | None = Field(default=None, description=(
        "A file holding the URL (root's, mode 0600), instead of `url`."))
    url_env: str | None = Field(default=None, description=(
        "The name of a variable of sparkd's own environment holding the URL (a unit's `Environment=` or "
        "`EnvironmentFile=`), instead of `url`."))
    min_severity: Severity | None = Field(default=None, description=(
        "The least severe event this target hears; default: `[notify] min_severity`."))

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = url_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("url_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> NotifyTarget:
        given = [k for k in ("url", "url_file", "url_env") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a notify target needs exactly one of url, url_file, url_env "
                             f"({'none' if not given else ', '.join(given)} given)")
        return self


class NotifyConfig(_Section):
    """Notifications: one or more webhooks told of failures, the breaker, a needed reboot, changed answers, the
    memory guard's actions, recoveries, and that sparkd started watching. Sending never holds the daemon up."""

    targets: list[NotifyTarget] = Field(default_factory=list, description=(
        "The webhooks (`[[notify.targets]]`); none: no notifications (the notifier is not even loaded). A reload "
        "takes a changed list on at once; a target that goes on keeps what it had not delivered yet."))
    min_severity: Severity = Field(default=Severity.warning, description=(
        "The least severe event sent: `info` (also recoveries and the start of watching), `warning` (failures, "
        "guard warnings) or `critical` (the breaker, a needed reboot, the guard stopping vLLM)."))
    watching: bool = Field(default=True, description=(
        "Send \"sparkd started watching\" whenever the daemon starts, whatever `min_severity` says: silence then "
        "means something."))
    burst: int = Field(default=5, ge=1, le=1000, description=(
        "Messages a target may get at once; beyond it, `per_hour`. What is held back is sent later as one summary."))
    per_hour: int = Field(default=20, ge=1, le=3600, description=(
        "Messages a target may get per hour once its burst is spent."))
    timeout_s: float = Field(default=10.0, gt=0, le=300, description=(
        "One delivery's deadline (connect, send, answer)."))
    retry_max_s: float = Field(default=300.0, ge=1, le=86400, description=(
        "A target that does not answer is tried again with backoff (2 s, doubling) up to this wait between tries; "
        "status shows it failing meanwhile."))
    queue: int = Field(default=64, ge=1, le=10000, description=(
        "Events kept per target while it does not answer; past it the oldest are dropped and counted."))


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook's address, in words that never repeat it (it may hold a token)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        return f"a webhook URL must start with http:// or https:// (got {parts.scheme or 'no'} scheme)"
    if not parts.hostname:
        return "a webhook URL needs a host"
    if parts.username or parts.password:
        return "a webhook URL with user:password@ is not supported: put the token in the path or query"
    try:
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:
        return "the webhook URL's port is not a number from 1 to 65535"
    return None


def masked_url(url: str) -> str:
    """``https://hooks.slack.com/(secret)``: where it goes, never the path or query that hold its token."""
    parts = urlsplit(url.strip())
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "?")
    port = f":{parts.port}" if _port(url) else ""
    return f"{parts.scheme}://{host}{port}/{MASK}"


def _port(url: str) -> int | None:
    try:
        return urlsplit(url.strip()).port
    except ValueError:
        return None


class NotifyUrlProblem(Exception):
    """One sentence naming the key and what is wrong, never the URL itself."""


def target_key(index: int) -> str:
    return f"notify.targets[{index}]"


def target_url(target: NotifyTarget, index: int, environ: Mapping[str, str] | None = None) -> str:
    """The target's URL from where the config says it is. Raises :class:`NotifyUrlProblem`."""
    key = target_key(index)
    if target.url is not None:
        return target.url.strip()
    if target.url_file is not None:
        try:
            url = read_secret_file(target.url_file, f"{key}.url_file")
        except SecretFileProblem as exc:
            raise NotifyUrlProblem(str(exc)) from None
    else:
        env = os.environ if environ is None else environ
        url = (env.get(target.url_env or "") or "").strip()
        if not url:
            raise NotifyUrlProblem(f"{key}.url_env: {target.url_env} is not set in sparkd's environment")
    problem = url_problem(url)
    if problem:
        where = f"{key}.url_file {target.url_file}" if target.url_file is not None else f"{key}.url_env"
        raise NotifyUrlProblem(f"{where}: {problem}")
    return url


def notify_secrets(cfg: NotifyConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every target URL that can be read: the redactor masks each wherever it appears."""
    out = []
    for index, target in enumerate(cfg.targets):
        try:
            out.append(target_url(target, index, environ))
        except NotifyUrlProblem:
            continue
    return out
