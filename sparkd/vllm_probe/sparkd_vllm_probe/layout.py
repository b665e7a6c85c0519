"""The step file: one per vLLM process that steps (the EngineCore, each worker rank), 512 bytes, little-endian.

One definition for both sides: the writer in vLLM (:mod:`.writer`) packs it, sparkd's reader
(``sparkd.host.stepfiles``) decodes it with :func:`decode`. Stdlib only: it runs inside vLLM's interpreter.

- bytes 0-15: the magic and the format version.
- bytes 16-111, written once when the file is made: the role (engine or worker), the rank (a worker's global rank,
  an engine's index), its local rank, the world size (tensor x pipeline parallel), the PID in its own namespace,
  that PID namespace's inode, the process's start time (clock ticks after boot, as ``/proc/<pid>/stat`` shows it
  in every namespace), and an anchor: one monotonic and one wall-clock reading taken together. A wall time is the
  anchor's wall time plus the monotonic time since the anchor (the writer reads only the monotonic clock per step).
- bytes 128-255, three blocks, each rewritten whole by one ``pack_into`` with a sequence number at its head and
  again at its tail (the writer writes a block front to back; the reader reads the tail, then the block, then the
  head, and keeps it only when both copies agree, else reads again). The begin block, at each step's beginning:
  the steps begun (its own sequence number), when the step began, its scheduled tokens. The end block, at each
  step's end: the step it ended (its sequence number), when, the requests an engine still held after it, the
  longest step of this process and its tokens (the last step's duration and tokens are the two blocks' when they
  name the same step). The mark block, rarely: the writer waits in a collective of the current step, or it turned
  itself off. The process is inside a step while the begin block's step is past the end block's; a collective mark
  counts for its step only. Times are the writer's monotonic clock in nanoseconds: compare them only with readings
  of the same node.
- bytes 256-511, text written once (UTF-8, NUL-padded): the host name, the boot id, the process's title, vLLM's
  version; and a note the writer rewrites when it turns itself off (why).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

SIZE = 512
MAGIC = 0x31424F5250444B53  # b"SKDPROB1", little-endian
VERSION = 1
SUFFIX = ".step"
DIR_ENV = "SPARKD_PROBE_DIR"  # where the files go: set by sparkd's launch
ENTRY_POINT = "sparkd_probe"  # the plugin's name in vLLM's ``vllm.general_plugins`` group (VLLM_PLUGINS)

ENGINE, WORKER = 0, 1
ROLES = {ENGINE: "engine", WORKER: "worker"}
IDLE, STEP, COLLECTIVE, OFF = 0, 1, 2, 3
PHASES = {IDLE: "idle", STEP: "step", COLLECTIVE: "collective", OFF: "off"}
UNKNOWN = -1  # a count the writer cannot see (an engine's tokens, a worker's held requests)

HEADER = struct.Struct("<QQ")
IDENTITY = struct.Struct("<12q")
IDENTITY_AT = 16
BEGIN = struct.Struct("<4q")  # step, began_ns, tokens, step
BEGIN_AT = 128
END = struct.Struct("<6q")  # step, ended_ns, held, longest_ns, longest_tokens, step
END_AT = BEGIN_AT + BEGIN.size
MARK = struct.Struct("<4q")  # seq, kind (COLLECTIVE or OFF), the step it is about, seq
MARK_AT = END_AT + END.size
SEQ = struct.Struct("<q")  # a block's head and tail copies of its sequence number
TEXT_AT = 256
TEXTS = (("host", 64), ("boot_id", 40), ("title", 40), ("vllm", 24))
NOTE_AT = TEXT_AT + sum(size for _, size in TEXTS)
NOTE_SIZE = SIZE - NOTE_AT
BLOCKS = ((BEGIN_AT, BEGIN), (END_AT, END), (MARK_AT, MARK))  # what a reader reads, in this order


def file_name(role: int, rank: int) -> str:
    return f"{ROLES[role]}-{rank}{SUFFIX}"


def text(value: str, size: int) -> bytes:
    """``value`` as a NUL-padded field of ``size`` bytes, cut on a character boundary."""
    data = value.encode("utf-8", "replace")[:size]
    return data.decode("utf-8", "ignore").encode("utf-8").ljust(size, b"\0")


@dataclass(frozen=True)
class StepRecord:
    """One process's step file, decoded. Times are nanoseconds of the writer's monotonic clock."""

    role: str  # "engine" or "worker"
    rank: int  # a worker's global rank; an engine's index
    local_rank: int
    world_size: int
    pid: int  # in the writer's PID namespace
    pid_ns: int  # that namespace's inode (0: unknown)
    start_ticks: int  # the process's start time, clock ticks after boot (0: unknown)
    anchor_mono_ns: int
    anchor_wall_ns: int
    step: int  # steps begun
    phase: str  # idle, step, collective, off
    began_ns: int  # the current step's beginning (phase step or collective), else the last one's (0: none yet)
    ended_ns: int  # the last completed step's end (0: none yet)
    tokens: int  # the current (or last) step's scheduled tokens (-1: unknown)
    held: int  # requests an engine still held after its last step (-1: unknown)
    last_ns: int  # the last completed step's duration (0: not known while inside the next one)
    last_tokens: int
    longest_ns: int  # the longest step of this process
    longest_tokens: int
    host: str
    boot_id: str
    title: str
    vllm: str
    note: str  # why the writer turned itself off ("" while it records)

    @property
    def in_step(self) -> bool:
        """Inside a step that has not ended: working on it, or in a collective of it."""
        return self.phase in ("step", "collective")

    @property
    def done(self) -> int:
        """Steps completed."""
        return self.step - 1 if self.in_step else self.step

    def wall_ns(self, mono_ns: int) -> int:
        """The wall time of one of this record's monotonic stamps."""
        return self.anchor_wall_ns + (mono_ns - self.anchor_mono_ns)


class Torn(ValueError):
    """A block changed while it was read: read it again."""


def decode(header: bytes, identity: bytes, blocks: tuple[tuple[int, ...], ...], texts: bytes) -> StepRecord:
    """A record from the file's parts: the header, the identity, the three blocks (each unpacked from one read whose
    head and tail copies the caller compared, :func:`read_block`), the texts. Raises ValueError for a file that is
    not a step file, `Torn` when the blocks do not fit together (the end block ahead of the begin block)."""
    magic, version = HEADER.unpack(header)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a step file of format {VERSION} (magic {magic:#x}, version {version})")
    ident = IDENTITY.unpack(identity)
    if ident[0] not in ROLES:
        raise ValueError(f"unknown role {ident[0]}")
    begin, end, mark = blocks
    step, began, tokens = begin[0], begin[1], begin[2]
    ended_step = end[0]
    if ended_step > step:
        raise Torn("the end block is ahead of the begin block")
    if mark[1] == OFF:
        phase = "off"
    elif step > ended_step:
        phase = "collective" if mark[1] == COLLECTIVE and mark[2] == step else "step"
    else:
        phase = "idle"
    fields, at = [], 0
    for _, size in TEXTS:
        fields.append(_str(texts[at:at + size]))
        at += size
    return StepRecord(
        role=ROLES[ident[0]], rank=ident[1], local_rank=ident[2], world_size=ident[3], pid=ident[4], pid_ns=ident[5],
        start_ticks=ident[6], anchor_mono_ns=ident[7], anchor_wall_ns=ident[8], step=step, phase=phase,
        began_ns=began, ended_ns=end[1], tokens=tokens, held=end[2],
        last_ns=end[1] - began if ended_step == step else 0, last_tokens=tokens if ended_step == step else UNKNOWN,
        longest_ns=end[3], longest_tokens=end[4], host=fields[0], boot_id=fields[1], title=fields[2],
        vllm=fields[3], note=_str(texts[NOTE_AT - TEXT_AT:]),
    )


def read_block(read: Callable[[int, int], bytes], at: int, form: struct.Struct) -> tuple[int, ...]:
    """One block through ``read(offset, size)``: its tail copy first, then the block, then its head copy; `Torn`
    unless all agree."""
    (tail,) = SEQ.unpack(read(at + form.size - SEQ.size, SEQ.size))
    values = form.unpack(read(at, form.size))
    (head,) = SEQ.unpack(read(at, SEQ.size))
    if not (tail == head == values[0] == values[-1]):
        raise Torn("a block changed while it was read")
    return values



def _str(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "replace")
