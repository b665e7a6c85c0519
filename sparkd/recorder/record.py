"""One flight-recorder record: what the node looked like at one moment, and its compact binary form. Pure.

A record is ~120 bytes plus its kernel lines and events: fixed fields packed with :mod:`struct` (sizes in KiB as
``u32``, rates and ratios as ``f32``), then the peers and the text lines, each with its length, then the launch's
GPUs (index, power, utilization, memory used and total), which a reader older than that section leaves unread. A
value sparkd does not know is stored as a sentinel (all ones, NaN) and read back as ``None``. States, phases and
guard levels travel as small codes from the append-only tables below, so a newer sparkd can still read an older
ring.
The frame around a record (its length, sequence number and CRC) is :mod:`sparkd.recorder.ring`'s.
"""

from __future__ import annotations

import math
import struct
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FORMAT_VERSION", "Floors", "GpuMark", "PeerMark", "Record", "decode", "encode", "from_json", "peek",
           "to_json"]

FORMAT_VERSION = 1
KIB = 1024
MAX_LINES = 16  # kernel lines, and events, kept in one record (the rest wait for the next)
MAX_LINE_BYTES = 480
MAX_PEERS = 16
MAX_GPUS = 16

# Append-only code tables: a code's meaning never changes. A name not in a table is stored as "unknown".
STATES = ("adopting", "stopped", "preflight", "starting", "ready", "degraded", "stopping", "backoff", "failed",
          "accepting")
PHASES = ("launching", "waiting_for_peer", "loading_weights", "compiling", "kv_cache", "graph_capture",
          "api_starting", "ready", "memory_settle", "waiting_for_workers")
LEVELS = ("ok", "warn", "stop", "kill")
ACTIONS = ("ok", "warn", "refuse_start", "cooldown", "stop", "kill", "planned_restart")

_U8, _U16, _U32 = 0xFF, 0xFFFF, 0xFFFFFFFF
_NAN = float("nan")
_FIXED = struct.Struct("<Bdd16sIIIIffBBffBBHHffffIHIIIB")
_PEER = struct.Struct("<ffB")
_LINE = struct.Struct("<BH")
_GPU = struct.Struct("<BffII")
_KERNEL, _EVENT = ord("k"), ord("e")
_CLEAN = 1


@dataclass(frozen=True, slots=True)
class PeerMark:
    """One peer's daemon as this node last heard it."""

    node: str
    age_s: float | None  # seconds since its sparkd last answered (None: never)
    offset_s: float | None  # its wall clock minus ours, from the last exchange (None: not measured)
    up: bool


@dataclass(frozen=True, slots=True)
class GpuMark:
    """One GPU of the launch as the GPU sampler last read it."""

    index: int  # NVML's
    power_w: float | None = None
    util_pct: float | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None  # None on unified memory (GB10)


@dataclass(frozen=True, slots=True)
class Floors:
    """The guard's floors when the record was made, bytes."""

    warn: int
    stop: int
    kill: int


@dataclass(frozen=True, slots=True)
class Record:
    wall: float  # time.time()
    mono: float  # CLOCK_MONOTONIC seconds (this boot's)
    boot: str  # the kernel's boot id: changes with every boot
    run: int  # this daemon process's run id: changes with every sparkd start
    seq: int = 0  # the ring's sequence number (set by the ring; 0 before it is written)
    available: int | None = None  # MemAvailable, bytes
    free: int | None = None
    swap_used: int | None = None
    psi_some: float | None = None  # PSI memory some avg10, percent
    psi_full: float | None = None
    guard_level: str | None = None
    guard_action: str | None = None
    trend_slope: float | None = None  # the guard's Theil–Sen slope of MemAvailable, bytes/s
    trend_floor_s: float | None = None  # predicted seconds to the stop floor
    state: str | None = None  # the lifecycle state
    phase: str | None = None  # vLLM's startup phase, or memory_settle
    running: int | None = None  # vLLM's running requests
    waiting: int | None = None
    prompt_tps: float | None = None  # prompt tokens per second (vllm:prompt_tokens_total between scrapes)
    kv_usage: float | None = None  # vLLM's KV cache usage, 0–1
    gpu_power_w: float | None = None  # the launch's GPUs together
    gpu_util: float | None = None  # percent, their mean
    pid: int | None = None  # vLLM's main PID
    restarts: int = 0
    floors: Floors | None = None
    clean_exit: bool = False  # the daemon's last record before a clean exit
    peers: tuple[PeerMark, ...] = ()
    kernel: tuple[str, ...] = ()  # kernel log lines the guard kept since the last record
    events: tuple[str, ...] = field(default=())  # what sparkd did or saw since the last record
    gpus: tuple[GpuMark, ...] = ()  # each GPU of the launch


def _code(table: tuple[str, ...], name: str | None) -> int:
    if name is None:
        return _U8
    try:
        return table.index(name)
    except ValueError:
        return _U8 - 1


def _name(table: tuple[str, ...], code: int) -> str | None:
    if code == _U8:
        return None
    return table[code] if code < len(table) else "unknown"


def _kib(n: int | None) -> int:
    return _U32 if n is None else min(max(n, 0) // KIB, _U32 - 1)


def _bytes(n: int) -> int | None:
    return None if n == _U32 else n * KIB


def _f(x: float | None) -> float:
    return _NAN if x is None else x


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


def _small(n: int | None, top: int) -> int:
    return top if n is None else min(max(n, 0), top - 1)


def _boot_bytes(boot: str) -> bytes:
    try:
        return uuid.UUID(boot).bytes
    except ValueError:
        return boot.encode("utf-8", "replace")[:16].ljust(16, b"\0")


def _boot_text(raw: bytes) -> str:
    return str(uuid.UUID(bytes=raw))


def _text(line: str) -> bytes:
    data = line.encode("utf-8", "replace")
    return data if len(data) <= MAX_LINE_BYTES else data[:MAX_LINE_BYTES]


def encode(r: Record) -> bytes:
    """The record's bytes (without its frame)."""
    floors = r.floors or Floors(-1, -1, -1)
    flags = _CLEAN if r.clean_exit else 0
    parts = [_FIXED.pack(
        FORMAT_VERSION, r.wall, r.mono, _boot_bytes(r.boot), r.run & _U32,
        _kib(r.available), _kib(r.free), _kib(r.swap_used), _f(r.psi_some), _f(r.psi_full),
        _code(LEVELS, r.guard_level), _code(ACTIONS, r.guard_action),
        _f(r.trend_slope), _f(r.trend_floor_s), _code(STATES, r.state), _code(PHASES, r.phase),
        _small(r.running, _U16), _small(r.waiting, _U16), _f(r.prompt_tps), _f(r.kv_usage), _f(r.gpu_power_w),
        _f(r.gpu_util), _small(r.pid, _U32), _small(r.restarts, _U16),
        _kib(floors.warn if r.floors else None), _kib(floors.stop if r.floors else None),
        _kib(floors.kill if r.floors else None), flags)]
    peers = r.peers[:MAX_PEERS]
    parts.append(bytes([len(peers)]))
    for peer in peers:
        name = peer.node.encode("utf-8", "replace")[:64]
        parts += [bytes([len(name)]), name, _PEER.pack(_f(peer.age_s), _f(peer.offset_s), 1 if peer.up else 0)]
    lines = [(_KERNEL, line) for line in r.kernel[:MAX_LINES]] + [(_EVENT, line) for line in r.events[:MAX_LINES]]
    parts.append(bytes([len(lines)]))
    for tag, line in lines:
        data = _text(line)
        parts += [_LINE.pack(tag, len(data)), data]
    if r.gpus:  # appended last: a reader without this section stops before it
        gpus = r.gpus[:MAX_GPUS]
        parts.append(bytes([len(gpus)]))
        parts += [_GPU.pack(_small(g.index, _U8), _f(g.power_w), _f(g.util_pct), _kib(g.used_bytes),
                            _kib(g.total_bytes)) for g in gpus]
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("the record ends early")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk


def decode(data: bytes, seq: int = 0) -> Record:
    """A record from its bytes; ValueError when they are not one."""
    if len(data) < _FIXED.size or data[0] != FORMAT_VERSION:
        raise ValueError("not a version-1 record")
    (_, wall, mono, boot, run, avail, free, swap, psi_some, psi_full, level, action, slope, floor_s, state, phase,
     running, waiting, prompt_tps, kv, gpu_w, gpu_util, pid, restarts, warn, stop, kill,
     flags) = _FIXED.unpack_from(data)
    reader = _Reader(data, _FIXED.size)
    peers = []
    for _ in range(reader.take(1)[0]):
        name = reader.take(reader.take(1)[0]).decode("utf-8", "replace")
        age, offset, up = _PEER.unpack(reader.take(_PEER.size))
        peers.append(PeerMark(name, _opt(age), _opt(offset), bool(up)))
    kernel: list[str] = []
    events: list[str] = []
    for _ in range(reader.take(1)[0]):
        tag, size = _LINE.unpack(reader.take(_LINE.size))
        text = reader.take(size).decode("utf-8", "replace")
        (kernel if tag == _KERNEL else events).append(text)
    gpus = []
    if reader.pos < len(data):
        for _ in range(reader.take(1)[0]):
            index, power, util, used, total = _GPU.unpack(reader.take(_GPU.size))
            gpus.append(GpuMark(index, _opt(power), _opt(util), _bytes(used), _bytes(total)))
    floors = None if warn == _U32 else Floors(warn * KIB, stop * KIB, kill * KIB)
    return Record(
        wall=wall, mono=mono, boot=_boot_text(boot), run=run, seq=seq, available=_bytes(avail), free=_bytes(free),
        swap_used=_bytes(swap), psi_some=_opt(psi_some), psi_full=_opt(psi_full),
        guard_level=_name(LEVELS, level), guard_action=_name(ACTIONS, action),
        trend_slope=_opt(slope), trend_floor_s=_opt(floor_s), state=_name(STATES, state), phase=_name(PHASES, phase),
        running=None if running == _U16 else running, waiting=None if waiting == _U16 else waiting,
        prompt_tps=_opt(prompt_tps), kv_usage=_opt(kv), gpu_power_w=_opt(gpu_w), gpu_util=_opt(gpu_util),
        pid=None if pid == _U32 else pid, restarts=restarts, floors=floors, clean_exit=bool(flags & _CLEAN),
        peers=tuple(peers), kernel=tuple(kernel), events=tuple(events), gpus=tuple(gpus))


_PEEK = struct.Struct("<Bdd16sI")


def peek(data: bytes) -> tuple[float, str, int, bool]:
    """(wall, boot, run, clean exit) without decoding the rest: for listing a whole ring cheaply."""
    if len(data) < _FIXED.size or data[0] != FORMAT_VERSION:
        raise ValueError("not a version-1 record")
    _, wall, _, boot, run = _PEEK.unpack_from(data)
    return wall, _boot_text(boot), run, bool(data[_FIXED.size - 1] & _CLEAN)


# ---- JSON, for the control API and `sparkctl postmortem --json`

def to_json(r: Record) -> dict[str, Any]:
    data = asdict(r)
    return {k: v for k, v in data.items() if v not in (None, (), [])}


_FLOATS = ("wall", "mono")
_OPTIONAL_NUMBERS = ("available", "free", "swap_used", "psi_some", "psi_full", "trend_slope", "trend_floor_s",
                     "running", "waiting", "prompt_tps", "kv_usage", "gpu_power_w", "gpu_util", "pid")
_OPTIONAL_TEXT = ("guard_level", "guard_action", "state", "phase")


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: not a number")
    return value


def from_json(data: Mapping[str, Any]) -> Record:
    """A record from :func:`to_json`'s form (as a peer sent it); ValueError naming the first bad field."""
    if not isinstance(data, Mapping):
        raise ValueError("a record is an object")
    values: dict[str, Any] = {name: _number(data.get(name), name) for name in _FLOATS}
    for name in ("boot",):
        if not isinstance(data.get(name), str):
            raise ValueError(f"{name}: not text")
        values[name] = data[name]
    values["run"] = int(_number(data.get("run", 0), "run"))
    values["seq"] = int(_number(data.get("seq", 0), "seq"))
    values["restarts"] = int(_number(data.get("restarts", 0), "restarts"))
    for name in _OPTIONAL_NUMBERS:
        if data.get(name) is not None:
            number = _number(data[name], name)
            values[name] = int(number) if name in ("available", "free", "swap_used", "running", "waiting",
                                                   "pid") else float(number)
    for name in _OPTIONAL_TEXT:
        if data.get(name) is not None:
            values[name] = str(data[name])
    floors = data.get("floors")
    if isinstance(floors, Mapping):
        values["floors"] = Floors(*(int(_number(floors.get(k), k)) for k in ("warn", "stop", "kill")))
    values["clean_exit"] = bool(data.get("clean_exit", False))
    values["peers"] = tuple(
        PeerMark(str(p.get("node", "?")), _maybe(p.get("age_s")), _maybe(p.get("offset_s")), bool(p.get("up")))
        for p in data.get("peers", []) if isinstance(p, Mapping))
    values["kernel"] = tuple(str(line) for line in data.get("kernel", []))
    values["events"] = tuple(str(line) for line in data.get("events", []))
    values["gpus"] = tuple(_gpu_mark(g) for g in data.get("gpus", []) if isinstance(g, Mapping))
    return Record(**values)


def _gpu_mark(data: Mapping[str, Any]) -> GpuMark:
    def whole(name: str) -> int | None:
        return None if data.get(name) is None else int(_number(data[name], name))

    return GpuMark(int(_number(data.get("index", 0), "index")), _maybe(data.get("power_w")),
                   _maybe(data.get("util_pct")), whole("used_bytes"), whole("total_bytes"))


def _maybe(value: Any) -> float | None:
    return None if value is None else float(_number(value, "a peer's or a GPU's figure"))
