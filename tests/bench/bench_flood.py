"""Benchmark: what a flood of silent TLS connections costs the daemon (issue 34; security review 2, #12).

    .venv/bin/python tests/bench/bench_flood.py [--connections 3000] [--hold 20] [--peer-connections 1000]
                                                [--json out.json]

A real ``sparkd run`` listens with TLS on 127.0.0.1 (a certificate of its own, the stand-in as vLLM). A client
keeps ``--connections`` TCP connections open to it for ``--hold`` seconds, reopening each one the daemon closes
(at most 500 a second), and sends nothing on any of them: no ClientHello. Twice: from one source address
(127.0.0.2) and from 30 (127.0.0.2–31); and once more from 30 sending the first 5 bytes of a ClientHello (each
then holds a TLS buffer until the handshake deadline). Sampled every half second from the daemon's PID: its RSS and open
descriptors before (the median of 5 s), during (the most) and after (5 s after the client closed everything).

The peer, same run: uvicorn serving TLS as asyncio does by default (its ``create_server``: each connection wrapped
in TLS when accepted, 60 s for a ClientHello, no cap), with a trivial app, in its own process, the same client from
one address with ``--peer-connections`` (fewer: each costs it about 300 KB until asyncio's handshake timeout).
The ratio is sparkd's RSS growth per connection the client kept trying to hold over the peer's.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from benchkit import (
    BIN,
    bench_parser,
    end_process,
    free_port,
    log,
    render_toml,
    run_bench,
    sparkd_config,
    standin_env,
    unique_prefix,
    wait_for,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
from attack_tools import HOLDER  # noqa: E402

MIB = 1 << 20
PEER = """\
import ssl, sys, uvicorn
async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), ssl_certfile=sys.argv[2], ssl_keyfile=sys.argv[3],
            log_level="warning", lifespan="off")
"""


def certificate(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "node.key", folder / "node.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    key.chmod(0o600)
    return cert, key


def scrape(port: int) -> None:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while sock.recv(65536):
            pass
    time.sleep(1)


class Sampler(threading.Thread):
    """RSS and descriptors of ``pid`` every half second until halted."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(psutil.Error):
                self.samples.append((time.monotonic(), self.proc.memory_info().rss, self.proc.num_fds()))
            self.halt.wait(0.5)

    def between(self, start: float, end: float) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if start <= s[0] <= end]


def flood(pid: int, port: int, count: int, sources: list[str], hold: float, mode: str = "silent") -> dict[str, Any]:
    """Before, during and after ``count`` silent connections held ``hold`` s from ``sources``."""
    sampler = Sampler(pid)
    sampler.start()
    time.sleep(5)
    began = time.monotonic()
    client = subprocess.run([sys.executable, "-c", HOLDER, "127.0.0.1", str(port), str(count), str(hold), mode, "/",
                             ",".join(sources), "500"], capture_output=True, text=True, timeout=hold + 600)
    ended = time.monotonic()
    time.sleep(5)
    sampler.halt.set()
    sampler.join(5)
    before = sampler.between(0, began)
    during = sampler.between(began, ended)
    after = sampler.samples[-1]
    out = {"sources": len(sources), "connections": count, "hold_s": hold, "mode": mode,
           "rss_before_mib": statistics.median(s[1] for s in before) / MIB,
           "fds_before": statistics.median(s[2] for s in before),
           "rss_during_max_mib": max(s[1] for s in during) / MIB, "fds_during_max": max(s[2] for s in during),
           "rss_after_mib": after[1] / MIB, "fds_after": after[2], "client": client.stdout.strip().splitlines()[-1:],
           "load": os.getloadavg()[0]}
    log(f"  {len(sources)} source(s), {mode}: RSS {out['rss_before_mib']:.1f} → {out['rss_during_max_mib']:.1f} → "
        f"{out['rss_after_mib']:.1f} MiB, fds {out['fds_before']:.0f} → {out['fds_during_max']} → {out['fds_after']} "
        f"(load {out['load']:.2f})")
    return out


def bench(args: Any) -> dict[str, Any]:
    started = time.monotonic()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the client's own connections
    folder = Path(tempfile.mkdtemp(prefix="sparkd-bench-flood-"))
    results: dict[str, Any] = {}
    procs: list[subprocess.Popen[Any]] = []
    try:
        cert, key = certificate(folder)
        api_port = free_port()
        cfg = sparkd_config(folder, free_port(), standin_env(unique_prefix()), api_port=api_port,
                            api={"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(cert)})
        config = folder / "sparkd.toml"
        config.write_text(render_toml(cfg))
        with open(folder / "sparkd.log", "ab") as out:
            daemon = subprocess.Popen([str(BIN / "sparkd"), "run", "--config", str(config)], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(daemon)
        wait_for(lambda: '"state": "ready"' in (folder / "state" / "status.json").read_text()
                 if (folder / "state" / "status.json").exists() else False, 90, "sparkd ready")
        before_tls = psutil.Process(daemon.pid).memory_info().rss
        scrape(api_port)  # as Prometheus or a peer would have: what TLS sets up once is in the baseline
        results["first_tls_mib"] = (psutil.Process(daemon.pid).memory_info().rss - before_tls) / MIB
        log(f"sparkd (PID {daemon.pid}), its first TLS request took {results['first_tls_mib']:.1f} MiB; "
            f"{args.connections} silent TLS connections held {args.hold} s:")
        many = [f"127.0.0.{i}" for i in range(2, 32)]
        results["sparkd"] = [flood(daemon.pid, api_port, args.connections, ["127.0.0.2"], args.hold),
                             flood(daemon.pid, api_port, args.connections, many, args.hold),
                             flood(daemon.pid, api_port, args.connections, many, args.hold, "hello")]
        end_process(daemon)
        peer_port = free_port()
        peer = subprocess.Popen([sys.executable, "-c", PEER, str(peer_port), str(cert), str(key)],
                                start_new_session=True)
        procs.append(peer)
        wait_for(lambda: psutil.Process(peer.pid).net_connections(kind="tcp"), 30, "the peer listening")
        log(f"peer: uvicorn's own TLS server (PID {peer.pid}), {args.peer_connections} connections:")
        results["peer"] = flood(peer.pid, peer_port, args.peer_connections, ["127.0.0.2"], args.hold)
        end_process(peer)
    finally:
        for proc in procs:
            end_process(proc)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    one, peer_row = results["sparkd"][0], results["peer"]
    per = (one["rss_during_max_mib"] - one["rss_before_mib"]) / args.connections
    peer_per = (peer_row["rss_during_max_mib"] - peer_row["rss_before_mib"]) / args.peer_connections
    results.update(seconds=time.monotonic() - started, ratio=round(per / peer_per, 4) if peer_per > 0 else None)
    print(f"| {args.connections} silent TLS connections | RSS before → during → after | fds before → during → "
          "after | peer, same run |\n|---|---|---|---|")
    for row in results["sparkd"]:
        what = "silent" if row["mode"] == "silent" else "a ClientHello begun"
        print(f"| from {row['sources']} address(es), {what} | {row['rss_before_mib']:.1f} → "
              f"{row['rss_during_max_mib']:.1f} → {row['rss_after_mib']:.1f} MiB | {row['fds_before']:.0f} → "
              f"{row['fds_during_max']} → {row['fds_after']} | uvicorn/asyncio, {args.peer_connections} from 1: "
              f"{peer_row['rss_before_mib']:.1f} → {peer_row['rss_during_max_mib']:.1f} → "
              f"{peer_row['rss_after_mib']:.1f} MiB, fds {peer_row['fds_during_max']} |")
    print(f"RSS per connection tried: sparkd {per * 1024:.2f} KiB, peer {peer_per * 1024:.1f} KiB "
          f"(ratio {results['ratio']}); load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return results


if __name__ == "__main__":
    parser = bench_parser(__doc__, "bench-flood.json")
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--peer-connections", type=int, default=1000)
    parser.add_argument("--hold", type=float, default=20.0)
    raise SystemExit(run_bench(parser, bench))
