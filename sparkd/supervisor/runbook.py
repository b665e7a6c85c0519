"""Where the runbook says what to do about a failure or an alert: its path on sparkd's HTTP port and the anchor of
each section. Pure.

The runbook (``sparkd/api/runbook.md``, served as HTML at :data:`RUNBOOK_PATH`) has one section per alert
(``## SparkdBreakerOpen`` → ``#sparkdbreakeropen``) and one per failure class (``### oom`` → ``#oom``). An anchor is
made the way GitHub and pandoc make one from a heading, so the same links work on a rendered copy elsewhere.
"""

from __future__ import annotations

import re

__all__ = ["RUNBOOK_PATH", "anchor", "failure_ref"]

RUNBOOK_PATH = "/runbook"


def anchor(heading: str) -> str:
    """The anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def failure_ref(cls: str, base: str | None = None) -> str:
    """The runbook section of failure class ``cls``: ``/runbook#oom``, or under ``base`` (``http://host:9479``)."""
    return f"{(base or '').rstrip('/')}{RUNBOOK_PATH}#{anchor(cls)}"
