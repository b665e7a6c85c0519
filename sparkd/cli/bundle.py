"""``sparkctl bundle [-o FILE]``: one tar.gz for a bug report (what is in it: :mod:`sparkd.recorder.bundle`).

It reads the config (``--config``, default ``/etc/sparkd/sparkd.toml``: run it as root, or as a user who can read
that file), asks the daemon for its status and the flight recorder's last hour, and reads the rest from the node;
with the daemon down it still makes the bundle from the files sparkd left.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from sparkd.api.client import ActionRefused, DaemonUnreachable
from sparkd.commands import recorder, status
from sparkd.config import DEFAULT_CONFIG_PATH
from sparkd.recorder.bundle import collect, write_bundle

__all__ = ["bundle"]

HOUR_S = 3600.0


def _ask(obj: Any, now: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    try:
        with obj.client(timeout_s=60) as client:
            current = client.call(status.COMMAND, status.Request())
            flight = client.call(recorder.COMMAND, recorder.Request(since=now - HOUR_S, until=now, local=True),
                                 timeout_s=60)
            return current, flight["nodes"][0]
    except (DaemonUnreachable, ActionRefused):
        return None, None


def bundle(obj: Any, output: Path | None) -> None:
    """``sparkctl bundle`` (its options: :mod:`sparkd.cli.sparkctl`)."""
    from sparkd.cli.common import config_or_exit
    from sparkd.daemon.views.flightrecords import own_records

    path = obj.config or DEFAULT_CONFIG_PATH
    cfg = config_or_exit(path, prog="sparkctl")
    now = time.time()
    current, flight = _ask(obj, now)
    if flight is None:
        flight = own_records(cfg, now - HOUR_S, now)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = None
    bundle = collect(cfg, status=current, recorder=flight, config_text=text)
    target = output or Path(f"sparkd-bundle-{cfg.node.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}.tar.gz")
    try:
        size = write_bundle(bundle, target)
    except OSError as exc:
        click.echo(f"sparkctl bundle: cannot write {target}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    missing = sum(1 for line in bundle.manifest if ": not included: " in line)
    click.echo(f"{target} ({size / 1024:.0f} KiB, {len(bundle.files) + 1} files"
               + (f"; {missing} not included, see MANIFEST.txt" if missing else "") + ")")
