"""The pair under soak: two daemons in network namespaces (the pair harness), the head's state folder on a
small tmpfs of its own (so that it can be filled), descriptors limited as systemd's default soft limit, and a
control file per node through which the stand-in's running ranks are stalled, hung or made to leak.

The restart policy is one that the soak's real faults cannot exhaust (``RESTART``): the runner lets a pair
run ``STABLE_S`` before a fault that crashes a rank, so each such fault starts a new run of consecutive
failures, and ``consecutive_limit`` sits above the few failures one fault causes; the budget's window cannot
hold ``budget_failures`` real faults at the schedule's pace (each takes seconds). So a breaker that opens
here counted something that is not a failure — a wait for the peer, a full disk — and is a violation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import notifyhook
import psutil
from daemon_harness import alive, kill_tree, title_prefix, tree
from freeport import free_port
from invariants import Node, read_status
from pair_harness import Link, NodeDaemon, pair_configs

NOFILE = 1024  # systemd's default soft limit for a service (the unit sets none today)
STATE_TMPFS = "96m"
RECOVERY_S = 150.0  # every fault ends in ready, or failed with a sentence, within this bound
STABLE_S = 2.0
RESTART = {"budget_failures": 100, "budget_window_s": 300, "consecutive_limit": 4, "stable_after_s": STABLE_S}
# Floors the leak fault lowers and restores through a reload (guard_floors); a quick stop and recovery.
GUARD = {"stop_grace_s": 5, "recover_margin": "256 MiB", "cooldown_s": 1}


class SoakPair:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.link = Link.create()
        self.mounted = False
        self.webhooks: notifyhook.FlakyWebhooks | None = None
        try:
            self._configure(tmp)
        except BaseException:
            self.link.destroy()
            raise
        self.seen: list[psutil.Process] = []
        self.expected_exit: set[str] = set()
        self.latencies: list[float] = []  # control API round trips measured during faults
        self.frozen: list[psutil.Process] = []  # a SIGSTOPped rank, until the recovery ended it
        self.solo: Any = None  # the docker-exec daemon of the opt-in dockerd restart (dockerd.Solo)
        self.before_crash: dict[str, int | None] | None = None  # both ranks' PIDs when a fault killed one
        self.killed_daemon: tuple[str, float] = ("", 0.0)  # the node whose daemon a fault killed, and when
        self._commands = 0

    def _configure(self, tmp: Path) -> None:
        # canary_timeout_s above the pair's peer_grace_s (3 s), as the defaults have it (30 s and 30 s): a
        # canary that goes unanswered while the link is down is then the peer's loss, not a hang.
        health = {"canary_interval_s": 0.5, "canary_timeout_s": 4, "busy_grace_s": 2}
        supervisor = {"log_max_bytes": 4 << 20, "log_backups": 2}
        head_cfg, worker_cfg = pair_configs(tmp, self.link, health=health, supervisor=supervisor, restart=RESTART,
                                            guard=GUARD)
        self.controls = {}
        # issue 40: each node's notifier at a flaky webhook in its namespace (unless SOAK_NOTIFY=0; notifyhook.py)
        self.webhooks = notifyhook.FlakyWebhooks(tmp, {"head": self.link.head_ns, "worker": self.link.worker_ns},
                                                 free_port()) if notifyhook.ENABLED else None
        for name, cfg in (("head", head_cfg), ("worker", worker_cfg)):
            self.controls[name] = tmp / f"{name}-control"
            cfg["launch"]["env"]["SPARKD_STANDIN_CONTROL_FILE"] = str(self.controls[name])
            if self.webhooks is not None:
                cfg["notify"] = notifyhook.section(self.webhooks.port)
        if os.environ.get("SOAK_TLS") == "1":  # the peer link in mutual TLS (its handshakes meet the floods)
            mutual_tls(tmp, ((head_cfg, self.link.head_addr), (worker_cfg, self.link.worker_addr)))
        self.head = NodeDaemon(tmp / "head", head_cfg, self.link.head_ns)
        self.worker = NodeDaemon(tmp / "worker", worker_cfg, self.link.worker_ns)
        self.head.state_dir.mkdir(parents=True, exist_ok=True)
        # mode 0750: a state directory others may write is one sparkd refuses (sparkd/host/trustedpaths.py)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_TMPFS},mode=0750", "tmpfs",
                        str(self.head.state_dir)], check=True, timeout=30)
        self.mounted = True

    @property
    def daemons(self) -> dict[str, NodeDaemon]:
        return {"head": self.head, "worker": self.worker}

    def nodes(self) -> list[Node]:
        """The nodes the invariants watch: the pair's two, and the docker-exec daemon when there is one."""
        out = [Node(name, title_prefix(d.config)[:-2], d.state_dir / "status.json",
                    (lambda d=d: d.proc.pid if d.proc is not None and d.proc.poll() is None else None))
               for name, d in self.daemons.items()]
        return out + ([self.solo.node()] if self.solo is not None else [])

    def start(self, which: str | None = None) -> None:
        for name in ([which] if which else ["worker", "head"]):
            daemon = self.daemons[name].start()
            assert daemon.proc is not None
            subprocess.run(["prlimit", "--pid", str(daemon.proc.pid), f"--nofile={NOFILE}:{NOFILE}"],
                           capture_output=True, timeout=30)
            self.expected_exit.discard(name)

    def status(self, name: str) -> dict[str, Any]:
        data, _ = read_status(self.daemons[name].state_dir / "status.json")
        return data or {}

    def current(self, name: str, status: dict[str, Any]) -> bool:
        daemon = self.daemons[name]
        return daemon.proc is not None and status.get("daemon_pid") == daemon.proc.pid

    def crashed(self) -> dict[str, int]:
        """Daemons that exited although nobody asked them to: name → exit status."""
        return {name: d.proc.returncode for name, d in self.daemons.items()
                if d.proc is not None and d.proc.poll() is not None and name not in self.expected_exit}

    def settle(self, timeout: float = RECOVERY_S) -> str:
        """Wait until both ranks are ready (returns "ready"), or one daemon is failed with a sentence
        ("failed: <sentence>"), or a daemon died ("crashed"); "timeout" after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.crashed():
                return "crashed"
            statuses = {name: self.status(name) for name in self.daemons}
            if all(self.current(n, s) and s.get("state") == "ready" for n, s in statuses.items()):
                for s in statuses.values():
                    self.seen.extend(tree(int(s["pid"])))
                return "ready"
            for name, s in statuses.items():
                failure = s.get("last_failure") or {}
                if self.current(name, s) and s.get("state") == "failed" and failure.get("message"):
                    return f"failed: {name}: {failure['message']}"
            time.sleep(0.25)
        return "timeout"

    def replaced(self, before: dict[str, int | None], timeout: float = RECOVERY_S) -> bool:
        """Wait until every rank runs under a PID other than in ``before`` (the old ones were replaced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = {name: self.rank_pid(name) for name in self.daemons}
            if all(now[n] is not None and now[n] != before.get(n) for n in now):
                return True
            if self.crashed():
                return False
            time.sleep(0.25)
        return False

    def stable(self, timeout: float = RECOVERY_S) -> bool:
        """Wait until both ranks have been ready for longer than the policy's ``stable_after_s``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = [self.status(name) for name in self.daemons]
            if all(s.get("state") == "ready" and time.time() - (s.get("since") or time.time()) > STABLE_S + 0.5
                   for s in statuses):
                return True
            if self.crashed():
                return False
            time.sleep(0.25)
        return False

    def command(self, name: str, fault: str) -> None:
        """One command to the stand-in's running ranks on ``name`` (standin/sparkd_standin/control.py)."""
        self._commands += 1
        path = self.controls[name]
        part = path.with_suffix(".part")
        part.write_text(f"{self._commands} {fault}\n")
        os.replace(part, path)

    def rank_pid(self, name: str) -> int | None:
        pid = self.status(name).get("pid")
        return int(pid) if pid else None

    def close(self) -> None:
        for daemon in self.daemons.values():
            pid = self.status_pid(daemon)
            if pid:
                self.seen.extend(tree(pid))
            with contextlib.suppress(Exception):
                daemon.stop(timeout=60)
            daemon.kill()
        kill_tree(alive(self.seen))
        if self.webhooks is not None:
            self.webhooks.close()
        self.link.destroy()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.head.state_dir)], capture_output=True, timeout=30)
            self.mounted = False

    @staticmethod
    def status_pid(daemon: NodeDaemon) -> int | None:
        data, _ = read_status(daemon.state_dir / "status.json")
        return int(data["pid"]) if data and data.get("pid") else None


def mutual_tls(tmp: Path, nodes: tuple[tuple[dict[str, Any], str], ...]) -> None:
    """A CA and one certificate per node (its address in subjectAltName), set in each config's [api]."""
    from test_peer_tls import issue, make_ca

    pki = tmp / "pki"
    pki.mkdir(exist_ok=True)
    ca = make_ca(pki, "sparkd-ca")
    for cfg, address in nodes:
        cert, key = issue(pki, ca, cfg["node"]["name"], address)
        cfg["api"].update({"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca[1])})


def stop_tree(pid: int, sig: int = signal.SIGSTOP) -> list[psutil.Process]:
    procs = tree(pid)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    return procs
