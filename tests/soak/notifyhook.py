"""The notifier under soak (issue 40): each node's ``[notify]`` points at a flaky webhook endpoint in the node's own
network namespace (tests/webhook_endpoint.py run there: it answers, errors, hangs for ``HANG_S`` and refuses in
turn), and the daemon must never wait on it.

On by default (``SOAK_NOTIFY=0`` runs the soak without it). What must hold:

- **the daemon never waits on it**: whenever the node's endpoint holds a request unanswered, a ``GET /v1/status`` on
  the node's control socket answers within the soak's control-API bound (``faults.API_BOUND_S``): the loop that
  would post to the webhook is the one that serves it;
- the notifier's queue stays bounded (``[notify] queue`` and the one in flight), as its status says;
- by the end, each node's endpoint heard the node start watching, and every failure class the node recorded reached
  its endpoint, or was held back by the rate limit, or dropped while the endpoint misbehaved (counted in status).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from invariants import Ledger

ENABLED = os.environ.get("SOAK_NOTIFY", "1") != "0"
HANG_S = 12.0
PROBE_S = 0.5
QUEUE = 32
ENDPOINT = Path(__file__).resolve().parents[1] / "webhook_endpoint.py"


def section(port: int) -> dict[str, Any]:
    """The ``[notify]`` of a node whose endpoint listens on ``port`` of its namespace's loopback."""
    return {"min_severity": "info", "timeout_s": 2, "retry_max_s": 4, "queue": QUEUE, "burst": 100, "per_hour": 3600,
            "targets": [{"name": "flaky-json", "shape": "json", "url": f"http://127.0.0.1:{port}/json"},
                        {"name": "flaky-ntfy", "shape": "ntfy", "url": f"http://127.0.0.1:{port}/ntfy"}]}


class Endpoint:
    """One node's flaky endpoint, a program of its own in the node's network namespace (ended by its PID)."""

    def __init__(self, ns: str, port: int, record: Path) -> None:
        self.record = record
        self.held_file = record.with_name(record.name + ".held")
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(ENDPOINT), "--port", str(port),
                                      "--mode", "flaky", "--hang-s", str(HANG_S), "--record", str(record)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def held(self) -> int:
        try:
            return int(self.held_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def received(self) -> list[dict[str, Any]]:
        try:
            lines = self.record.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def delivered_kinds(received: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(kind, failure class) of every JSON event the endpoint was sent (answered or not)."""
    out = []
    for entry in received:
        if entry.get("path") != "/json":
            continue
        try:
            body = json.loads(entry.get("body") or "")
        except ValueError:
            continue
        out.append((str(body.get("kind")), body.get("class")))
    return out


def accounted(status: dict[str, Any]) -> int:
    """What a daemon's notifier says it held back, dropped or has queued for the flaky target."""
    targets = {t.get("name"): t for t in (status.get("notify") or {}).get("targets") or []}
    return sum((targets.get("flaky-json") or {}).get(k, 0) for k in ("held_back", "dropped", "queued"))


def final_violations(node: str, status: dict[str, Any], received: list[dict[str, Any]],
                     classes_recorded: set[str], earlier: int = 0) -> list[str]:
    """What the end of the soak says about one node's notifier (pure: its status, what its endpoint was sent, the
    failure classes its incidents hold, and ``earlier``: what the node's SIGKILLed daemons had accounted for, as
    their last status said; a new daemon's counts start at 0)."""
    notify = status.get("notify")
    if notify is None:
        return [f"{node}: the daemon reports no notifier although its [notify] has targets"]
    out = []
    kinds = delivered_kinds(received)
    if ("watching", None) not in kinds:
        out.append(f"{node}: its webhook never heard it start watching")
    targets = {t.get("name"): t for t in notify.get("targets") or []}
    missing = sorted(c for c in classes_recorded if ("failure", c) not in kinds and ("breaker_open", c) not in kinds)
    if missing and accounted(status) + earlier == 0:
        out.append(f"{node}: failures of class {', '.join(missing)} reached neither its webhook nor the notifier's "
                   "held-back, dropped or queued counts")
    for name, target in targets.items():
        if (target.get("queued") or 0) > QUEUE + 1:
            out.append(f"{node}: the notifier's queue for {name} grew past [notify] queue ({target['queued']})")
    return out


class Prober(threading.Thread):
    """While a node's endpoint holds a request, time the node's control API: an answer slower than the bound is the
    daemon waiting on its webhook."""

    def __init__(self, endpoints: dict[str, Endpoint], sockets: dict[str, Path], ledger: Ledger,
                 alive: Callable[[str], bool], bound_s: float) -> None:
        super().__init__(name="notify-prober", daemon=True)
        self.endpoints, self.sockets, self.ledger, self.alive = endpoints, sockets, ledger, alive
        self.bound_s = bound_s
        self.halt = threading.Event()
        self.probes = 0  # control requests made while a webhook request was held

    def run(self) -> None:
        while not self.halt.wait(PROBE_S):
            for node, endpoint in self.endpoints.items():
                if endpoint.held() > 0 and self.alive(node):
                    self._probe(node)

    def _probe(self, node: str) -> None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sockets[node])), timeout=30) as client:
                begun = time.monotonic()  # the request alone: making the client (its TLS context) is the prober's
                client.get("http://sparkd/v1/status")
                took = time.monotonic() - begun
        except httpx.HTTPError:
            return  # a daemon restarting (a fault's doing): the soak's own invariants judge that
        self.probes += 1
        if took > self.bound_s:
            self.ledger.add(f"{node}: the control API took more than {self.bound_s:.0f} s while its webhook held a "
                            "request: the daemon waited on the webhook", f"{took:.1f} s")


class FlakyWebhooks:
    """Both nodes' endpoints, their config sections and the prober."""

    def __init__(self, tmp: Path, namespaces: dict[str, str], port: int) -> None:
        self.port = port
        self.endpoints = {node: Endpoint(ns, port, tmp / f"{node}-webhook.jsonl") for node, ns in namespaces.items()}
        self.prober: Prober | None = None
        self.earlier: dict[str, int] = {}  # per node: what its SIGKILLed daemons had accounted for

    def before_kill(self, node: str, status: dict[str, Any]) -> None:
        """A node's daemon is about to be SIGKILLed: what its notifier accounted for dies with it."""
        self.earlier[node] = self.earlier.get(node, 0) + accounted(status)

    def start_probing(self, sockets: dict[str, Path], ledger: Ledger, alive: Callable[[str], bool],
                      bound_s: float) -> None:
        self.prober = Prober(self.endpoints, sockets, ledger, alive, bound_s)
        self.prober.start()

    def finish(self, ledger: Ledger, statuses: dict[str, dict[str, Any]], classes: dict[str, set[str]]) -> None:
        if self.prober is not None:
            self.prober.halt.set()
            self.prober.join(10)
        for node, endpoint in self.endpoints.items():
            for sentence in final_violations(node, statuses.get(node) or {}, endpoint.received(),
                                             classes.get(node, set()), self.earlier.get(node, 0)):
                ledger.add(sentence)

    def close(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.close()
