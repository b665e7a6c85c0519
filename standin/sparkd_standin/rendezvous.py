"""Rank coupling through the master port, the way torch's TCPStore couples vLLM's ranks across nodes.

- Global rank 0 (the head's Worker_TP0) listens on the master port and blocks until every other rank has sent
  ``JOIN <rank>``; then it answers ``GO`` to all. A bind failure and a join timeout fail with torch's texts.
- Other ranks connect to master-addr:master-port, retrying every second with c10d's warning line, and time out
  with torch's text.
- After the join both sides send a heartbeat byte every second. Rank 0 only records a lost peer (vLLM notices
  it at the next collective). Rank 0 also sends ``s`` at each step it begins, and a client counts it as its own
  step (the step probe's file of a headless rank: ``probe.py``). A client whose server went away prints torch's
  "should dump" / recvValue warnings every 2 s, forever: the headless node hangs.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import queue
import socket
import threading
import time
from collections.abc import Callable

from sparkd_standin import logfmt

HEARTBEAT_S = 1.0
LOST_WARNING_EVERY_S = 2.0
RETRY_DELAY_S = 1.0
_RECV_CLOSED = "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"


class DistError(Exception):
    """A torch.distributed failure; ``exc_line`` is the last line of its traceback."""

    def __init__(self, exc_line: str) -> None:
        super().__init__(exc_line)
        self.exc_line = exc_line


def store_bind_address(master_addr: str) -> str:
    """The TCPStore listens on 0.0.0.0; a loopback alias other than 127.0.0.1 is bound as is (tests)."""
    try:
        address = ipaddress.ip_address(master_addr)
    except ValueError:
        return "0.0.0.0"
    return master_addr if address.is_loopback and master_addr != "127.0.0.1" else "0.0.0.0"


def _listen_error(port: int, exc: OSError) -> DistError:
    code = exc.errno or errno.EADDRINUSE
    name = errno.errorcode.get(code, "UNKNOWN")
    message = "address already in use" if code == errno.EADDRINUSE else (exc.strerror or "").lower()
    return DistError(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        f"address. port: {port}, useIpv6: false, code: -{code}, name: {name}, message: {message}"
    )


class _Heartbeat:
    """Sends a byte every second on each socket and calls ``on_lost`` once when any peer goes away.

    ``silent_s()`` says how long the quietest peer has sent nothing: a frozen (SIGSTOPped, wedged) rank keeps
    its connection open but stops beating, and a collective with it would block, as NCCL's does."""

    def __init__(self, sockets: list[socket.socket], on_lost: threading.Event,
                 on_step: Callable[[], None] | None = None) -> None:
        self._sockets = sockets
        self._lost = on_lost
        self._on_step = on_step
        self._heard = {id(sock): time.monotonic() for sock in sockets}
        for sock in sockets:
            sock.settimeout(None)
            threading.Thread(target=self._read, args=(sock,), daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def silent_s(self) -> float:
        return time.monotonic() - min(self._heard.values(), default=time.monotonic())

    def _read(self, sock: socket.socket) -> None:
        try:
            while data := sock.recv(64):
                self._heard[id(sock)] = time.monotonic()
                for _ in range(data.count(b"s") if self._on_step else 0):
                    self._on_step()  # type: ignore[misc]
        except OSError:
            pass
        self._lost.set()

    def _beat(self) -> None:
        while not self._lost.is_set():
            for sock in self._sockets:
                try:
                    sock.sendall(b"\n")
                except OSError:
                    self._lost.set()
            time.sleep(HEARTBEAT_S)


class StoreServer:
    def __init__(self, master_addr: str, port: int, world_size: int, timeout_s: float) -> None:
        self.port = port
        self.bind_addr = store_bind_address(master_addr)
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.peer_lost = threading.Event()
        self.heartbeat: _Heartbeat | None = None
        self._listener: socket.socket | None = None
        self._clients: dict[int, socket.socket] = {}

    def listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.bind_addr, self.port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise _listen_error(self.port, exc) from exc
        self._listener = sock

    def wait_for_clients(self) -> None:
        """Block until world_size - 1 ranks joined, then release them all."""
        assert self._listener is not None
        joins: queue.Queue[tuple[int, socket.socket]] = queue.Queue()
        deadline = time.monotonic() + self.timeout_s
        self._listener.settimeout(0.2)
        while len(self._clients) < self.world_size - 1:
            if time.monotonic() >= deadline:
                raise DistError(
                    f"torch.distributed.DistStoreError: Timed out after {int(self.timeout_s) + 1} seconds "
                    f"waiting for clients. {1 + len(self._clients)}/{self.world_size} clients joined."
                )
            with contextlib.suppress(TimeoutError):
                conn, _ = self._listener.accept()
                threading.Thread(target=_handshake, args=(conn, joins), daemon=True).start()
            while not joins.empty():
                rank, conn = joins.get()
                self._clients[rank] = conn
        for conn in self._clients.values():
            conn.sendall(b"GO\n")
        self.heartbeat = _Heartbeat(list(self._clients.values()), self.peer_lost)

    def announce_step(self) -> None:
        """Tell every other rank that a step begins (they take part in it)."""
        for conn in list(self._clients.values()):
            with contextlib.suppress(OSError):  # a lost peer is the heartbeat's to notice
                conn.sendall(b"s")

    def close(self) -> None:
        for sock in [*self._clients.values(), *([self._listener] if self._listener else [])]:
            with contextlib.suppress(OSError):
                sock.close()


def _handshake(conn: socket.socket, joins: queue.Queue[tuple[int, socket.socket]]) -> None:
    """Read ``JOIN <rank>``; anything else (a port probe) is dropped."""
    conn.settimeout(5.0)
    try:
        line = _read_line(conn)
        kind, _, rank = line.partition(" ")
        if kind == "JOIN" and rank.isdigit():
            joins.put((int(rank), conn))
            return
    except OSError:
        pass
    conn.close()


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionResetError(_RECV_CLOSED)
        data += chunk
    return data.decode().strip()


class StoreClient:
    def __init__(self, master_addr: str, port: int, rank: int, timeout_s: float,
                 on_step: Callable[[], None] | None = None) -> None:
        self.on_step = on_step
        self.addr = master_addr
        self.port = port
        self.rank = rank
        self.timeout_s = timeout_s
        self.server_lost = threading.Event()
        self._sock: socket.socket | None = None

    def _timeout_error(self) -> DistError:
        return DistError(
            f"torch.distributed.DistNetworkError: The client socket has timed out after "
            f"{int(self.timeout_s * 1000)}ms while trying to connect to ({self.addr}, {self.port})."
        )

    def _connect(self, deadline: float) -> socket.socket:
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return socket.create_connection((self.addr, self.port), timeout=max(0.1, min(remaining, 5.0)))
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise self._timeout_error() from exc
                logfmt.torch_warning(
                    "TCPStore.cpp:340",
                    f"[c10d] TCP client failed to connect/validate to host {self.addr}:{self.port} - retrying "
                    f"(try={attempt}, timeout={int(self.timeout_s * 1000)}ms, delay={int(RETRY_DELAY_S * 1000)}ms): "
                    f"The client socket has failed to connect to {self.addr}:{self.port} "
                    f"(errno: {exc.errno} - {exc.strerror}).",
                )
                attempt += 1
                time.sleep(max(0.0, min(RETRY_DELAY_S, deadline - time.monotonic())))

    def join(self) -> None:
        """Connect, announce this rank and block until rank 0 releases every rank."""
        deadline = time.monotonic() + self.timeout_s
        sock = self._connect(deadline)
        sock.sendall(f"JOIN {self.rank}\n".encode())
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            _read_line(sock)
        except TimeoutError as exc:
            sock.close()
            raise self._timeout_error() from exc
        except OSError as exc:
            sock.close()
            raise DistError(f"torch.distributed.DistNetworkError: {_RECV_CLOSED}") from exc
        self._sock = sock
        _Heartbeat([sock], self.server_lost, self.on_step)
        threading.Thread(target=self._warn_when_lost, daemon=True).start()

    def _warn_when_lost(self) -> None:
        self.server_lost.wait()
        assert self._sock is not None
        local, remote = self._sock.getsockname(), ("?", 0)
        with contextlib.suppress(OSError):
            remote = self._sock.getpeername()
        remote = remote if remote[0] != "?" else (self.addr, self.port)
        fd = self._sock.fileno()
        while True:
            logfmt.torch_warning(
                "ProcessGroupNCCL.cpp:1771",
                f'[PG ID 0 PG GUID 0 Rank {self.rank}] Failed to check the "should dump" flag on TCPStore, '
                f"(maybe TCPStore server has shut down too early), with error: {_RECV_CLOSED}",
                rank=self.rank,
            )
            logfmt.torch_warning(
                "TCPStore.cpp:125",
                f"[c10d] recvValue failed on SocketImpl(fd={fd}, addr=[{local[0]}]:{local[1]}, "
                f"remote=[{remote[0]}]:{remote[1]}): {_RECV_CLOSED}",
            )
            time.sleep(LOST_WARNING_EVERY_S)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
