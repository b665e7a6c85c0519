"""Python tracebacks read from a log: each exception with its type, message, frames and chain. Pure.

A log holds the tracebacks of several processes, interleaved line by line (vLLM puts ``(EngineCore_DP0 pid=N)`` in
front of each), often cut at the top (an issue's excerpt starts mid-traceback) and often with vLLM's header on every
line. :class:`TracebackParser` is fed one undecorated line at a time, with its process, and answers on the line that
ends a traceback (the exception line ``torch.OutOfMemoryError: CUDA out of memory ...``) with a :class:`PyException`:

- ``type`` as printed (``torch.OutOfMemoryError``; Ray's ``RayTaskError(ValueError)`` is read as the wrapped
  ``ValueError``), ``message`` with the indented lines that continue it (pydantic's ``Value error, ...``);
- ``frames``, outermost first, each with its file, function and source line, and the subsystem it lies in;
- ``cause``: the exception this one was raised from (``The above exception was the direct cause of the following
  exception:``) or while handling (``During handling of the above exception, another exception occurred:``).
  Python prints the earlier exception first, so a chain's root is the first one logged.

An exception line with no traceback above it (``ValueError: ...`` quoted alone, or logged by vLLM as a message) is an
exception with no frames.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from sparkd.supervisor.logline import VLLM_HEADER, header_level
from sparkd.supervisor.subsystems import Subsystem, module_of, subsystem_of

__all__ = ["Frame", "PyException", "TracebackParser", "exception_line"]

_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_START = re.compile(r"Traceback \(most recent call last\):\s*$")
# Python's frame line, and IPython's (`File /opt/x/worker.py:2549, in get(object_refs, timeout)`)
_FRAME = re.compile(r'^\s*File (?:["“](?P<path>[^"”]+)["”], line \d{1,9}, in (?P<func>\S+)|'
                    r'(?P<ipath>/\S+\.py):\d{1,9}, in (?P<ifunc>\w+)\(.*\))\s*$')
# faulthandler's report of a native crash: `Fatal Python error: Aborted`, then the Python stack, most recent call first,
# its frames without the comma (`File "/x/pynccl_wrapper.py", line 277 in ncclCommInitRank`)
_FATAL = re.compile(r"^\s*Fatal Python error: (?P<what>\S.*?)\s*$")
_DUMP_HEAD = re.compile(r"^\s*(?:Stack|Current thread 0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d{1,9} in (?P<func>\S+)\s*$')
# what the C library or the C++ runtime prints before it aborts: the reason the report's `Aborted` leaves out
_ABORT_REASON = re.compile(r"^\s*(?:(?:free|malloc|realloc|calloc|munmap_chunk|malloc_consolidate|_int_\w+)\(\): \S.*|"
                           r"double free or corruption.*|corrupted (?:size|double-linked list|top size)\b.*|"
                           r"terminate called after throwing .+|what\(\): \S.*)$")
_REASON_LINES = 20  # how far before the report its reason may be
# threading's excepthook: the traceback after it ended that thread, not the process
_THREAD = re.compile(r"^\s*Exception in thread (?P<name>\S.*?):?\s*$")
# sys.unraisablehook: an exception a destructor, a finalizer or an atexit callback raised, which Python ignored (it
# ended nothing: `Exception ignored in: <function CustomAllreduce.__del__ at 0x...>` at a teardown)
_IGNORED = re.compile(r"^\s*Exception ignored\b")
_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"
# `pkg.mod.TypeName: message`, Ray's wrapper `ray.exceptions.RayTaskError(ValueError): ...`, a head cut (`.ZMQError`)
_EXCEPTION = re.compile(r"^\.?(?P<type>(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*))(?:\((?P<inner>(?:[A-Za-z_]\w*\.)*"
                        r"[A-Za-z_]\w*)\))?(?::(?:\s(?P<message>.*))?)?$")
_EXCEPTION_NAME = re.compile(r"(?:Error|Exception)$")  # what a type alone must end in to be read outside a traceback
# or the module it lives in must say it is one: `triton.runtime.errors.OutOfResources`, `zmq.error.Again`
_EXCEPTION_MODULE = re.compile(r"(?:^|\.)(?:errors?|exceptions?)\.[A-Z]\w*$")
_BARE_IN_TRACEBACK = re.compile(r"(?:Error|Exception|Exit|Interrupt|StopIteration|Failed|Unsupported)$")
_REPR = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))\((?P<message>.*)\)$")
_KEYWORDS = frozenset({"raise", "return", "pass", "yield", "await", "break", "continue", "else", "try", "finally"})
_RUNPY = ("<frozen runpy>", "runpy.py")
_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s")
_CONTINUATION_LINES, _MAX_MESSAGE = 3, 1000
# a statement that raises: `assert <condition>[, message]`, `raise Name(message)` (the last frame of a cut traceback)
_RAISING = re.compile(r"^(?:assert\s\S.*|raise (?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"
                      r"\((?P<message>.*)\))$")
# where an exception a wrapper quotes after words of its own starts, on one line (Triton's model table: `| vllm | 1 |
# UNAVAILABLE: Internal: TypeError: …`, a launcher's `Failed to start engine: ValueError: …`)
_QUOTED = re.compile(r"[:|] (?=(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S)")


@dataclass(frozen=True)
class Frame:
    path: str
    func: str
    code: str | None = None  # the source line Python printed under it, when it did

    @property
    def where(self) -> str:
        """``vllm.v1.worker.gpu_worker.init_device``."""
        return f"{module_of(self.path)}.{self.func}"


@dataclass(frozen=True)
class PyException:
    type: str  # as printed, e.g. torch.OutOfMemoryError (a Ray wrapper's wrapped type)
    message: str  # the message, with the indented lines that continue it
    line: str  # the exception line as logged (undecorated, vLLM's header kept): the evidence
    index: int  # the scan position of that line
    process: str | None
    frames: tuple[Frame, ...] = ()
    cause: PyException | None = None  # raised from (or while handling) this one
    wrapper: str | None = None  # Ray's wrapper type, when the exception came through one
    thread: str | None = None  # the thread it ended, when Python said so (`Exception in thread ray_print_logs:`)
    ignored: bool = False  # Python ignored it (`Exception ignored in: ...` before its traceback): it ended nothing
    quoted: bool = False  # named inside a line after a wrapper's own words, not at the line's start

    @property
    def stated(self) -> str:
        """The exception line as Python printed it, without vLLM's header: the evidence a sentence quotes."""
        return _RAY_REPEAT.sub("", VLLM_HEADER.sub("", self.line, count=1)).strip()

    @property
    def told(self) -> str:
        """The exception line with the lines that continue its message, as one line: what a sentence quotes."""
        rest = self.message.split("\n")[1:]
        return " ".join([self.stated, *rest]) if rest else self.stated

    @property
    def name(self) -> str:
        """The type without its module: ``OutOfMemoryError``."""
        return self.type.rsplit(".", 1)[-1]

    @property
    def root(self) -> PyException:
        """The first exception of the chain: the one everything after it was raised from."""
        found = self
        while found.cause is not None:
            found = found.cause
        return found

    @property
    def chain(self) -> tuple[PyException, ...]:
        """Root first, this one last."""
        links: list[PyException] = []
        found: PyException | None = self
        while found is not None:
            links.append(found)
            found = found.cause
        return tuple(reversed(links))

    @property
    def summary(self) -> str:
        """``Type: first line of the message``."""
        first = self.message.split("\n", 1)[0]
        return f"{self.type}: {first}" if first else self.type

    @property
    def where(self) -> str | None:
        """The innermost frame: where it was raised."""
        return self.frames[-1].where if self.frames else None

    @cached_property
    def subsystem(self) -> Subsystem:
        """The subsystem of the innermost frame that lies in one (an import is not a subsystem: see `imported`)."""
        return subsystem_of(f"{frame.path}:{frame.func}" for frame in reversed(self.frames))

    @cached_property
    def imported(self) -> str | None:
        """The innermost module whose import raised it (a ``<module>`` frame entered from an ``import`` statement, or
        without source lines any ``<module>`` frame but the script's own), as a module name; None when none did."""
        found = None
        for caller, frame in zip(self.frames, self.frames[1:], strict=False):
            if frame.func != "<module>" or any(caller.path.endswith(r) for r in _RUNPY):
                continue
            if caller.code is None or _IMPORT.match(caller.code):
                found = frame
        return module_of(found.path) if found is not None else None


def exception_line(body: str, *, in_traceback: bool) -> re.Match[str] | None:
    """The match of an exception line (header removed), or None. Outside a traceback the type must say it is an
    exception (``...Error``/``...Exception``) and carry a message, or stand alone on its line (``TimeoutError``, an
    excerpt cut after its ``raise``); inside, the line after the frames is the exception whatever its name, as long as
    it reads like a type (CamelCase, not a statement)."""
    text = body.strip()
    if not text or text.startswith(("File ", "Traceback")):
        return None
    m = _EXCEPTION.match(text)
    if m is None or m.group("name") in _KEYWORDS:
        return None
    name = m.group("name")
    named = (_EXCEPTION_NAME.search(name) is not None or (m.group("inner") or "").endswith(("Error", "Exception"))
             or _EXCEPTION_MODULE.search(m.group("type")) is not None)
    if in_traceback:
        bare = _BARE_IN_TRACEBACK.search(name) is not None
        return m if (named or bare or (name[:1].isupper() and (":" in text or "." in m.group("type")))) else None
    return m if named and (m.group("message") or text == m.group("type")) else None


def _quoted_exception(body: str) -> re.Match[str] | None:
    """The exception a line quotes after a wrapper's own words (a status, a launcher's sentence), read as if it stood
    alone; a table's closing bar is left out."""
    m = _QUOTED.search(body)
    return exception_line(body[m.end():].rstrip(" |"), in_traceback=False) if m is not None else None


def _wrapped(exc: PyException, body: str) -> bool:
    """The exception's message stops after a comma (or mid-word) and the line goes on in words, not as a log line."""
    tail = exc.message.rstrip()
    starts = body.lstrip()[:1]
    if not tail or body.strip() in (_CAUSE, _CONTEXT) or exception_line(body, in_traceback=False) is not None:
        return False
    return tail.endswith(",") or (tail[-1].isalnum() and (starts.islower() or starts.isdigit()))


@dataclass
class _Open:
    """A traceback being read in one process."""

    frames: list[Frame] = field(default_factory=list)
    linked: bool = False  # a chain marker came before this traceback
    thread: str | None = None  # the thread whose end it reports (`Exception in thread X:` just before it)
    ignored: bool = False  # `Exception ignored ...` just before it
    code_at: int | None = None  # the line of the last frame's statement


@dataclass
class _State:
    open: _Open | None = None
    last: PyException | None = None  # the last exception this process logged (a chain's earlier link)
    pending_link: bool = False  # a chain marker was read and no traceback started since
    continuing: PyException | None = None  # the exception whose message may continue on the next lines
    continued: int = 0
    stated: PyException | None = None  # logged as its repr by vLLM before its traceback (V0's engine)
    dump: PyException | None = None  # a native crash faulthandler reports, whose stack is being read
    abort_reason: tuple[int, str] | None = None  # the last line that said why the process would abort


@dataclass
class TracebackParser:
    """Fed every undecorated line in log order; answers with an exception on the line that ends one. `found` holds
    each exception as it stands once its message's continuation lines are read."""

    states: dict[tuple[str | None, int | None], _State] = field(default_factory=dict)
    found: dict[int, PyException] = field(default_factory=dict)  # by the index of the line that ends each, final
    code: set[int] = field(default_factory=set)  # the lines of source (and carets) Python printed under a frame
    structure: set[int] = field(default_factory=set)  # `Traceback (most recent call last):`, frames, chain markers
    # what Python said the next traceback ended, and where: a thread (`Exception in thread X:`), or nothing
    # (`Exception ignored in: ...`)
    announced: dict[tuple[str | None, int | None], tuple[int, _Open]] = field(default_factory=dict)

    def feed(self, index: int, text: str, process: str | None, pid: int | None = None) -> PyException | None:
        state = self.states.setdefault((process, pid), _State())
        body = _RAY_REPEAT.sub("", VLLM_HEADER.sub("", text, count=1))
        if self._continues(state, body) or self._dump_line(state, index, text, body, process):
            return None
        thread, ignored = _THREAD.match(body), _IGNORED.match(body)
        if thread is not None or ignored is not None:  # what the traceback right after it ended
            said = _Open(thread=thread.group("name") if thread is not None else None, ignored=ignored is not None)
            self.announced[process, pid] = (index, said)
            self.structure.add(index)
            return None
        if _START.search(body):
            at, said = self.announced.pop((process, pid), (-9, _Open()))
            if index - at > 2:
                said = _Open()
            state.open = _Open(linked=state.pending_link, thread=said.thread, ignored=said.ignored)
            state.pending_link = False
            if body.lstrip().startswith("Traceback"):  # not V0's `... while processing method x: <error>, Traceback`
                self.structure.add(index)
            return None
        if body.strip() in (_CAUSE, _CONTEXT):
            state.pending_link, state.open = True, None
            self.structure.add(index)
            return None
        m = _FRAME.match(body)
        if m is not None:
            self.structure.add(index)
            if state.open is None:  # an excerpt that starts mid-traceback
                state.open = _Open(linked=state.pending_link)
            state.open.frames.append(Frame(m.group("path") or m.group("ipath"), m.group("func") or m.group("ifunc")))
            return None
        found = exception_line(body, in_traceback=state.open is not None and bool(state.open.frames))
        quoted = found is None and state.open is None
        if quoted:
            found = _quoted_exception(body)
        if found is None:
            self._repr_line(state, index, text, body, process)
            if state.open is not None and state.open.frames and body.strip():
                self.code.add(index)
            self._code_line(state, body, index)
            return None
        return self._ended(state, found, index, text, process, quoted)

    def finish(self) -> None:
        """The end of the log: an exception vLLM logged as its repr whose traceback was cut before it ended counts,
        at its own line (V0's engine logs `ValueError('...')`, then the traceback), with the frames read before the cut:
        where it was raised, as far as the log tells."""
        for (process, _), state in self.states.items():
            if state.stated is not None:
                frames = tuple(state.open.frames) if state.open is not None else ()
                self.found.setdefault(state.stated.index, replace(state.stated, frames=frames))
                state.stated = None
            elif state.open is not None:
                self._cut(state.open, process)

    def _cut(self, opened: _Open, process: str | None) -> None:
        """A traceback the log cut before its exception line, whose last frame's statement says what it raised (`assert
        self.enable_controller`: an AssertionError; `raise ValueError("...")`): that exception, at the statement's line,
        its message the assertion's or the raise's text."""
        statement = opened.frames[-1].code if opened.frames else None
        m = _RAISING.match(statement or "")
        if m is None or opened.code_at is None or opened.code_at in self.found:
            return
        exc_type = m.group("type") or "AssertionError"
        message = (m.group("message") or "").strip("'\"") if m.group("type") else ""
        self.found[opened.code_at] = PyException(type=exc_type, message=message, line=statement or "",
                                                 index=opened.code_at, process=process, frames=tuple(opened.frames))

    def _dump_line(self, state: _State, index: int, text: str, body: str, process: str | None) -> bool:
        """faulthandler's report of a native crash, read as an exception raised where its stack's innermost frame is
        (a crash inside NCCL's communicator set-up is NCCL's), its message with the reason the C library or the C++
        runtime printed just before an abort (`free(): double free detected in tcache 2`)."""
        fatal = _FATAL.match(body)
        if fatal is not None:
            why = state.abort_reason if state.abort_reason and index - state.abort_reason[0] <= _REASON_LINES else None
            message = fatal.group("what") + (f"\n(after {why[1]})" if why and fatal.group("what") == "Aborted" else "")
            state.dump = self.found[index] = PyException("Fatal Python error", message, text.strip(), index, process)
            return True
        if state.dump is None:
            if _ABORT_REASON.match(body):
                state.abort_reason = (index, body.strip())
            return False
        frame = _DUMP_FRAME.match(body)
        if frame is None and not _DUMP_HEAD.match(body) and body.strip():
            state.dump = None
            return False
        self.structure.add(index)
        if frame is not None:  # most recent call first: each frame is the caller of the ones before it
            dump = state.dump
            state.dump = self.found[dump.index] = replace(dump, frames=(Frame(frame["path"], frame["func"]),
                                                                        *dump.frames))
        return True

    def _repr_line(self, state: _State, index: int, text: str, body: str, process: str | None) -> None:
        m = _REPR.match(body.strip())
        header = VLLM_HEADER.match(text)
        if m is None or state.open is not None or header is None or header_level(header) not in ("ERROR", "CRITICAL"):
            return
        state.stated = PyException(type=m.group("type"), message=m.group("message").strip("'\"")[:_MAX_MESSAGE],
                                   line=text.strip(), index=index, process=process)

    def _code_line(self, state: _State, body: str, index: int) -> None:
        opened = state.open
        stripped = body.strip()
        if opened is None or not opened.frames or not stripped or set(stripped) <= set("^~ "):
            return
        last = opened.frames[-1]
        if last.code is None:
            opened.frames[-1] = replace(last, code=stripped)
            opened.code_at = index

    def _ended(self, state: _State, m: re.Match[str], index: int, text: str, process: str | None,
               quoted: bool = False) -> PyException:
        opened = state.open
        linked = opened.linked if opened is not None else state.pending_link
        inner, outer = m.group("inner"), m.group("type")
        exc = PyException(type=inner or outer, message=(m.group("message") or "").strip()[:_MAX_MESSAGE],
                          line=text.strip(), index=index, process=process,
                          frames=tuple(opened.frames) if opened is not None else (),
                          cause=state.last if linked else None, wrapper=outer if inner else None,
                          thread=opened.thread if opened is not None else None,
                          ignored=opened.ignored if opened is not None else False, quoted=quoted)
        state.open, state.pending_link, state.last = None, False, exc
        state.continuing, state.continued = exc, 0
        if state.stated is not None and state.stated.name == exc.name:
            state.stated = None  # the traceback ended in the exception its repr announced: one exception
        self.found[index] = exc
        return exc

    def _continues(self, state: _State, body: str) -> bool:
        """A line right after an exception line continues its message when it is indented (pydantic's detail lines)
        or when the message broke off mid-sentence (a terminal that wrapped it after a comma)."""
        exc = state.continuing
        if exc is None or state.continued >= _CONTINUATION_LINES:
            state.continuing = None
            return False
        indented = body.startswith((" ", "\t"))
        if not body.strip() or _FRAME.match(body) or _START.search(body) or not (indented or _wrapped(exc, body)):
            state.continuing = None
            return False
        updated = replace(exc, message=f"{exc.message}\n{body.strip()}"[:_MAX_MESSAGE])
        state.continued += 1
        state.continuing = state.last = updated
        self.found[exc.index] = updated
        return True
