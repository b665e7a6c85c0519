"""The systemd unit that runs sparkd with a given config, as systemd has it loaded: its ``TimeoutStopSec``.

``sparkd check-config`` refuses a unit that would SIGKILL sparkd in the middle of a drained stop
(:func:`sparkd.launch.stoplint.unit_rules`). Only a unit whose ``ExecStart`` names the config being checked is
judged, so a test's config or a second instance is never held to the packaged unit; where systemd does not run
(a container, a CI runner) there is nothing to judge.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from sparkd.config import DEFAULT_CONFIG_PATH
from sparkd.launch.stoplint import UnitStop

UNIT = "sparkd.service"
SHOW = ("LoadState", "TimeoutStopUSec", "ExecStart", "FragmentPath", "DropInPaths")
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(us|usec|ms|msec|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|"
                   r"days|day|d|weeks|week|w|months|month|M|years|year|y)?")
_UNIT_S = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
           "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0,
           "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0, "week": 604800.0,
           "weeks": 604800.0, "M": 2629800.0, "month": 2629800.0, "months": 2629800.0, "y": 31557600.0,
           "year": 31557600.0, "years": 31557600.0}

Runner = Callable[[Sequence[str]], str | None]


def timespan_s(text: str) -> float | None:
    """A systemd time span (``5min``, ``1min 30s``, ``1h 2min 3.5s``, ``infinity``) in seconds; None for infinity.
    Raises ValueError for anything else."""
    text = text.strip()
    if text == "infinity":
        return None
    total, pos = 0.0, 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        m = _SPAN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"{text!r} is not a systemd time span")
        total += float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
        pos = m.end()
    if pos == 0:
        raise ValueError("an empty time span")
    return total


def systemctl_show(words: Sequence[str]) -> str | None:
    """``systemctl show`` output, or None where systemd cannot answer (not booted with it, no systemctl)."""
    try:
        done = subprocess.run(["systemctl", "show", *words], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def unit_stop(config_path: Path, *, unit: str = UNIT, run: Runner = systemctl_show) -> UnitStop | None:
    """The stop timeout of ``unit`` when systemd has it loaded and its ``ExecStart`` runs ``config_path``; else
    None."""
    text = run([unit, *(f"--property={name}" for name in SHOW)])
    if text is None:
        return None
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded" or not _runs(props.get("ExecStart", ""), config_path):
        return None
    try:
        timeout = timespan_s(props.get("TimeoutStopUSec", ""))
    except ValueError:
        return None
    drop_ins = props.get("DropInPaths", "").strip()
    source = f"from {drop_ins}" if drop_ins else f"from {props.get('FragmentPath') or unit}"
    return UnitStop(unit, timeout, source)


def _runs(exec_start: str, config_path: Path) -> bool:
    """``ExecStart`` (``{ path=... ; argv[]=/usr/bin/sparkd run --config FILE ; ... }``) runs with ``config_path``."""
    m = re.search(r"argv\[\]=([^;]*)", exec_start)
    words = m.group(1).split() if m else exec_start.split()
    wanted = {str(config_path), str(config_path.resolve())}
    named = None
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            named = words[i + 1]
        elif word.startswith("--config="):
            named = word.split("=", 1)[1]
    return named in wanted if named is not None else str(DEFAULT_CONFIG_PATH) in wanted
