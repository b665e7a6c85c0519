"""Run a real ``sparkd run`` against the vLLM stand-in and observe it from outside, like an operator."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from freeport import free_port
from waiting import until

from sparkd.launch.rehearsal import REHEARSAL_SKIPS
from sparkd.runtime.proctree import tree
from sparkd.state.incidents import list_incidents

__all__ = ["BIN", "MODEL", "STANDIN", "STANDIN_SKIPS", "Sparkd", "alive", "as_user", "base_config", "free_port",
           "kill_tree", "peer_token", "shm_segments", "title_prefix", "tree", "unheld", "unique_prefix"]

BIN = Path(sys.executable).parent
STANDIN = BIN / "sparkd-standin"  # the sparkd-standin distribution, installed next to sparkd by `make setup`
# A hub id: the stand-in loads nothing, and preflight checks a local model path for real (config.json, shards).
MODEL = "sparkd-tests/standin"
# What a config running the stand-in lists in `[preflight] skip`, for the reason a rehearsal skips them.
STANDIN_SKIPS = sorted(REHEARSAL_SKIPS)


def peer_token(path: Path) -> Path:
    """The peers' shared secret as the package makes one (``[api] token_file``): 64 hex characters, mode 0600."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def render_toml(data: dict[str, Any]) -> str:
    top = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
              for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


_PREFIXES = iter(range(1, 1_000_000))


def unique_prefix() -> str:
    """A vLLM process-title prefix of this test's own (VLLM_PROCESS_NAME_PREFIX): sparkd's stale sweep
    matches the prefix of its launch, so daemons of other tests (or other sessions) never touch each other."""
    return f"VLLMT{os.getpid()}X{next(_PREFIXES)}"


def base_config(tmp: Path, port: int, **sections: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "runtime": "process",
        "node": {"name": "test", "role": "single"},
        "launch": {"executable": str(STANDIN), "model": MODEL, "served_model_name": "test-model",
                   "host": "127.0.0.1", "port": port},
        "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"),
                  "instances_dir": str(tmp / "instances")},
        "api": {"socket_group": "", "port": 0},
        "supervisor": {"stop_grace_s": 5, "startup_silence_s": 60},
        "restart": {"backoff_initial_s": 0.2, "backoff_max_s": 1, "jitter": 0, "budget_failures": 50,
                    "budget_window_s": 600, "consecutive_limit": 0},
        # Floors for a small test machine (the defaults are for a 128 GB GB10).
        "guard": {"warn_below": "2 GiB", "refuse_start_below": "1 GiB", "stop_below": "768 MiB",
                  "kill_below": "512 MiB"},
        "health": {"interval_s": 0.5, "timeout_s": 2, "failure_threshold": 2, "canary_interval_s": 1,
                   "canary_timeout_s": 2, "busy_grace_s": 60, "stall_after_s": 3},
        # A short memory settle: on a shared test machine MemAvailable moves with the neighbours.
        "recorder": {"settle_s": 0.2, "settle_timeout_s": 10},
        # The acceptance gate (on by default) asks the stand-in ~20 questions between starting and ready, and
        # replays them while it serves: the tests of other parts start without it; test_acceptance*.py turn it on.
        "acceptance": {"enabled": False},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    cfg.setdefault("preflight", {})
    cfg["preflight"]["skip"] = sorted({*cfg["preflight"].get("skip", []), *STANDIN_SKIPS})
    cfg["launch"].setdefault("env", {})
    cfg["launch"]["env"] = {"SPARKD_STANDIN_STARTUP_SECONDS": "0.5", "VLLM_PROCESS_NAME_PREFIX": unique_prefix(),
                            **cfg["launch"]["env"]}
    return cfg


def as_user(uid: int | None) -> list[str]:
    """The command prefix that runs a child as ``uid`` (its group the same number, no other groups). It keeps one
    capability, CAP_DAC_READ_SEARCH, so that it can still read the tests' Python (the venv's interpreter may live
    under root's 0700 home); it writes, signals and reads other users' /proc as that user does."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search"]


def title_prefix(cfg: dict[str, Any]) -> str:
    return str(cfg["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"]) + "::"


class Sparkd:
    """One ``sparkd run`` process with its config, state folder and control socket."""

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.tmp = tmp
        self.config = config
        self.config_path = tmp / "sparkd.toml"
        self.config_path.write_text(render_toml(config))
        self.state_dir = Path(config["paths"]["state_dir"])
        self.socket = Path(config["paths"]["run_dir"]) / "sparkd.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "sparkd.log"

    def start(self, *extra: str, env: dict[str, str] | None = None, limit_fds: int | None = None,
              uid: int | None = None) -> Sparkd:
        """``limit_fds``: the daemon's RLIMIT_NOFILE, soft and hard (it cannot raise it). ``uid``: run it as this
        user (and group of the same number, no other groups) instead of the test's."""
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(env or {})}

        def limit() -> None:
            if limit_fds is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit_fds, limit_fds))

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*as_user(uid), str(BIN / "sparkd"), "run", "--config",
                                          str(self.config_path), *extra],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=limit)
        return self

    def status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.state_dir / "status.json").read_text())
            return data
        except (OSError, ValueError):
            return {}

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0,
                 what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status and predicate(status):
                return status
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"sparkd exited ({self.proc.returncode}) waiting for {what}:\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; status {self.status()}\n{self.log()[-4000:]}")

    def wait_state(self, state: str, timeout: float = 60.0, **also: Any) -> dict[str, Any]:
        return self.wait_for(lambda s: s.get("state") == state and all(s.get(k) == v for k, v in also.items()),
                             timeout, f"state {state} {also}")

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "sparkctl"), "--socket", str(self.socket), *args],
                              capture_output=True, text=True, timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def events(self, name: str) -> list[dict[str, Any]]:
        """The daemon's own log events called ``name`` (its JSON lines), each with ``at``: its wall time."""
        found = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                event = json.loads(line)
                if event.get("event") == name:
                    stamp = event["timestamp"].replace("Z", "+00:00")
                    found.append({**event, "at": datetime.fromisoformat(stamp).timestamp()})
        return found

    def incidents(self) -> list[dict[str, Any]]:
        """The incident records, oldest first, read as sparkctl reads them: a folder still being written (its
        record not there yet) is left out."""
        return list(reversed(list_incidents(self.state_dir / "incidents")))

    def wait_incidents(self, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The incident records once there are ``count``: the status names a failure before its folder is written."""
        until(lambda: len(self.incidents()) >= count, f"{count} incident folder(s)", timeout)
        return self.incidents()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def end(self, timeout: float = 60.0) -> None:
        """For a teardown: stop (SIGTERM); if the daemon does not exit in ``timeout`` (stuck in a stop, as a
        mutant can be), SIGKILL it, then what it launched: its own process tree and the vLLM tree its status
        named. Never raises."""
        pid = self.status().get("pid")
        family = tree(pid) if pid else []
        if self.proc is not None and self.proc.poll() is None:
            family += tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.stop(timeout)
        self.kill()
        kill_tree(alive(family))


class Fleet:
    """The daemons a test made, each in a folder of its own under ``tmp``. ``close`` stops them and ends what
    they launched and left behind (by PID, what their status named)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.made: list[Sparkd] = []

    def __call__(self, **sections: dict[str, Any]) -> Sparkd:
        folder = self.tmp / f"d{len(self.made)}"
        folder.mkdir()
        return self.add(Sparkd(folder, base_config(folder, free_port(), **sections)))

    def add(self, daemon: Sparkd) -> Sparkd:
        self.made.append(daemon)
        return daemon

    def close(self) -> None:
        for daemon in self.made:
            daemon.end()


def kill_tree(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def shm_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(("psm_", "sem.mp-"))}


def unheld(names: set[str]) -> set[str]:
    """Those of ``names`` still in /dev/shm that no live process holds (leaked)."""
    from sparkd.preflight.shm import held_names

    return (names & shm_segments()) - held_names(Path("/dev/shm"))
