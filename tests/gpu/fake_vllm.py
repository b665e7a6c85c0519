#!/usr/bin/env python3
"""A vLLM API server in miniature over real NCCL ranks, for sparkd's daemon on a GPU host.

    fake_vllm.py serve MODEL [vLLM flags, ignored] (environment: FAKE_VLLM_WORLD, FAKE_VLLM_PORT, FAKE_VLLM_DIR)

It starts FAKE_VLLM_WORLD ranks (``nccl_rank.py``, titled ``VLLM::Worker_TP<r>``, vLLM's SIGTERM handler; each keeps
the step probe's file when the launch gives SPARKD_PROBE_DIR, as vLLM's ranks do) and serves what sparkd probes,
whatever the query string (sparkd's probes ask ``/health?probe=sparkd``, vLLM ignores it): ``/health`` 200 while
this process lives (as vLLM's API server does while a collective hangs),
``/metrics`` with no ``vllm:*`` family (sparkd's blind wedge check: the canary), and ``/v1/completions`` answered
only while rank 0's all-reduces move (a wedged collective leaves the canary unanswered, as vLLM's engine does). On
SIGTERM it passes SIGTERM to the ranks and waits for them, as vLLM's API server waits for its engine: a rank stuck
in a collective whose peer died never runs its handler, so the whole tree waits for sparkd's SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
FRESH_S = 1.0  # rank 0's progress younger than this: the engine moves


def port_of(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return 8000


class Server:
    def __init__(self, world: int, master_port: str, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.progress = work / f"progress-{os.getpid()}"
        self.ranks = [subprocess.Popen([sys.executable, str(HERE / "nccl_rank.py"), str(r), str(world), master_port,
                                        "--handler", "vllm", "--progress", str(self.progress), "--step-s", "0.01"])
                      for r in range(world)]
        print(f"fake_vllm pid {os.getpid()}: ranks {[p.pid for p in self.ranks]}", flush=True)

    def moving(self) -> bool:
        try:
            return time.time() - self.progress.stat().st_mtime < FRESH_S
        except OSError:
            return False

    def stop(self, signum: int, frame: object) -> None:
        print("fake_vllm: SIGTERM: passing it to the ranks and waiting for them", flush=True)
        for p in self.ranks:
            p.send_signal(signal.SIGTERM)
        for p in self.ranks:
            p.wait()
        print("fake_vllm: every rank ended", flush=True)
        os._exit(0)


def handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]  # vLLM routes on the path alone
            if path == "/health":
                self.reply(200, b"")
            elif path == "/metrics":
                self.reply(200, b"# no vllm families: --disable-log-stats\n", "text/plain")
            elif path == "/v1/models":
                self.reply(200, json.dumps({"data": [{"id": "fake"}]}).encode())
            else:
                self.reply(404, b"{}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            while not server.moving():  # a wedged engine never answers
                time.sleep(0.2)
            self.reply(200, json.dumps({"choices": [{"text": "pong", "index": 0}]}).encode())

    return Handler


def main(argv: list[str]) -> None:
    world = int(os.environ.get("FAKE_VLLM_WORLD", "2"))
    server = Server(world, os.environ.get("FAKE_VLLM_PORT", "29531"), Path(os.environ.get("FAKE_VLLM_DIR", "/tmp")))
    signal.signal(signal.SIGTERM, server.stop)
    while not server.moving():  # vLLM binds its port once the engine is up
        if any(p.poll() is not None for p in server.ranks):
            print("fake_vllm: a rank ended during startup", flush=True)
            sys.exit(1)
        time.sleep(0.2)
    http = ThreadingHTTPServer(("127.0.0.1", port_of(argv)), handler(server))
    http.daemon_threads = True
    print("INFO:     Application startup complete.", flush=True)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
