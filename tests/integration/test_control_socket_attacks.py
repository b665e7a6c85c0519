"""A member of the control socket's group against the root daemon (security review §6), as the review ran it:
`setpriv` to nobody with the socket's group. Handover and recreate are root's (the daemon exited 0 and left vLLM
unsupervised), a huge body is refused before it is read (it took the daemon to 812 MB), deep JSON is a 400 (it was a
500 with a traceback in the journal). Root's own sparkctl still hands over."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import psutil
from daemon_harness import BIN, Fleet

NOBODY = 65534
# nobody in group nogroup (the socket's group here), allowed to read and search any path but not to write
MEMBER = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
          "--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]

# POST PATH on the unix socket SOCK: a body of SIZE bytes sent in 64 KiB writes (as far as the daemon reads it),
# announced by Content-Length or chunked; or BODY given. Prints {"status": N, "body": ..., "sent": bytes}.
POST = textwrap.dedent("""\
    import json, socket, sys
    sock_path, path, how, size, body = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    data = body.encode() if body else b"[" * size
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.settimeout(30)
    head = f"POST {path} HTTP/1.1\\r\\nHost: sparkd\\r\\nContent-Type: application/json\\r\\n"
    head += f"Content-Length: {len(data)}\\r\\n\\r\\n" if how == "length" else "Transfer-Encoding: chunked\\r\\n\\r\\n"
    s.sendall(head.encode())
    sent = 0
    try:
        for start in range(0, len(data), 65536):
            piece = data[start:start + 65536]
            s.sendall(piece if how == "length" else b"%x\\r\\n" % len(piece) + piece + b"\\r\\n")
            sent += len(piece)
        if how != "length":
            s.sendall(b"0\\r\\n\\r\\n")
    except OSError:
        pass  # the daemon answered and closed before the whole body was sent
    raw = b""
    try:
        while b"\\r\\n\\r\\n" not in raw or not raw.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    except OSError:
        pass
    head, _, rest = raw.partition(b"\\r\\n\\r\\n")
    print(json.dumps({"status": int(head.split()[1]), "body": json.loads(rest), "sent": sent}))
    """)


def as_member(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMBER, *argv], capture_output=True, text=True, timeout=120)


def post(socket: str, path: str, how: str = "length", size: int = 0, body: str = "") -> dict[str, object]:
    done = as_member(sys.executable, "-c", POST, socket, path, how, str(size), body)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_group_member_cannot_hand_over_recreate_bloat_or_crash_the_daemon(sparkd: Fleet) -> None:
    daemon = sparkd(api={"socket_group": "nogroup", "port": 0})
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    sock = str(daemon.socket)
    for command in ("handover", "recreate"):
        done = as_member(str(BIN / "sparkctl"), "--socket", sock, command)
        assert done.returncode != 0 and f"{command} needs root (the caller is uid {NOBODY})" in done.stderr, done
    assert daemon.proc is not None and daemon.proc.poll() is None  # still supervising
    rss = psutil.Process(daemon.proc.pid).memory_info().rss
    for how in ("length", "chunked"):
        answer = post(sock, "/v1/stop", how, size=300 * 1024 * 1024)
        assert answer["status"] == 413, answer
        assert int(answer["sent"]) < 64 * 1024 * 1024  # refused long before the 300 MB were in
    grown = psutil.Process(daemon.proc.pid).memory_info().rss - rss
    assert grown < 32 * 1024 * 1024, grown
    deep = post(sock, "/v1/stop", body="[" * 60000)
    assert deep["status"] == 400 and deep["body"] == {"ok": False, "error": "the body is nested too deeply",
                                                      "result": None}
    assert daemon.wait_state("ready")["pid"] == pid and "Traceback" not in daemon.log()
    # Root hands over: the daemon exits and vLLM keeps running for the next one.
    done = daemon.ctl("handover")
    assert done.returncode == 0, done.stderr
    assert daemon.proc.wait(30) == 0 and psutil.pid_exists(pid)  # the fleet's teardown ends that vLLM


# Holds COUNT connections to the unix socket SOCK for SECONDS, each sending a POST whose body never comes, reopening
# each one the daemon closes; prints the most seconds any stayed open and how many the daemon closed.
HOLD_UNIX = textwrap.dedent("""\
    import json, socket, sys, time
    path, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    head = (b"POST /v1/stop HTTP/1.1\\r\\nHost: sparkd\\r\\nContent-Type: application/json\\r\\n"
            b"Content-Length: 60000\\r\\n\\r\\n")
    def one():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            s.sendall(head)
        except OSError:  # refused: the uid's slots are full
            s.close()
            return None
        s.setblocking(False)
        return [s, time.monotonic()]
    held, closed, longest, end = [], 0, 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        held += [c for c in (one() for _ in range(count - len(held))) if c]
        time.sleep(0.1)
        for item in list(held):
            try:
                gone = item[0].recv(4096) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                longest = max(longest, time.monotonic() - item[1])
                closed += 1
                item[0].close()
                held.remove(item)
    now = time.monotonic()
    print(json.dumps({"closed": closed, "longest": max([longest, *(now - t for _, t in held)])}))
    """)


def test_a_group_member_cannot_hold_the_control_socket_with_bodies_that_never_come(sparkd: Fleet) -> None:
    """Review 2, #10's last line: a group member held 8 connections forever with body-less requests."""
    daemon = sparkd(api={"socket_group": "nogroup", "port": 0})
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    holder = subprocess.Popen([*MEMBER, sys.executable, "-c", HOLD_UNIX, str(daemon.socket), "20", "12"],
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        for _ in range(3):  # root's sparkctl meanwhile, in its own slots (the member's uid has filled its own)
            answer = daemon.ctl("--json", "status")  # answered (its state is the stand-in's business)
            assert answer.returncode in (0, 1) and json.loads(answer.stdout)["daemon_pid"], answer
            time.sleep(1)
        out, _ = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    stats = json.loads(out)
    assert stats["closed"] >= 20 and stats["longest"] < 5, stats  # closed at the 2 s request deadline, again
    assert daemon.status()["pid"] == pid
