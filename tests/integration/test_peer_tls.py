"""The peer link in mutual TLS (``[api] tls_cert``, ``tls_key``, ``tls_ca``): the pair forms over it, Prometheus may
still scrape /metrics without a certificate, the peer API refuses a connection without one (or with one another CA
signed), a connection from a peer's address without a certificate is closed, and a tap on the fabric sees no
request in the clear. Certificates are made with openssl for the namespaces' addresses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import render_toml
from pair_harness import Intruder, Link, Pair
from test_peer_attacks import SNIFFER

PY = sys.executable

# GET PATH from HOST:PORT over TLS, checking the server against CA; with CERT KEY as the client's certificate
# unless they are "-". Prints {"status": N, "body": "..."} or {"error": "..."}.
TLS_GET = textwrap.dedent("""\
    import json, socket, ssl, sys, time
    from sparkd.cluster.peersign import Ends, sign
    host, port, path, ca, cert, key, secret = sys.argv[1:8]
    context = ssl.create_default_context(cafile=ca)
    if cert != "-":
        context.load_cert_chain(cert, key)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            ends = Ends("worker", raw.getsockname()[0], f"{host}:{port}")
            auth = (f"Authorization: {sign(secret, 'GET', path, b'', now=time.time(), ends=ends)}\\r\\n"
                    if secret != "-" else "")
            with context.wrap_socket(raw, server_hostname=host) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n{auth}\\r\\n".encode())
                data = b"".join(iter(lambda: sock.recv(65536), b""))
    except (OSError, ssl.SSLError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        raise SystemExit(0)
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    if not head:  # TLS 1.3: the server refuses a client certificate after the client's handshake is done
        print(json.dumps({"error": "SSL: the server closed the connection without answering"}))
        raise SystemExit(0)
    print(json.dumps({"status": int(head.split()[1]), "body": body.decode(errors="replace")}))
    """)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", f"/CN={name}")
    return key, cert


def issue(folder: Path, ca: tuple[Path, Path], name: str, address: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (folder / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    ext.write_text(f"subjectAltName = IP:{address}\nextendedKeyUsage = serverAuth, clientAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(ext))
    key.chmod(0o600)
    return cert, key


@pytest.fixture
def tls_pair(tmp_path: Path) -> Iterator[tuple[Pair, Path]]:
    link = Link.create()
    (tmp_path / "p").mkdir()
    pair = Pair(tmp_path / "p", link)
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = make_ca(pki, "sparkd-ca")
    for daemon, address in ((pair.head, link.head_addr), (pair.worker, link.worker_addr)):
        cert, key = issue(pki, ca, daemon.config["node"]["name"], address)
        daemon.config["api"].update({"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca[1])})
        daemon.config_path.write_text(render_toml(daemon.config))
    try:
        yield pair, pki
    finally:
        pair.close()


def tls_get(ns: str, host: str, port: int, path: str, ca: Path, cert: Path | None = None, key: Path | None = None,
            secret: str = "-") -> dict[str, Any]:
    out = subprocess.run(["ip", "netns", "exec", ns, PY, "-c", TLS_GET, host, str(port), path, str(ca),
                          str(cert or "-"), str(key or "-"), secret], capture_output=True, text=True, timeout=60,
                         check=True)
    return dict(json.loads(out.stdout))


def test_the_pair_forms_over_mutual_tls_and_the_peer_api_wants_a_certificate(tls_pair: tuple[Pair, Path],
                                                                            tmp_path: Path) -> None:
    pair, pki = tls_pair
    pair.start()
    pair.ready()
    link, port, ca = pair.link, int(pair.head.config["api"]["port"]), pki / "sparkd-ca.pem"
    secret = Path(pair.head.config["api"]["token_file"]).read_text().strip()
    intruder = Intruder.create(link.worker_ns, routed_to=(link.head_ns, link.worker_addr))
    try:
        metrics = tls_get(intruder.ns, link.head_addr, port, "/metrics", ca)
        assert metrics["status"] == 200 and "sparkd_state" in metrics["body"]  # Prometheus needs no certificate
        bare = tls_get(intruder.ns, link.head_addr, port, "/v1/status", ca, secret=secret)
        assert bare["status"] == 403 and "is not one" in bare["body"]
    finally:
        intruder.destroy()
    for path in ("/metrics", "/v1/status"):  # the peer's address without the peer's certificate: closed at once
        bare = tls_get(link.worker_ns, link.head_addr, port, path, ca, secret=secret)
        assert "error" in bare, bare
    rogue_ca = make_ca(pki, "rogue-ca")
    cert, key = issue(pki, rogue_ca, "rogue", link.worker_addr)
    rogue = tls_get(link.worker_ns, link.head_addr, port, "/v1/status", ca, cert, key, secret)
    assert "error" in rogue and "SSL" in rogue["error"], rogue  # the handshake itself fails
    worker_cert, worker_key = pki / "worker.pem", pki / "worker.key"
    good = tls_get(link.worker_ns, link.head_addr, port, "/v1/status", ca, worker_cert, worker_key, secret)
    assert good["status"] == 200 and json.loads(good["body"])["result"]["state"] == "ready"
    capture = tmp_path / "frames"
    subprocess.run(["ip", "netns", "exec", link.worker_ns, PY, "-c", SNIFFER, str(capture), "2"], check=True,
                   timeout=60)
    frames = capture.read_bytes()
    assert len(frames) > 1000 and b"/v1/status" not in frames and b"Sparkd-HMAC" not in frames
