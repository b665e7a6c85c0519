"""The ``sparkctl`` program: ``status`` without click, everything else through :mod:`sparkd.cli.sparkctl`.

``sparkctl status`` is what operators and scripts (and monitoring) run most; it answers in a fraction of the
interpreter's own start-up on top of it (tests/bench/bench_cli.py, issue 28): the arguments ``[--json]
[--socket PATH] [--config FILE] status`` in any order are read here, and anything else — ``--help``, another
subcommand, a TAB completion, an option this does not know — goes to the click program, which says the same
things the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["main", "status_args"]

_VALUED = ("--socket", "--config")


def status_args(args: list[str]) -> tuple[Path | None, Path | None, bool] | None:
    """(socket, config, json) when ``args`` are ``status`` and global options only (each at most once)."""
    found: dict[str, str] = {}
    seen_status = False
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, value = word.partition("=")
        if word == "status" and not seen_status:
            seen_status = True
        elif word == "--json" and "--json" not in found:
            found["--json"] = ""
        elif name in _VALUED and name not in found:
            if not eq:
                if i + 1 >= len(args) or not args[i + 1] or args[i + 1].startswith("-"):
                    return None
                i += 1
                value = args[i]
            if not value:
                return None
            found[name] = value
        else:
            return None
        i += 1
    if not seen_status:
        return None
    socket, config = found.get("--socket"), found.get("--config")
    return (Path(socket) if socket else None, Path(config) if config else None, "--json" in found)


def _status(socket: Path | None, config: Path | None, as_json: bool) -> int:
    import json

    from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
    from sparkd.cli.confignote import config_note
    from sparkd.cli.locate import locate
    from sparkd.commands import status

    located = locate(socket, config)
    if located.note:
        print(f"sparkctl: {located.note}", file=sys.stderr)
    try:
        result = ControlClient(located.socket).call(status.COMMAND, status.Request())
    except DaemonUnreachable as exc:
        if as_json:
            print(json.dumps({"state": "unreachable", "ready": False, "error": str(exc)}))
        else:
            print(f"sparkctl: {exc}", file=sys.stderr)
        _say(config_note(config, located.note))
        return status.EXIT_UNREACHABLE
    except ActionRefused as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc), "result": exc.result}))
        else:
            print(f"sparkctl status: refused: {exc}", file=sys.stderr)
        return status.EXIT_UNHEALTHY
    print(json.dumps(result, indent=2) if as_json else status.render(result))
    # The daemon's status speaks for the config file it runs from; another FILE is validated here.
    _say(config_note(config, located.note, result.get("config") if isinstance(result, dict) else None))
    return status.exit_code(result)


def _say(note: str | None) -> None:
    if note:
        sys.stdout.flush()
        print(f"sparkctl: {note}", file=sys.stderr)


def main() -> None:
    quick = None if os.environ.get("_SPARKCTL_COMPLETE") else status_args(sys.argv[1:])
    if quick is not None:
        try:
            sys.stdout.flush()
            code = _status(*quick)
            sys.stdout.flush()
        except BrokenPipeError:  # `sparkctl status | head -1`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = 1
        sys.exit(code)
    from sparkd.cli.sparkctl import main as program

    program()
