"""A log tail read as events: each line with the process that wrote it, its level and time, what kind of line it is,
and the Python exception it ends, if any. Pure.

The classifier decides from events, not raw lines. Kinds, by who wrote the line:

- ``vllm``: vLLM's own logger (``ERROR 11-26 01:23:45 [core.py:866] ...``);
- ``python``: the line that ends a Python traceback, or an exception line quoted alone (:mod:`tracebacks`);
- ``nccl``: NCCL's (or RCCL's) debug lines, ``host:pid:tid [dev] NCCL WARN ...`` / ``NCCL INFO ...``;
- ``torch``: torch's C++ logging, c10d and ProcessGroupNCCL (``[rank0]:[E1126 01:23:45.1 ProcessGroupNCCL.cpp:632]``);
- ``cuda``: a CUDA, HIP or driver error printed outside a Python exception (``Failed: Cuda error ...``);
- ``ray``: Ray's own lines (``(raylet)``, ``ray.exceptions...``);
- ``kernel``: the kernel's (dmesg, ``journalctl -k``): NVRM and Xid, PCIe AER, OOM kills — the daemon passes these in
  from the kernel log (`ClassifyContext.kernel_lines`), and they count as logged before the tail;
- ``code``: a line of source under a traceback's frame (``raise RuntimeError("Failed to infer device type")``): it
  quotes what runs, never what failed;
- ``frame``: the structure of a traceback (``Traceback (most recent call last):``, ``File "...", line N, in f``, the
  chain's markers): where, not what;
- ``other``: the rest.

The decoration in front of a line is removed first: ANSI colours (real, or pasted as text: ``^[[36m``, ``\\033[0m``,
``[36m`` whose escape a copy lost), vLLM's ``(EngineCore_DP0 pid=N)`` and the prefixes launchers put before it (Ray's
``(MapWorker(...) pid=N, ip=...)``, a CI runner's or the journal's timestamp, kubectl's pod and container), and
tqdm's ``\\r`` frames are split. A line a terminal wrapped is read with its continuation (`Event.more`). An event's
`subject` is what the families read (the exception with its message's continuation, or the line without vLLM's
header), and its `terms` the vocabulary it holds (`lexicon.py`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from sparkd.supervisor.hardwrap import unwrapped
from sparkd.supervisor.lexicon import terms
from sparkd.supervisor.logline import VLLM_HEADER, header_level, segments_of_process
from sparkd.supervisor.tracebacks import PyException, TracebackParser, exception_line

__all__ = ["MAX_EVENTS", "Event", "Kind", "read_events"]

OOM_KILLED = "docker inspect: State.OOMKilled=true"


class Kind(StrEnum):
    vllm = "vllm"
    python = "python"
    nccl = "nccl"
    torch = "torch"
    cuda = "cuda"
    ray = "ray"
    kernel = "kernel"
    code = "code"  # a line of source Python printed under a traceback's frame: it says what runs, not what failed
    frame = "frame"  # a traceback's structure: its first line, a frame's `File "...", line N, in f`, a chain marker
    other = "other"


# A process prefix anywhere in a line's lead (after a launcher's own prefix): `(Worker_TP0 pid=5) `, 0.9's
# `(VllmWorker rank=0 pid=114020) `, Ray's `(MapWorker(MapBatches(vLLMEngineActor)) pid=1202, ip=10.0.0.1) `; names
# may nest one level of parentheses twice.
_PROCESS = re.compile(r"\((?P<process>[A-Za-z_][\w.\-]*(?:\((?:[^()]|\([^()]*\))*\))?)(?: \w+=[\w.\-]+)* "
                      r"pid=(?P<pid>\d{1,18})"
                      r"(?:, ip=[^)]*)?\)[ \t]?")
# colour codes pasted as text, the way a terminal or a pager shows them (`^[[36m`, `\033[0m`, `␛[1m`), or whose escape
# a copy dropped (`[36m(RayWorkerWrapper pid=9)[0m`: only SGR's `m`, never before `]`, so `[5m]` stays), and a
# carriage return pasted as `^M`
_TEXT_ANSI = re.compile(r"(?:\^\[|\\0?33|\\x1[bB]|\\e|\\u001[bB]|␛|<ESC>|ESC)\[[0-9;]*[A-Za-z]|"
                        r"(?<![\[\x1b])\[\d{1,3}(?:;\d{1,3})*m(?![\]\w.])|\^M$")
_V0_WORKER = re.compile(r"^Exception in worker \S+ while processing method \w+: ")
_LEAD_LIMIT = 160  # a prefix further into the line is text, not decoration
# A line (a tqdm frame) is read up to here: an error states itself early, and the patterns stay cheap on a dump of
# megabytes (300 lines of 4000 characters took the classifier before issue 39 over 40 s, 2-4 s now)
_MAX_LINE = 2048
# a record that starts inside a line: where a paste lost its line breaks
_GLUED = re.compile(r" (?=(?:\([A-Za-z_][\w.\-]*(?: \w+=[\w.\-]+)* pid=\d{1,18}(?:, ip=[^)]*)?\) )?"
                    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d|"
                    r"\S+:\d+:\d+ \[\d+\] [NR]CCL (?:INFO|WARN) )")
_GLUE_WORDS = (" DEBUG ", " INFO ", " WARNING ", " ERROR ", " CRITICAL ", "CCL INFO", "CCL WARN")
_GLUE_MIN, _GLUE_READ = 20, 4 * _MAX_LINE  # a line shorter than this holds no record inside; a glued one is read so far
# The frames of the tail read, from its end: tqdm's bars and glued pastes multiply a tail's lines into frames, and the
# failure is at the end (each line is read to its first _MAX_LINE characters, a glued one to its first _GLUE_READ)
MAX_EVENTS = 4000
_VLLM_ANYWHERE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:")
_GLOG = re.compile(r"^(?:\[rank\d+\]:)?\[(?P<level>[EWIF])(?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d)[.\d]* [^\]]*\]")
_GLOG_LEVEL = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "CRITICAL"}
_NCCL = re.compile(r"\b[NR]CCL (?P<level>WARN|INFO|ERROR|ABORT|TRACE)\b")
# The levels other writers print: uvicorn's `INFO:     127.0.0.1 ...`, Python's logging (`WARNING:root:...`,
# `- name - INFO - ...`), a bracketed level
_OTHER_LEVEL = re.compile(r"^(?:- +)?(?:[\w.]+ +- +)?\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?"
                          r"(?::|\s+-\s|\s)")
# A level after a timestamp and up to three columns (Python logging's `%(asctime)s %(name)s %(process)d %(levelname)s`:
# `2024-11-08 09:37:40,925 vllm.worker.model_runner 849 INFO     CUDA graphs can take ...`): an INFO line of advice
# there is no error line
_STAMPED_LEVEL = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?(?:Z|[+-]\d\d:?\d\d)? +"
                            r"(?:[\w.:\[\]-]+ +){0,3}?|[A-Za-z_]\w*(?:\.\w+)+ +\d+ +)"  # the stamp may be taken off
                            r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
# A level in a column of bracketed ones, in any case (Habana Synapse's `[10:00:00.000001][GC  ][error][tid:1A2B] ...`,
# spdlog's `[2024-01-01 10:00:00.123] [error] ...`): the writer's own word for how bad the line is
_BRACKET_LEVEL = re.compile(r"^(?:\[[^\]\n]{1,40}\] ?){0,4}\[\s*(?P<level>error|err|critical|fatal|warning|warn|info|"
                            r"debug|trace)\s*\]", re.IGNORECASE)
# A level in a column between bars, in any case (loguru's and tt-metal's `2026-06-30 20:54:48.928 | error    |
# Metal | Timeout detected`, the stamp taken off as a launcher's time or kept)
_BAR_LEVEL = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T][\d:.,]+ *)?\| *(?P<level>critical|error|warning|info|debug|trace|"
                        r"success) *\|", re.IGNORECASE)
_BELOW_ERROR = frozenset({"DEBUG", "INFO", "WARNING", "WARN", "TRACE"})
_KERNEL = re.compile(r"^\s*(?:\[\s*\d+\.\d+\]\s*)?(?:\S+ kernel: )?(?:NVRM: |pcieport |nvidia |amdgpu |.*\bAER: |"
                     r"Out of memory: Killed process|.*\boom-kill|.*\bearlyoom\b|OOMKilled)", re.IGNORECASE)
_CUDA = re.compile(r"\b(?:CUDA|Cuda|HIP|hip) (?:driver )?(?:error|failure)\b|\b(?:cuda|hip)Error\w+|"
                   r"\bCUBLAS_STATUS_\w+|\bCUDNN_STATUS_\w+|Memory access fault by GPU")
# Ray's C++ log line (a raylet's, the GCS's, a core worker's in vLLM's engine): `[2025-11-24 16:14:48,882 C 37444 37444]
# file.cc:N: ...` — its level (I, W, E, F; C for a failed check, which aborts) after the stamp, the pid and tid; a line
# of another node's raylet comes with Ray's `(raylet, ip=10.0.0.2) ` in front, kept: it says which node spoke
_RAY_CPP = re.compile(r"^(?:\((?:raylet|gcs_server)(?:, ip=[\w.:-]+)?\) )?"
                      r"(?P<stamp>\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (?P<level>[DIWEFC]) \d+ \d+\] "
                      r"(?:\((?:raylet|gcs_server)\) )?)")
_RAY_LEVEL = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL", "C": "CRITICAL"}
_RAY = re.compile(r"^\(raylet\)|\bray\.exceptions\.|\bRay(?:Actor|Task|Worker)?Error\b|\bActorDiedError\b|"
                  r"\(gcs_server\)|\braylet\b")
# What launchers put in front of a line, at its start: torchrun's `[rank0]:` (not torch's own `[rank0]:[W...]`), docker
# compose's `service  | `, the journal's `Feb 21 21:17:57 host unit[pid]: ` (a kernel line's with the host left out,
# as a paste may: `Mar 27 17:40:36 kernel: NVRM: …`, the kernel's text after it), a CI runner's or Docker's timestamp,
# kubectl's `--prefix` (`[pod/vllm-0/vllm] `), the frame of a boxed paste (`│ `), a markdown quote or bold (`> `,
# `**`: an issue thread's paste), pytest's column of a failed test's error lines (`E       ValueError: …`: a CI job's).
_LEAD = re.compile(r"^(?:\[rank\d+\]: ?(?!\[[EWIF]\d{3,4} )|[\w.-]+ +\| ?|> |\*\*(?=\S)|E {3,}(?=\S)|"
                   r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:kernel|\S+ [\w@.\-]+(?:\[\d+\])?): |"
                   r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[^\s\]]*\]? (?![DIWEFC] \d+ \d+\] )|[│┃║] ?|"
                   r"\[pod/[^\]\s]+\] )")
# A writer's advice, not a report of what happened: torch's hints after a device error (`Compile with
# `TORCH_USE_CUDA_DSA` to enable device-side assertions.`, `For debugging consider passing CUDA_LAUNCH_BLOCKING=1`,
# `CUDA kernel errors might be asynchronously reported ...`), a `Consider ...`, `Please try ...`, `You may ...` line:
# the error words in it name what to look for or enable, never a failure
_ADVICE = re.compile(r"^(?:Compile with\b|For debugging\b|Consider\b|(?:Please |You (?:can|may|might|could|should) )"
                     r"(?:try|consider|set|increase|decrease|reduce|lower|raise|use|pass|refer|see|check|report|make "
                     r"sure|enable|disable)\b|Try (?:setting|passing|using|increasing|decreasing|reducing|lowering|"
                     r"raising|to)\b|\w+ (?:kernel )?errors might be asynchronously reported\b|(?:Hint|Tip|HINT):)")
_TIME_LEAD = re.compile(r"^(?P<time>\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[^\s\]]*\]?|"
                        r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class Event:
    index: int  # position in the scan: the kernel's lines first, then the tail's in order
    text: str  # the line undecorated (vLLM's header kept): what rules match and what evidence quotes
    kind: Kind
    process: str | None = None
    level: str | None = None  # ERROR, WARNING, INFO ... as the writer put it (NCCL's WARN is WARNING, and its error)
    time: str | None = None  # as the writer printed it
    from_log: bool = True  # False: the kernel's lines and Docker's word, passed in beside the tail
    exception: PyException | None = None  # the exception this line ends
    more: tuple[str, ...] = field(default=(), compare=False)  # the lines a terminal wrapped it onto

    @property
    def below_error(self) -> bool:
        """A line logged below ERROR — by vLLM, NCCL (its INFO; its WARN is its error line), uvicorn or Python's
        logging: a warning explains no death. torch's C++ warnings are not: its store reports a lost peer at W."""
        if not self.from_log or self.kind in (Kind.kernel, Kind.torch):
            return False
        return self.level in _BELOW_ERROR and not (self.kind is Kind.nccl and self.level == "WARNING")

    @property
    def said(self) -> str:
        """What the line says, as its writer put it: the exception line as Python printed it, else the text without
        vLLM's header or torch's (and without V0's `Exception in worker X while processing method Y: ` in front of
        the error)."""
        if self.exception is not None:
            return self.exception.told
        if self.kind is Kind.torch:
            return _GLOG.sub("", self.text, count=1).lstrip()
        if self.kind is Kind.ray:
            r = _RAY_CPP.match(self.text)
            if r is not None:  # the stamp, the level, the pid and tid off; another node's `(raylet, ip=…)` kept
                return self.text[:r.start("stamp")] + self.text[r.end("stamp"):].lstrip()
        return _V0_WORKER.sub("", VLLM_HEADER.sub("", self.text, count=1), count=1)

    @property
    def advice(self) -> bool:
        """A line of advice (how to debug, what to compile with or try): it states no failure (`_ADVICE`)."""
        return self.exception is None and _ADVICE.match(self.said.lstrip()) is not None

    @cached_property
    def subject(self) -> str:
        """What the families read: `said`, with what a terminal wrapped onto the next lines joined on — both ways,
        as one word (`KV cach` + `e is needed`) and as two (`than the` + `available`), one per line of the text."""
        exc = self.exception
        said = self.text if self.kind is Kind.torch else self.said  # torch's header names its writer: kept
        pieces = [said, *self.more] if exc is None else [exc.stated, *exc.message.split("\n")[1:]]
        if len(pieces) == 1:
            return pieces[0]
        return f"{' '.join(pieces)}\n{''.join(pieces)}"

    @cached_property
    def terms(self) -> frozenset[str]:
        """The vocabulary of the failure it states (`lexicon.py`)."""
        return terms(self.subject)

    @property
    def vllm_level(self) -> str | None:
        m = VLLM_HEADER.match(self.text)
        return header_level(m) if m else None


@dataclass(frozen=True)
class _Line:
    frames: tuple[str, ...]
    process: str | None
    pid: int | None
    lead_time: str | None  # the launcher's time in front


def _unglued(text: str) -> list[str]:
    """A paste that lost its line breaks holds many log lines on one (its launchers' prefixes already taken off the
    front): split at each record that starts inside it (a process prefix or vLLM's header, an NCCL line's
    `host:pid:tid [dev] NCCL`)."""
    if len(text) > _GLUE_MIN and any(word in text for word in _GLUE_WORDS):
        return [piece for piece in _GLUED.split(text[:_GLUE_READ]) if piece.strip()]
    return [text]


def _undecorate(raw: str) -> _Line:
    frames, process, pid = segments_of_process(_TEXT_ANSI.sub("", raw) if "[" in raw or "^M" in raw else raw)
    out: list[str] = []
    lead = _Lead(process, pid, None)
    for frame in frames:
        lead = _without_leads(frame, lead)
        first, *glued = _unglued(lead.text)
        out.append(first[:_MAX_LINE])
        out += [_without_leads(piece, _Lead(None, None, None)).text[:_MAX_LINE] for piece in glued]
    return _Line(tuple(out), lead.process, lead.pid, lead.time)


@dataclass(frozen=True)
class _Lead:
    process: str | None  # the last process a prefix named
    pid: int | None
    time: str | None  # the first launcher's time
    text: str = ""  # what is left of the line


def _without_leads(frame: str, lead: _Lead) -> _Lead:
    """The frame without the prefixes launchers put in front of it, then vLLM's `(Name pid=N)`."""
    text = frame[:_GLUE_READ]
    process, pid, time = lead.process, lead.pid, lead.time
    while True:
        m = _LEAD.match(text)
        if m is not None:
            t = _TIME_LEAD.match(m.group(0))
            time = time or (t.group("time").strip("[]") if t else None)
            text = text[m.end():]
            continue
        m = _PROCESS.search(text, 0, _LEAD_LIMIT)
        if m is None or not _plausible_lead(text[:m.start()]):
            break
        t = _TIME_LEAD.match(text[:m.start()].strip())
        time = time or (t.group("time").strip("[]") if t else None)
        process, pid, text = _innermost(m.group("process")), int(m.group("pid")), text[m.end():]
    return _Lead(process, pid, time, text)


def _plausible_lead(lead: str) -> bool:
    """Text before a process prefix that a launcher writes (a timestamp, kubectl's pod and container, the journal's
    host and unit), not a message that happens to quote a prefix."""
    return _VLLM_ANYWHERE.search(lead) is None and not any(
        word in lead for word in ("Error", "error", "Exception", "Traceback", "File \""))


def _innermost(name: str) -> str:
    """Ray's ``MapWorker(MapBatches(vLLMEngineActor))`` → ``vLLMEngineActor``; vLLM's names stay."""
    while "(" in name and name.endswith(")"):
        name = name[name.index("(") + 1:-1]
    return name


def _kind_level_time(text: str, from_log: bool) -> tuple[Kind, str | None, str | None]:
    m = VLLM_HEADER.match(text) if from_log else None
    if m is not None:  # most lines of a tail: tested first
        return Kind.vllm, header_level(m), m.group("time")
    low = text.lower()
    if not from_log or (any(k in low for k in _KERNEL_WORDS) and _KERNEL.match(text)):
        return Kind.kernel, "ERROR", None
    g = _GLOG.match(text) if text[:1] == "[" else None
    if g is not None:
        md = g.group("md").zfill(4)  # torch writes January's `W112` as well as `W0112`
        return Kind.torch, _GLOG_LEVEL[g.group("level")], f"{md[:2]}-{md[2:]} {g.group('hms')}"
    n = _NCCL.search(text) if "CCL " in text else None
    if n is not None:
        return Kind.nccl, "WARNING" if n.group("level") == "WARN" else n.group("level"), None
    r = _RAY_CPP.match(text) if "] " in text[:96] else None
    if r is not None:
        return Kind.ray, _RAY_LEVEL[r.group("level")], None
    if ("ray" in low or "ActorDied" in text) and _RAY.search(text):
        return Kind.ray, None, None
    if any(c in low for c in _CUDA_WORDS) and _CUDA.search(text):
        return Kind.cuda, "ERROR", None
    if _BARE_INFO.match(text):
        return Kind.vllm, "INFO", None
    o = _OTHER_LEVEL.match(text) or _STAMPED_LEVEL.match(text)
    if o is not None:
        return Kind.other, o.group("level"), None
    column = _BRACKET_LEVEL.match(text) if text[:1] == "[" else _BAR_LEVEL.match(text) if "|" in text[:32] else None
    if column is None:
        return Kind.other, None, None
    level = column.group("level").upper()
    return Kind.other, _COLUMN_WORDS.get(level, level), None


# a column's level words that are not the levels' own names
_COLUMN_WORDS = {"ERR": "ERROR", "SUCCESS": "INFO"}


# vLLM's INFO lines that name every setting it runs with (its engine's config, the arguments not at their defaults),
# pasted without the header that says INFO: the setting names in them (`trust_remote_code=True`) state no failure
_BARE_INFO = re.compile(r"(?:Initializing an? (?:V\d )?LLM engine \(v[^)\s]*\) with config: |non-default args: \{)")
# words one of which a line of each kind holds: a substring test before the pattern's search
_KERNEL_WORDS = ("nvrm", "pcieport", "nvidia", "amdgpu", "aer:", "out of memory", "oom-kill", "earlyoom", "oomkilled")
_CUDA_WORDS = ("cuda", "hip", "cublas", "cudnn", "memory access fault")


def read_events(log_tail: Sequence[str], kernel_lines: Sequence[str] = (), oom_killed: bool | None = None
                ) -> list[Event]:
    """The events of a tail, in scan order: Docker's OOMKilled and the kernel's lines first (the root of what vLLM
    logs after them), then every frame of every line of the tail, each line's Python exception attached."""
    raw_events: list[tuple[str, bool, _Line | None]] = []
    if oom_killed:
        raw_events.append((OOM_KILLED, False, None))
    raw_events += [(kernel, False, None) for kernel in kernel_lines]
    frames: list[tuple[str, bool, _Line | None]] = []
    for raw in unwrapped(log_tail):
        read = _undecorate(raw)
        frames += [(text, True, read) for text in read.frames]
    raw_events += frames[-MAX_EVENTS:]
    parser = TracebackParser()
    for index, (text, _, of) in enumerate(raw_events):
        if of is not None:  # a process's tracebacks are its own: by name and pid (`(Worker pid=32)`, `pid=33`)
            parser.feed(index, text, of.process, of.pid)
    parser.finish()
    events: list[Event] = []
    for index, (text, from_log, of) in enumerate(raw_events):
        process, lead_time = (of.process, of.lead_time) if of is not None else (None, None)
        kind, level, time = _kind_level_time(text, from_log)
        exception = parser.found.get(index)
        if exception is not None and exception.quoted and kind not in (Kind.other, Kind.vllm):
            exception = None  # Ray's, NCCL's or torch's C++ words quoting a status name: theirs, not Python's
        if exception is not None and kind in (Kind.other, Kind.vllm, Kind.cuda, Kind.ray):
            kind = Kind.python
        elif index in parser.code:
            kind = Kind.code
        elif index in parser.structure:
            kind = Kind.frame
        events.append(Event(index, text, kind, process, level, time or lead_time, from_log, exception))
    return _with_wraps(events, raw_events)


# a line this long (as printed, prefixes and all) may have been wrapped by a terminal; one longer than any terminal is
# no wrap (and joining such lines would make every search of a dense paste quadratic)
_WRAP_WIDTH, _WRAP_MAX = 70, 400
_ENDS_SENTENCE = (".", "!", "?", ":")
_CLOSES = tuple(")]}.,;:'\"")
# what starts a record of its own, not the rest of the line above: a writer's `name: `, a bracket, a time or address
_RECORD_START = re.compile(r"^(?:\S+: |\[|\(|\d{1,4}[-/.:]\d|[A-Z][a-z]{2} [ \d]\d )")


def _with_wraps(events: list[Event], raw: list[tuple[str, bool, _Line | None]]) -> list[Event]:
    """Each event with the lines a terminal wrapped it onto: a bare line (no header, level, prefix or traceback part,
    no start of a record of its own, no longer than the line above) right after a long one that goes on into it."""
    for i, event in enumerate(events):
        if event.kind in (Kind.code, Kind.frame) or not event.from_log or event.exception is not None:
            continue
        more: list[str] = []
        last = event.text
        for nxt, (_, _, of) in zip(events[i + 1:i + 3], raw[i + 1:i + 3], strict=False):
            if not _WRAP_WIDTH <= len(last) <= _WRAP_MAX or not _bare(nxt, of) or not _goes_on(last, nxt.text):
                break
            more.append(nxt.text)
            last = nxt.text
        if more:
            events[i] = Event(event.index, event.text, event.kind, event.process, event.level, event.time,
                              event.from_log, event.exception, tuple(more))
    return events


def _bare(event: Event, of: _Line | None) -> bool:
    return (event.kind is Kind.other and event.level is None and event.exception is None and of is not None
            and of.process is None and of.lead_time is None and not event.text[:1].isspace()
            and _RECORD_START.match(event.text) is None and exception_line(event.text, in_traceback=False) is None)


def _goes_on(last: str, text: str) -> bool:
    """The line above stops mid-sentence (mid-word, after a comma or an open bracket) or this one starts as the rest of
    one (a small letter, a closing bracket or stop); and it is no longer than the line above."""
    if len(text) > len(last) + 8:
        return False
    first, end = text[:1], last.rstrip()[-1:]
    return first.islower() or text.startswith(_CLOSES) or end in ",(-/" or (end.isalnum() and first.isalnum())
