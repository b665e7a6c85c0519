"""Clients waiting on vLLM's API port, counted from /proc/net/tcp{,6}: established connections to the port only."""

from __future__ import annotations

import socket
from pathlib import Path

from sparkd.daemon.clientconns import open_clients

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


def test_a_real_connection_on_this_host_is_counted() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        before = open_clients(port)
        with socket.create_connection(("127.0.0.1", port)):
            conn, _ = server.accept()
            with conn:
                assert open_clients(port) == (before or 0) + 1
