"""Failure families the classifier reads from a Python traceback as a whole, not from one line. Pure.

A rule of `rules.py` names one string; a family names where an exception was raised, so every member is covered
without a rule per message:

- **image** — an exception raised while a module was being *imported* (the traceback passes through an ``import``
  statement into a ``<module>`` frame): a package that cannot load in this image (``RuntimeError: operator
  torchvision::nms does not exist`` from a CUDA torchvision beside a CPU torch, ``OSError: libc10_cuda.so: cannot
  open shared object file``, a ``SyntaxError`` in an installed file). The same import fails every launch.
- **config** — an exception raised while vLLM builds or verifies its configuration: the innermost vLLM frame is in
  ``vllm/config/`` or ``vllm/engine/arg_utils.py``, or a frame is a ``verify_*`` / ``create_engine_config`` call
  (``ValueError: Total number of attention heads (4) must be divisible by tensor parallel size (8)``).

Import wins over config: ``vllm/config/model.py`` failing *at import* is the image's fault, not the settings'.

`TracebackReader` is fed every undecorated line in log order and answers, on the exception line that ends a
traceback, with the family's class and the "what happened" clause, or None. Tracebacks of several processes may
interleave in a log; frames are kept per process prefix by the caller passing one reader per process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkd.supervisor.failures import FailureClass

__all__ = ["FamilyHit", "TracebackReader", "module_of"]

_HEADER = re.compile(r"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] )?")
_START = re.compile(r"Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d{1,9}, in (?P<func>\S+)\s*$')
_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s")
_EXCEPTION = re.compile(r"^(?P<line>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$")
_CONFIG_PATH = re.compile(r"/vllm/(?:config/[\w/]+\.py|engine/arg_utils\.py)$")
_CONFIG_FUNC = re.compile(r"^(?:verify_\w+|create_engine_config|create_model_config|create_speculative_config)$")
_SITE = re.compile(r"^.*?/(?:site-packages|dist-packages)/")
_RUNPY = ("<frozen runpy>", "runpy.py")


def module_of(path: str) -> str:
    """``/usr/lib/python3/dist-packages/torchvision/_meta_registrations.py`` → ``torchvision._meta_registrations``;
    outside site-packages, the file's folder and name (``/opt/x/torchvision/io.py`` → ``torchvision.io``)."""
    m = _SITE.match(path)
    parts = (path[m.end():] if m else "/".join(path.split("/")[-2:])).removesuffix(".py").split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(p for p in parts if p)


@dataclass(frozen=True)
class FamilyHit:
    cls: FailureClass
    what: str  # the "what happened" clause
    exception: str  # the exception line the hit rests on


@dataclass
class _Frame:
    path: str
    func: str
    code: str | None = None


@dataclass
class TracebackReader:
    frames: list[_Frame] = field(default_factory=list)
    open: bool = False

    def feed(self, text: str) -> FamilyHit | None:
        body = _HEADER.sub("", text, count=1)
        if _START.search(body):
            self.frames, self.open = [], True
            return None
        if not self.open:
            return None
        m = _FRAME.match(body)
        if m is not None:
            self.frames.append(_Frame(m.group("path"), m.group("func")))
            return None
        m = _EXCEPTION.match(body.strip())
        if m is not None:
            hit = _judge(self.frames, m.group("line"))
            self.frames, self.open = [], False
            return hit
        if self.frames and self.frames[-1].code is None and body.strip() and not set(body.strip()) <= set("^~ "):
            self.frames[-1].code = body.strip()
        return None


def _imported(frames: list[_Frame]) -> _Frame | None:
    """The innermost module whose import raised: a ``<module>`` frame entered from an ``import`` statement (or,
    without source lines, any ``<module>`` frame but the script's own)."""
    found = None
    for i in range(1, len(frames)):
        frame, caller = frames[i], frames[i - 1]
        if frame.func != "<module>" or any(caller.path.endswith(r) for r in _RUNPY):
            continue
        if caller.code is None or _IMPORT.match(caller.code):
            found = frame
    return found


def _judge(frames: list[_Frame], exception: str) -> FamilyHit | None:
    if not frames:
        return None
    module = _imported(frames)
    if module is not None:
        name = module_of(module.path)
        return FamilyHit(FailureClass.image_error,
                         f"vLLM cannot start: importing {name} failed with `{_short(exception)}` — a package in the "
                         "image does not load (built for another torch, CUDA or Python, or a library it needs is "
                         "missing)", exception)
    vllm_frames = [f for f in frames if "/vllm/" in f.path]
    innermost = vllm_frames[-1] if vllm_frames else None
    if (innermost is not None and _CONFIG_PATH.search(innermost.path)) or any(
            _CONFIG_FUNC.match(f.func) for f in vllm_frames):
        return FamilyHit(FailureClass.config_error,
                         f"vLLM rejected its configuration while building it: `{_short(exception)}`", exception)
    return None


def _short(line: str, limit: int = 200) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"
