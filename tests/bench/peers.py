"""The supervisors under test, behind one small interface: sparkd and supervisord (the field's systemd unit,
under a real systemd, is in unitpeer.py).

Each supervises the vLLM stand-in with the same argv and environment (sparkd renders them; the peers run
them word for word). The bench kills the stand-in's main process and watches from outside.

- :class:`SparkdPeer`: a real ``sparkd run`` (tests/integration/daemon_harness.py); it notices a death through
  a pidfd and logs a JSON ``exited`` event with a microsecond timestamp.
- :class:`SupervisordPeer`: Debian's supervisord 4.x, ``nodaemon``, one ``[program:x]`` per stand-in with
  ``autorestart=true`` and every other setting at its default; it notices a death on SIGCHLD and logs
  ``exited: x (...)`` with a millisecond timestamp.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from benchkit import end_process, running, wait_for
from daemon_harness import Sparkd


def _read_from(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# sparkd's log events on the way from a death to the next launch (peers.SparkdPeer.path_ms), in order.
PATH_EVENTS = ("exited", "to_stopping", "stopped", "to_backoff", "to_preflight", "to_starting", "launched")


class SparkdPeer:
    name = "sparkd"

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.daemon = Sparkd(tmp, config)
        self.port = int(config["launch"]["port"])

    def start(self) -> SparkdPeer:
        self.daemon.start()
        return self

    @property
    def pid(self) -> int:
        assert self.daemon.proc is not None
        return self.daemon.proc.pid

    def main_pid(self, old: int | None = None, timeout: float = 60) -> int:
        def current() -> int | None:
            status = self.daemon.status()
            pid = status.get("pid")
            ok = status.get("daemon_pid") == self.pid and status.get("state") in ("starting", "ready", "degraded")
            return int(pid) if ok and pid and pid != old else None

        return int(wait_for(current, timeout, "sparkd's stand-in"))

    def log_mark(self) -> int:
        return _size(self.daemon.log_path)

    def noticed_at(self, mark: int, pid: int) -> float | None:
        """Wall time of sparkd's ``exit_seen`` event for ``pid`` (its structlog timestamp, UTC, µs): logged as
        soon as the pidfd fired and the exit status was read."""
        return self._event_at(mark, pid, "exit_seen")

    def classified_at(self, mark: int, pid: int) -> float | None:
        """Wall time of the ``exited`` event: the log drained and the death classified, Exited posted."""
        return self._event_at(mark, pid, "exited")

    def start_timing(self) -> dict[str, Any] | None:
        """The current launch's ``start_timing`` from status (sparkd's steps from start requested to exec)."""
        timing = self.daemon.status().get("start_timing")
        return timing if isinstance(timing, dict) else None

    def path_ms(self, mark: int, pid: int) -> dict[str, float]:
        """Milliseconds from ``exit_seen`` of ``pid`` to each step of the recovery, from sparkd's own log."""
        events: dict[str, float] = {}
        seen: float | None = None
        for line in _read_from(self.daemon.log_path, mark):
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError, KeyError):
                event = json.loads(line)
                name = event["event"]
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                if name == "exit_seen" and event.get("pid") == pid:
                    seen = at
                if seen is None:
                    continue
                key = f"to_{event.get('to')}" if name == "transition" else name
                if key in PATH_EVENTS:
                    events.setdefault(key, round((at - seen) * 1000, 2))
        return events

    def _event_at(self, mark: int, pid: int, name: str) -> float | None:
        for line in _read_from(self.daemon.log_path, mark):
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name and event.get("pid") == pid:
                    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
        return None

    def close(self) -> None:
        try:
            self.daemon.stop(timeout=120)
        except subprocess.TimeoutExpired:
            self.daemon.kill()


class SupervisordPeer:
    name = "supervisord"

    def __init__(self, tmp: Path, programs: dict[str, tuple[list[str], dict[str, str]]]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.programs = programs
        self.conf = tmp / "supervisord.conf"
        self.log_path = tmp / "supervisord.log"
        self.proc: subprocess.Popen[bytes] | None = None
        sections = [
            "[supervisord]", "nodaemon=true", f"logfile={self.log_path}", "logfile_maxbytes=0", "loglevel=info",
            f"pidfile={tmp / 'supervisord.pid'}", f"childlogdir={tmp}", "",
        ]
        for name, (argv, env) in programs.items():
            environment = ",".join(f'{k}="{v}"' for k, v in env.items())
            sections += [f"[program:{name}]", f"command={shlex.join(argv)}", f"environment={environment}",
                         "autorestart=true", f"stdout_logfile={tmp / name}.log", "redirect_stderr=true", ""]
        self.conf.write_text("\n".join(sections))

    def start(self) -> SupervisordPeer:
        out = open(self.tmp / "supervisord.out", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(["supervisord", "-n", "-c", str(self.conf)], stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def main_pid(self, old: int | None = None, timeout: float = 60, program: str | None = None) -> int:
        """The stand-in supervisord runs for ``program`` (supervisord execs the command line directly)."""
        name = program or next(iter(self.programs))
        tail = self.programs[name][0][1:]

        def current() -> int | None:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(self.pid).children():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        # A script's command line starts with its interpreter: compare the words after argv[0].
                        if child.pid != old and child.cmdline()[-len(tail):] == tail and running(child):
                            return child.pid
            return None

        return int(wait_for(current, timeout, f"supervisord's {name}"))

    def log_mark(self) -> int:
        return _size(self.log_path)

    def noticed_at(self, mark: int, pid: int, program: str | None = None) -> float | None:
        """Wall time of supervisord's ``exited: <program> (...)`` line (local time, ms)."""
        name = program or next(iter(self.programs))
        for line in _read_from(self.log_path, mark):
            if f" exited: {name} (" in line:
                stamp = line[:23]
                return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return None

    def states(self) -> list[str]:
        return [line for line in _read_from(self.log_path, 0) if " INFO " in line]

    def close(self) -> None:
        if self.proc is not None:
            end_process(self.proc, timeout=30)
