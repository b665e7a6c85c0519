"""Check: NCCL can use RDMA (RoCE) where vLLM runs, whenever its IB transport is in play.

In play: ``NCCL_IB_HCA`` is set, or a multi-node launch without ``NCCL_IB_DISABLE=1`` (the effective environment:
image ENV, ``[container] env``, ``[launch] env``). Then:

1. The HCAs exist and a port of each is ACTIVE (``<sys>/class/infiniband/<hca>/ports/<n>/state``).
   ``NCCL_IB_HCA`` is read as NCCL reads it: ``name[:port]`` entries, prefix matches unless led by ``=``, all
   but the named ones when led by ``^``. A named HCA that is missing or down fails with class ``nccl`` (a link
   can come back). Unset, with no RDMA device at all: a warning, NCCL will use TCP sockets.
2. ``/dev/infiniband`` holds ``uverbs*`` where vLLM runs (a container needs ``devices`` or ``privileged``).
3. The locked-memory limit there is unlimited, or at least ``[preflight] rdma_min_memlock``, unless the processes
   there hold CAP_IPC_LOCK (privileged, ``cap_add = ["IPC_LOCK"]``, root on the host), which lifts the limit for
   RDMA registration: NCCL registers its buffers (``ibv_reg_mr ... Cannot allocate memory`` otherwise, report 001).
4. The RoCE v2 GID index of each chosen Ethernet port is read from sysfs: the ``RoCE v2`` GID holding this node's
   fabric address (``node.address`` / ``VLLM_HOST_IP``) as an IPv4-mapped address, else the first IPv4 one. A
   configured ``NCCL_IB_GID_INDEX`` that differs fails: the index moves after a reboot, and a wrong one is the
   field's silent rendezvous timeout.

2-4 fail with class ``config_error``. The decision is pure (``decide``); the sysfs tree is read through
``ctx.sys_root`` and the rest through the runtime, so tests build both.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from sparkd.launch.render import effective_env, env_values, nccl_ib_in_play
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check, human_bytes, read_text
from sparkd.runtime.base import TargetUnavailable
from sparkd.supervisor.failures import FailureClass

ROCE_V2 = "RoCE v2"
LIMITS = "/proc/self/limits"
STATUS = "/proc/self/status"
CAP_IPC_LOCK = 14


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str
    ndev: str = ""  # the network interface the GID belongs to (gid_attrs/ndevs), where the kernel says


@dataclass(frozen=True)
class Port:
    hca: str
    number: int
    state: str  # "4: ACTIVE"
    link_layer: str = "Ethernet"
    gids: tuple[Gid, ...] = ()

    @property
    def active(self) -> bool:
        return self.state.split(":")[-1].strip() == "ACTIVE"

    @property
    def name(self) -> str:
        return f"{self.hca} port {self.number}"


@dataclass(frozen=True)
class Selection:
    """``NCCL_IB_HCA`` as NCCL reads it."""

    entries: tuple[tuple[str, int | None], ...] = ()
    exclude: bool = False
    exact: bool = False

    def matches(self, entry: tuple[str, int | None], port: Port) -> bool:
        name, number = entry
        named = port.hca == name if self.exact else port.hca.startswith(name)
        return named and (number is None or port.number == number)


@dataclass(frozen=True)
class Facts:
    """What the check saw: the ports, and (None when not read) the devices and the memlock limit there."""

    ports: tuple[Port, ...]
    selection: Selection
    devices: tuple[str, ...] | None = None
    memlock: int | None = None  # soft limit in bytes, -1 unlimited; None: not read
    ipc_lock: bool = False  # the processes there hold CAP_IPC_LOCK: the limit does not bind RDMA registration
    address: str | None = None
    gid_index: str | None = None  # NCCL_IB_GID_INDEX as configured
    min_memlock: int | None = None
    unreadable: list[str] = field(default_factory=list)


# ---- pure parts -----------------------------------------------------------------------------------------


def parse_selection(text: str) -> Selection:
    text = text.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, port = item.partition(":")
        entries.append((name, int(port) if port.isdigit() else None))
    return Selection(tuple(entries), exclude, exact)


def chosen_ports(selection: Selection, ports: Sequence[Port]) -> tuple[list[Port], list[str]]:
    """(the ports NCCL may use, a sentence per named HCA that is missing or has no active port)."""
    if not selection.entries:
        return [p for p in ports if p.active], []
    if selection.exclude:
        return [p for p in ports if p.active and not any(selection.matches(e, p) for e in selection.entries)], []
    chosen, problems = [], []
    devices = ", ".join(sorted({p.hca for p in ports})) or "none"
    for entry in selection.entries:
        name = entry[0] + (f":{entry[1]}" if entry[1] is not None else "")
        matched = [p for p in ports if selection.matches(entry, p)]
        if not matched:
            problems.append(f"NCCL_IB_HCA names {name}, which is no RDMA device here (devices: {devices})")
        elif not any(p.active for p in matched):
            problems.append("; ".join(f"{p.name} is {p.state.split(':')[-1].strip() or 'unknown'}, not ACTIVE"
                                      for p in matched))
        chosen += [p for p in matched if p.active]
    return chosen, problems


def ipv4_of(gid: str) -> str | None:
    """The IPv4 address inside an IPv4-mapped GID (``0000:...:ffff:0a00:0001`` -> ``10.0.0.1``)."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def roce_v2_index(port: Port, address: str | None) -> int | None:
    """The RoCE v2 GID index NCCL should use on ``port``: the one holding ``address``, else the first IPv4."""
    v4 = [g for g in port.gids if g.type == ROCE_V2 and ipv4_of(g.gid)]
    for gid in v4:
        if address and ipv4_of(gid.gid) == address:
            return gid.index
    return v4[0].index if v4 else None


def slot(port: Port, index: int) -> str:
    """What GID table slot ``index`` of ``port`` holds, in words."""
    for gid in port.gids:
        if gid.index == index:
            try:
                link_local = ipaddress.IPv6Address(gid.gid).is_link_local
            except ValueError:
                link_local = False
            what = "the link-local GID" if link_local else "the GID"
            mapped = ipv4_of(gid.gid)
            return f"{what} {gid.gid}" + (f" ({mapped})" if mapped else "") + f", {gid.type}"
    return "an empty slot"


def index_problem(port: Port, configured: str, address: str | None) -> str | None:
    """Why ``NCCL_IB_GID_INDEX = configured`` is wrong on ``port``, naming the index that works; or None."""
    index = roce_v2_index(port, address)
    if index is None or configured.strip() == str(index):
        return None
    what = f"of {address}" if address else "(IPv4)"
    held = slot(port, int(configured)) if configured.strip().isdigit() else "no index at all"
    return (f"NCCL_IB_GID_INDEX is {configured}, but the RoCE v2 GID {what} on {port.name} is index {index} "
            f"(index {configured} holds {held}; the index moves after a reboot: set it to {index}, or leave it "
            "unset)")


def memlock_of(limits: str) -> int | None:
    """The soft ``Max locked memory`` of a ``/proc/<pid>/limits`` text, in bytes; -1 unlimited."""
    for line in limits.splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            return -1 if soft == "unlimited" else int(soft) if soft.isdigit() else None
    return None


def has_ipc_lock(status: str) -> bool:
    """Whether ``CapEff`` of a ``/proc/<pid>/status`` text holds CAP_IPC_LOCK."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
            except (IndexError, ValueError):
                return False
    return False


def _gid_problems(facts: Facts, chosen: Sequence[Port]) -> tuple[list[str], list[str]]:
    problems, seen = [], []
    for port in chosen:
        if port.link_layer != "Ethernet":
            continue
        index = roce_v2_index(port, facts.address)
        if index is None:
            problems.append(f"{port.name} has no RoCE v2 GID with an IPv4 address (is the interface up and "
                            "addressed?)")
            continue
        seen.append(f"RoCE v2 GID index {index} on {port.name}")
        problem = index_problem(port, facts.gid_index, facts.address) if facts.gid_index is not None else None
        if problem:
            problems.append(problem)
    return problems, seen


def _place_problems(facts: Facts, where: str) -> list[str]:
    problems = []
    if facts.devices is not None and not any(d.startswith("uverbs") for d in facts.devices):
        problems.append(f"there is no /dev/infiniband/uverbs* {where} (set container.devices = "
                        "[\"/dev/infiniband\"] or container.privileged = true)")
    need = facts.min_memlock
    if facts.memlock is not None and facts.memlock != -1 and not facts.ipc_lock and (
            need is None or facts.memlock < need):
        wanted = "unlimited" if need is None else f"at least {human_bytes(need)} ([preflight] rdma_min_memlock)"
        problems.append(f"the locked-memory limit {where} is {human_bytes(facts.memlock)}, NCCL needs {wanted} to "
                        "register its RDMA buffers (set container.ulimits = { memlock = -1 })")
    return problems


def decide(facts: Facts, where: str) -> tuple[Verdict, str, FailureClass | None]:
    """Pure: the verdict, the sentence and the failure class from what was seen."""
    if not facts.ports and not facts.selection.entries:
        return Verdict.warn, "no RDMA device on this host: NCCL will use TCP sockets between the nodes", None
    chosen, link = chosen_ports(facts.selection, facts.ports)
    config = _place_problems(facts, where)
    gids, seen = _gid_problems(facts, chosen)
    config += gids
    if config or link:
        cls = FailureClass.config_error if config else FailureClass.nccl
        return Verdict.fail, "; ".join([*config, *link]), cls
    found = [f"{len(chosen)} active RDMA port(s): {', '.join(p.name for p in chosen)}", *seen]
    if facts.memlock is not None:
        found.append("locked memory " + ("unlimited" if facts.memlock == -1 else human_bytes(facts.memlock))
                     + (" (CAP_IPC_LOCK held)" if facts.ipc_lock else ""))
    if facts.unreadable:
        return Verdict.warn, "; ".join(found + facts.unreadable), None
    return Verdict.ok, "; ".join(found), None


# ---- I/O --------------------------------------------------------------------------------------------------


def _int_names(path: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())
    except OSError:
        return []


def _in_use(gid: str) -> bool:
    """An unused GID table slot reads as all zeros."""
    try:
        return int(ipaddress.IPv6Address(gid.strip())) != 0
    except ValueError:
        return False


def read_ports(infiniband: Path) -> list[Port]:
    """Every port of every HCA under ``<sys>/class/infiniband``, with its RoCE GIDs."""
    try:
        hcas = sorted(p for p in infiniband.iterdir())
    except OSError:
        return []
    ports = []
    for hca in hcas:
        for number in _int_names(hca / "ports"):
            base = hca / "ports" / str(number)
            gids = []
            for index in _int_names(base / "gids"):
                gid, kind = read_text(base / "gids" / str(index)), read_text(base / "gid_attrs" / "types" / str(index))
                if gid and kind and _in_use(gid):
                    ndev = read_text(base / "gid_attrs" / "ndevs" / str(index)) or ""
                    gids.append(Gid(index, gid.strip(), kind.strip(), ndev.strip()))
            ports.append(Port(hca.name, number, (read_text(base / "state") or "").strip(),
                              (read_text(base / "link_layer") or "Ethernet").strip(), tuple(gids)))
    return ports


async def _where_vllm_runs(ctx: PreflightContext, facts: Facts) -> Facts:
    unreadable = []
    try:
        listing = await ctx.runtime.exec(["sh", "-c", "ls -1 /dev/infiniband 2>/dev/null; true"])
        devices = tuple(listing.stdout.split())
        limits = await ctx.runtime.read_file(LIMITS)
        status = await ctx.runtime.read_file(STATUS)
    except TargetUnavailable as exc:
        return replace(facts, unreadable=[f"/dev/infiniband and ulimit -l not checked: {exc}"])
    memlock = memlock_of(limits or "")
    if memlock is None:
        unreadable.append(f"the locked-memory limit could not be read {ctx.runtime.where}")
    return replace(facts, devices=devices, memlock=memlock, ipc_lock=has_ipc_lock(status or ""),
                   unreadable=unreadable)


def in_play_env(ctx: PreflightContext) -> Mapping[str, str]:
    return env_values(effective_env(ctx.cfg, ctx.image.env if ctx.image else None, runtime=ctx.runtime.name))


@check
async def check_rdma(ctx: PreflightContext) -> CheckResult:
    env = in_play_env(ctx)
    if not nccl_ib_in_play(env, ctx.cfg.nnodes):
        return CheckResult(Verdict.ok, "NCCL's IB transport is not in play (one node, or "
                           "NCCL_IB_DISABLE=1)")
    ports = await anyio.to_thread.run_sync(read_ports, ctx.sys_root / "class" / "infiniband")
    facts = Facts(tuple(ports), parse_selection(env.get("NCCL_IB_HCA", "")),
                  address=ctx.cfg.node.address or env.get("VLLM_HOST_IP"), gid_index=env.get("NCCL_IB_GID_INDEX"),
                  min_memlock=ctx.cfg.preflight.rdma_min_memlock)
    if facts.ports or facts.selection.entries:
        facts = await _where_vllm_runs(ctx, facts)
    verdict, found, cls = decide(facts, ctx.runtime.where)
    return CheckResult(verdict, found, failure_class=cls)
