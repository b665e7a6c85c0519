"""Check: the ports vLLM binds are free.

The API port (``[launch] port`` on ``[launch] host``; not on a headless worker) and, on the head of a
multi-node launch, the torch.distributed master port (TCPStore binds it on 0.0.0.0 inside Worker_TP0).
A port is free when a probe socket can bind it with SO_REUSEADDR, as vLLM does. When it is not, the holders are
found from ``<proc_root>/net/tcp{,6}`` (listening sockets on that port) and ``<proc_root>/<pid>/fd`` (socket
inode → PID). A holder that is stale (:mod:`sparkd.preflight.neighbours`) is ended; anything else is a neighbour:
the check fails naming its PID, command line, container and owning sparkd instance, and leaves it alone.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from sparkd.config import Config
from sparkd.preflight import holders, processes
from sparkd.preflight.base import (
    CheckResult,
    PreflightContext,
    Verdict,
    check,
    describe_cmdline,
    read_cmdline,
    visible_pids,
)
from sparkd.supervisor.failures import FailureClass

LISTEN = 0x0A


@dataclass(frozen=True)
class Wanted:
    port: int
    host: str
    what: str  # "API port (launch.port)"


@dataclass(frozen=True)
class SocketEntry:
    address: str
    port: int
    state: int
    inode: int


@dataclass(frozen=True)
class Holder:
    pid: int
    cmdline: str
    stale: bool  # a stale vLLM process: may be ended
    protected: bool = False  # the watched instance
    container: str | None = None  # the id of the container it runs in
    owner: str = ""  # the sparkd instance whose launch it is
    why: str = ""  # why it is not stale (neighbours.Judgement.why)
    names: Mapping[str, str] = field(default_factory=dict)  # container id -> name, from the engine

    def named(self) -> str:
        return holders.describe(self.pid, self.cmdline, self.container, self.owner, self.names)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    found: str
    end: tuple[int, ...] = ()  # PIDs to end (stale holders)
    failure_class: FailureClass | None = None


# ---- pure parts -----------------------------------------------------------------------------------------


def wanted_ports(cfg: Config, *, on_host_network: bool) -> list[Wanted]:
    """The ports this node's launch binds on the host's network (none when vLLM has a network of its own)."""
    if not on_host_network:
        return []
    ports = []
    if not cfg.headless:
        ports.append(Wanted(cfg.launch.port, cfg.launch.host, "API port (launch.port)"))
    if cfg.nnodes > 1 and cfg.node_rank == 0:
        ports.append(Wanted(cfg.master_port, "0.0.0.0", "master port (torch.distributed TCPStore)"))
    return ports


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def parse_net_tcp(text: str) -> list[SocketEntry]:
    """Entries of /proc/net/tcp or tcp6: local address, port, state and socket inode."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        addr, port = fields[1].rsplit(":", 1)
        try:
            out.append(SocketEntry(_address(addr), int(port, 16), int(fields[3], 16), int(fields[9])))
        except ValueError:
            continue
    return out


def holder_inodes(entries: Iterable[SocketEntry], port: int) -> set[int]:
    """Inodes of sockets listening on ``port`` (an inode of 0 is a socket no process owns any more)."""
    return {e.inode for e in entries if e.port == port and e.state == LISTEN and e.inode}


def decide(want: Wanted, bind_error: int | None, holders: list[Holder], *, dry_run: bool) -> Decision:
    """Pure: what to do about one port, given the probe's errno (None: it bound) and the holders found."""
    name = f"{want.what} {want.port}"
    if bind_error is None:
        return Decision(Verdict.ok, f"{name} is free")
    if bind_error == errno.EADDRNOTAVAIL:
        return Decision(Verdict.fail, f"{name}: {want.host} is not an address of this node (launch.host)",
                        failure_class=FailureClass.config_error)
    if bind_error != errno.EADDRINUSE:
        return Decision(Verdict.fail, f"{name} cannot be bound on {want.host}: {os.strerror(bind_error)}",
                        failure_class=FailureClass.port_in_use)
    if not holders:
        return Decision(Verdict.fail, f"{name} is in use, but no process here shows a listening socket on it "
                        "(another network namespace, or a socket bound but not yet listening)",
                        failure_class=FailureClass.port_in_use)
    if all(h.protected for h in holders):
        return Decision(Verdict.ok, f"{name} is held by the watched vLLM instance (PID "
                        f"{', '.join(str(h.pid) for h in holders)})")
    others = [h for h in holders if not h.stale and not h.protected]
    if others:
        held = "; ".join(h.named() for h in others)
        whys = "; ".join(dict.fromkeys(h.why for h in others if h.why))
        return Decision(Verdict.fail, f"{name} is held by {held}: not a stale vLLM process"
                        + (f" ({whys})" if whys else "") + ", so sparkd leaves it alone; stop it or choose another "
                        "port", failure_class=FailureClass.port_in_use)
    held = "; ".join(h.named() for h in holders)
    if dry_run:
        return Decision(Verdict.warn, f"{name} is held by stale vLLM {held}")
    return Decision(Verdict.fixed, f"{name} was held by stale vLLM {held}", end=tuple(h.pid for h in holders))


# ---- I/O --------------------------------------------------------------------------------------------------


def probe(host: str, port: int) -> int | None:
    """Bind ``host:port`` the way vLLM does (SO_REUSEADDR); the errno when that fails, else None."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return errno.EADDRNOTAVAIL
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.errno or errno.EADDRINUSE
    return None


def socket_owners(proc_root: Path, inodes: set[int]) -> dict[int, int]:
    """socket inode → PID for the visible processes holding one of ``inodes``."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    owners: dict[int, int] = {}
    if not wanted:
        return owners
    for pid in visible_pids(proc_root):
        try:
            fds = os.scandir(proc_root / str(pid) / "fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target in wanted:
                    owners.setdefault(wanted[target], pid)
    return owners


def listening_sockets(proc_root: Path) -> list[SocketEntry]:
    entries = []
    for name in ("tcp", "tcp6"):
        try:
            entries += parse_net_tcp((proc_root / "net" / name).read_text())
        except OSError:
            continue
    return entries


def find_holders(ctx: PreflightContext, port: int) -> list[Holder]:
    """The processes listening on ``port``, each judged (stale, or a neighbour and why) and placed: the
    container it runs in (its id, named later) and the sparkd instance whose launch it is."""
    inodes = holder_inodes(listening_sockets(ctx.proc_root), port)
    pids = sorted(set(socket_owners(ctx.proc_root, inodes).values()))
    if not pids:
        return []
    judged = processes.judge(ctx, pids)
    return [Holder(pid, describe_cmdline(read_cmdline(ctx.proc_root, pid)), stale=not judged[pid].neighbour,
                   protected=pid in ctx.protect, container=holders.container_of(ctx.proc_root, pid),
                   owner=judged[pid].owner, why=judged[pid].why if judged[pid].neighbour else "")
            for pid in pids]


async def _one(ctx: PreflightContext, want: Wanted) -> Decision:
    error = probe(want.host, want.port)
    found = [] if error is None else await anyio.to_thread.run_sync(find_holders, ctx, want.port)
    names = await holders.container_names(h.container for h in found if h.container)
    found = [replace(h, names=names) for h in found]
    decision = decide(want, error, found, dry_run=ctx.dry_run)
    if not decision.end:
        return decision
    ended_ok = [c for c in processes.stale_candidates(ctx) if c.pid in decision.end]
    _, survivors = await processes.end_candidates(ctx, ended_ok)
    if survivors or probe(want.host, want.port) is not None:
        return Decision(Verdict.fail, decision.found.replace(" was held", " is still held", 1)
                        + " after SIGTERM/SIGKILL", failure_class=FailureClass.port_in_use)
    return decision


@check
async def check_ports(ctx: PreflightContext) -> CheckResult:
    ctx = await processes.launch_places(ctx)
    wanted = wanted_ports(ctx.cfg, on_host_network=ctx.runtime.shares_host_network)
    if not wanted:
        return CheckResult(Verdict.ok, "no port to check (headless, or the container has its own "
                           "network)")
    decisions = [await _one(ctx, want) for want in wanted]
    worst = max(decisions, key=lambda d: list(Verdict).index(d.verdict))
    failed = [d for d in decisions if d.verdict is Verdict.fail]
    found = "; ".join(d.found for d in (failed or decisions))
    ended = [pid for d in decisions for pid in d.end]
    did = (f"ended stale holder(s) {', '.join(map(str, ended))}" if ended and worst.verdict is Verdict.fixed
           else "would end the stale holder(s)" if worst.verdict is Verdict.warn else "")
    return CheckResult(worst.verdict, found, did,
                       failure_class=failed[0].failure_class if failed else None)
