"""The supervisors under test, behind one small interface: sparkd, supervisord, and the field's systemd unit.

Each supervises the vLLM stand-in with the same argv and environment (sparkd renders them; the peers run
them word for word). The bench kills the stand-in's main process and watches from outside.

- :class:`SparkdPeer`: a real ``sparkd run`` (tests/integration/daemon_harness.py); it notices a death through
  a pidfd and logs a JSON ``exited`` event with a microsecond timestamp.
- :class:`SupervisordPeer`: Debian's supervisord 4.x, ``nodaemon``, one ``[program:x]`` per stand-in with
  ``autorestart=true`` and every other setting at its default; it notices a death on SIGCHLD and logs
  ``exited: x (...)`` with a millisecond timestamp.
- :class:`UnitReplay`: the field's unit (reference/field-reports/002) replayed in-process, see its docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import threading
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from benchkit import BIN, Owned, ShmLedger, end_process, running, wait_for
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
        """Wall time of sparkd's ``exited`` event for ``pid`` (its structlog timestamp, UTC, µs)."""
        for line in _read_from(self.daemon.log_path, mark):
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "exited" and event.get("pid") == pid:
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


# ---- the field's unit, replayed ---------------------------------------------------------------------------------

RESTART_SEC = 30.0  # Restart=on-failure, RestartSec=30
START_LIMIT_INTERVAL_S = 10.0  # DefaultStartLimitIntervalSec
START_LIMIT_BURST = 5  # DefaultStartLimitBurst
STOP_PATTERN = "sparkd-standin serve"  # ExecStop's pkill -9 -f "vllm serve", for the stand-in's command line


class UnitReplay(threading.Thread):
    """The field's ``vllm-ds4-head.service`` (reference/field-reports/002), one instance per thread:

    - ``ExecStartPre``: ``sync; echo 3 > /proc/sys/vm/drop_caches; rm -f /dev/shm/psm_* /dev/shm/sem.mp-*``,
      the ``rm`` scoped to the files this unit's processes held (the field's node has one vLLM; here several
      units may share the machine, and other people's files are never ours to remove).
    - ``ExecStart``: the stand-in (the field's ``docker exec ... bash launch.sh``; ``docker start`` and the
      ``sleep 5`` that follows it belong to the container and are left out, which flatters the unit by 5 s).
    - ``Type=simple``: started as soon as it is forked. ``Restart=on-failure``: a non-zero exit or a signal
      restarts after ``RestartSec=30``; exit 0 does not. ``StartLimitIntervalSec=10``/``StartLimitBurst=5``.
    - On the main process's death the stop runs: ``ExecStop``'s ``pkill -9 -f "vllm serve"`` (scoped to the
      processes this unit started: it matches command lines, and a ``VLLM::Worker`` whose title replaced its
      command line does not match), then ``KillMode=mixed`` signals the unit's cgroup, which in the field holds
      only the ``docker exec`` client: vLLM's processes live in the container's cgroup, out of reach.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path,
                 restart_sec: float = RESTART_SEC) -> None:
        super().__init__(name=f"unit-{name}", daemon=True)
        self.unit = name
        self.argv = argv
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **env}
        self.log_path = log_path
        self.restart_sec = restart_sec
        self.owned = Owned()
        self.ledger = ShmLedger()
        self.popen: subprocess.Popen[bytes] | None = None
        self.events: list[tuple[str, float, Any]] = []
        self.result = "active"
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        starts: deque[float] = deque()
        while not self._stopping.is_set():
            now = time.monotonic()
            while starts and now - starts[0] >= START_LIMIT_INTERVAL_S:
                starts.popleft()
            if len(starts) >= START_LIMIT_BURST:
                self.result = "failed (start-limit-hit)"
                self.events.append(("start-limit-hit", now, None))
                return
            starts.append(now)
            self._exec_start_pre()
            with self._lock:
                if self._stopping.is_set():
                    return
                with open(self.log_path, "ab") as out:
                    self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)
                self.owned.add_tree(self.popen.pid)
            self.events.append(("start", time.monotonic(), self.popen.pid))
            code = self.popen.wait()
            self.events.append(("exit", time.monotonic(), code))
            self._exec_stop()
            if self._stopping.is_set():
                return
            if code == 0:
                self.result = "inactive (exit 0: on-failure does not restart)"
                return
            if self._stopping.wait(self.restart_sec):
                return

    def snapshot(self) -> None:
        """Remember the current tree and the /dev/shm files it holds (the bench calls it before a kill)."""
        if self.popen is not None:
            self.ledger.note(self.owned.add_tree(self.popen.pid))

    def main_pid(self, old: int | None = None, timeout: float = 60) -> int:
        def current() -> int | None:
            popen = self.popen
            return popen.pid if popen is not None and popen.pid != old and popen.poll() is None else None

        return int(wait_for(current, timeout, f"unit {self.unit}'s stand-in"))

    def _exec_start_pre(self) -> None:
        with contextlib.suppress(OSError):
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        self.ledger.remove(self.ledger.present())

    def _exec_stop(self) -> None:
        for proc in self.owned.alive():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if STOP_PATTERN in " ".join(proc.cmdline()):
                    proc.kill()

    def stop(self) -> None:
        """``systemctl stop``: stop restarting and SIGTERM the main process (the bench ends the rest)."""
        with self._lock:
            self._stopping.set()
            if self.popen is not None:
                end_process(self.popen, timeout=15)
        self.join(30)
