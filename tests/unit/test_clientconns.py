"""Clients waiting on vLLM's API port: established connections to the port only, asked of the kernel (sock_diag) or,
where it cannot be asked, read from /proc/net/tcp{,6}."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkd.daemon.watch import clientconns
from sparkd.daemon.watch.clientconns import open_clients

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
# port 18801 = 0x4971: two clients established, one closing (CLOSE_WAIT 08), the listener (0A), another port
ROW = "   {i}: 0100007F:{local} 0100007F:{remote} {state} 00000000:00000000 00:00000000 00000000 0 0 1\n"
TCP = HEAD + "".join(ROW.format(i=i, local=local, remote=remote, state=state)
                     for i, (local, remote, state) in enumerate([
                         ("4971", "D4A2", "01"), ("4971", "D4A4", "01"), ("4971", "D4A6", "08"),
                         ("4971", "0000", "0A"), ("D4A2", "4971", "01"), ("1F90", "D4A8", "01")]))


def test_counts_the_server_side_of_established_connections(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP)
    assert open_clients(18801, proc_root=tmp_path) == 2
    assert open_clients(0x1F90, proc_root=tmp_path) == 1


def test_unreadable_tables_are_unknown_not_zero(tmp_path: Path) -> None:
    assert open_clients(18801, proc_root=tmp_path) is None


@contextmanager
def clients(n: int, family: socket.AddressFamily = socket.AF_INET) -> Iterator[int]:
    """A listener on loopback with ``n`` clients connected and accepted; its port."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        port = server.getsockname()[1]
        ends = [socket.create_connection((host, port)) for _ in range(n)]
        accepted = [server.accept()[0] for _ in range(n)]
        try:
            yield port
        finally:
            for s in ends + accepted:
                s.close()


def test_real_connections_on_this_host_are_counted_by_the_kernels_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    with clients(3) as port:
        table = clientconns._table_count(port, Path("/proc"))
        monkeypatch.setattr(clientconns, "_table_count", lambda *_: pytest.fail("read /proc/net/tcp"))
        assert open_clients(port) == 3 == table  # the server's three ends; the clients' own (dport) are not


def test_ipv6_clients_are_counted_too() -> None:
    try:
        with clients(2, socket.AF_INET6) as port:
            assert open_clients(port) == 2
    except OSError as exc:  # a host without IPv6 on loopback
        pytest.skip(f"no IPv6 loopback here: {exc}")


def test_where_the_kernel_cannot_be_asked_the_tables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(port: int, family: int) -> int:
        raise OSError("no inet_diag")

    monkeypatch.setattr(clientconns, "_diag_count", refused)
    with clients(2) as port:
        assert open_clients(port) == 2


def message(kind: int, payload: bytes = b"") -> bytes:
    """One netlink message of ``kind``, padded to 4 bytes as the kernel sends it."""
    raw = struct.pack("=IHHII", 16 + len(payload), kind, 0, 1, 0) + payload
    return raw + bytes(-len(raw) % 4)


SOCKET = message(20, bytes(72))  # an inet_diag_msg: counted, whatever it holds
DONE = message(3, struct.pack("=i", 0))


@pytest.mark.parametrize(("data", "counted"), [
    (SOCKET + SOCKET + DONE, (2, True)),
    (SOCKET * 3, (3, False)),          # more reads follow
    (DONE, (0, True)),
    (SOCKET + message(20, bytes(5)) + DONE, (2, True)),  # an odd length is padded
    (SOCKET + b"\x00" * 7, (1, False)),                  # a torn header is not a socket
])
def test_a_dumps_reads_are_counted(data: bytes, counted: tuple[int, bool]) -> None:
    assert clientconns.count_messages(data) == counted


def test_a_refused_dump_is_an_error_with_its_errno() -> None:
    with pytest.raises(OSError) as refused:
        clientconns.count_messages(message(2, struct.pack("=i", -22)))
    assert refused.value.errno == 22


@pytest.mark.parametrize(("host", "families"), [
    ("0.0.0.0", (socket.AF_INET,)), ("", (socket.AF_INET,)), ("10.0.0.1", (socket.AF_INET,)),
    ("::", (socket.AF_INET6,)), ("[::1]", (socket.AF_INET6,)), ("fe80::1", (socket.AF_INET6,)),
    ("spark1.local", (socket.AF_INET, socket.AF_INET6)),
])
def test_only_the_families_vllms_socket_accepts_are_asked(host: str, families: tuple[int, ...]) -> None:
    assert clientconns.listen_families(host) == families


def test_one_dump_a_count_for_an_ipv4_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dump walks the kernel's whole established hash (3.7 ms a dump on a 16-core host): an IPv4 listener's
    count asks for IPv4 sockets only."""
    asked: list[int] = []
    monkeypatch.setattr(clientconns, "_diag_count", lambda port, family: asked.append(family) or 1)
    assert open_clients(8000, families=clientconns.listen_families("0.0.0.0")) == 1
    assert asked == [socket.AF_INET]
