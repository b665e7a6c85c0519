"""The pieces the classifier's rule catalogue (`rules.py`) is made of: a rule, its tier, the helpers that build
its sentence halves from a match and the `ClassifyContext`, and the "what to do" texts rules share. Pure."""

from __future__ import annotations

import re
import re._parser as sre
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.sentences import NO_RETRY_IMAGE, mem_note

if TYPE_CHECKING:
    from sparkd.supervisor.context import ClassifyContext

INIT_FAILED = "vLLM's engine failed to start"


class Tier(IntEnum):
    CAUSE = 0
    GENERIC = 1
    CONSEQUENCE = 2
    AMBIGUOUS = 3


What = Callable[[re.Match[str], "ClassifyContext"], str]
When = Callable[[re.Match[str], int | None, "ClassifyContext"], bool]


@dataclass(frozen=True)
class Rule:
    cls: FailureClass
    tier: Tier
    pattern: re.Pattern[str]
    what: What | None = None  # the "what happened" clause; None → the class default
    do: str | None = None  # the "what to do" clause; None → the class default
    when: When | None = None  # an extra condition on the match (exit code, context); None → always
    unless_after: re.Pattern[str] | None = None  # the line does not count after an earlier line matching this
    provisional: bool = False  # a later specific finding of its class and tier says more (a frame's, a launcher's line)
    because: re.Pattern[str] | None = None  # the line's reason, when logged before it: the latest such line is quoted
    # a later match says more than an earlier finding of its class at its tier (the driver's recovery action for the
    # GPU after the Xid of the fault: what the node needs now)
    overrides: bool = False
    needles: tuple[str, ...] = field(default=(), compare=False)  # literal text one of which every match holds

    def __post_init__(self) -> None:
        object.__setattr__(self, "needles", needles_of(self.pattern))

    def may_match(self, text: str, low: str) -> bool:
        """A cheap test before the search: the line holds one of the pattern's literal needles."""
        hay = low if self.pattern.flags & re.IGNORECASE else text
        return not self.needles or any(n in hay for n in self.needles)


_MIN_NEEDLE = 4


def needles_of(pattern: re.Pattern[str]) -> tuple[str, ...]:
    """Literal pieces of text one of which every match of `pattern` holds (lower-case for a case-insensitive one):
    the longest run of literal characters the pattern requires, or one per branch of an alternation; () when it
    requires none long enough to be worth testing."""
    found = _required(list(sre.parse(pattern.pattern, pattern.flags)))
    if pattern.flags & re.IGNORECASE:
        found = tuple(n.lower() for n in found)
    return found if found and all(len(n) >= 2 for n in found) else ()


def _required(items: list[tuple[Any, Any]]) -> tuple[str, ...]:
    best, run = "", ""
    branches: tuple[str, ...] = ()
    for op, av in items:
        if op is sre.LITERAL:
            run += chr(av)
            continue
        best, run = max(best, run, key=len), ""
        if op is sre.BRANCH and not branches:
            subs = [_required(list(branch)) for branch in av[1]]
            branches = tuple(n for sub in subs for n in sub) if all(subs) else ()
        elif op is sre.SUBPATTERN and not branches:
            sub = _required(list(av[3]))
            if len(sub) == 1:
                best = max(best, sub[0], key=len)
            else:
                branches = sub
    best = max(best, run, key=len)
    if len(best) >= _MIN_NEEDLE or (best and not branches):
        return (best,)
    return branches


def const(text: str) -> What:
    return lambda m, ctx: text


def fmt(template: str) -> What:
    """A "what" from the match's named groups: `fmt("the module {mod} is missing")`."""
    return lambda m, ctx: template.format(**{k: (v or "").strip() for k, v in m.groupdict().items()})


def exit_127_or_target(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    if exit_code in (126, 127):
        return True
    path = m.groupdict().get("path") or m.groupdict().get("cmd")
    return bool(ctx.launch_target) and path == ctx.launch_target


# "the fatal pattern is the same line with MemAvailable under ~10 GiB" (community-recipes.md §11).
NVRM_LOW_MEMORY_BYTES = 10 * 1024**3


def memory_was_low(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return ctx.mem_available_bytes is not None and ctx.mem_available_bytes < NVRM_LOW_MEMORY_BYTES


def what_missing_path(m: re.Match[str], ctx: ClassifyContext) -> str:
    path = m.group("path")
    if ctx.launch_target and path == ctx.launch_target:
        return f"The launch target {path} does not exist"
    return f"{path} does not exist"


def what_oci(m: re.Match[str], ctx: ClassifyContext) -> str:
    path, why = m.group("path"), m.group("why").lower()
    if why.startswith("permission"):
        return f"Docker could not execute {path} (permission denied)"
    if why.startswith("executable"):
        return f"Docker could not find {path} on the container's PATH"
    return f"{path} does not exist in the container"


def with_mem(text: str) -> What:
    return lambda m, ctx: text.format(**{k: v or "" for k, v in m.groupdict().items()}) + mem_note(ctx)


def what_peer(m: re.Match[str], ctx: ClassifyContext) -> str:
    where = f" at {ctx.peer}" if ctx.peer else ""
    why = (m.groupdict().get("why") or "").strip()
    detail = f" ({why})" if why and "closed" not in why else ""
    return f"The peer rank{where} went away: its TCPStore connection closed{detail}"


def what_nccl(m: re.Match[str], ctx: ClassifyContext) -> str:
    msg = re.sub(r",? NCCL version \S+$", "", m.group("msg").strip()).rstrip(" .,")
    return f"NCCL failed: {msg}"


def not_a_warning(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    """Image errors never retry, so a line vLLM only logged as a warning (an optional import) does not count."""
    return not BELOW_ERROR.match(m.string)


BELOW_ERROR = re.compile(r"(?:DEBUG|INFO|WARNING) (?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d")


def what_peer_link(m: re.Match[str], ctx: ClassifyContext) -> str:
    where = f" at {ctx.peer}" if ctx.peer else ""
    why = (m.groupdict().get("why") or "").strip()
    if why and "closed" not in why:  # reset or broken: the other end went away mid-exchange
        return f"The peer rank{where} went away: its connection to this rank failed ({why})"
    return f"The peer rank{where} went away: its connection was closed by the remote peer"


def what_engine_signal(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (f"vLLM's engine core received {m.group('sig')} from outside sparkd and vLLM (no shutdown of vLLM's own "
            "and no error came first): a person, a script or another program's sweep of VLLM::* processes signalled "
            "it, and the engine died")


ENGINE_SIGNAL_DO = ("find who sent it (`journalctl`, `auditctl -a always,exit -F arch=b64 -S kill`) — sparkd restarts "
                    "with backoff")


def what_nccl_remote(m: re.Match[str], ctx: ClassifyContext) -> str:
    where = f" at {ctx.peer}" if ctx.peer else ""
    return f"NCCL lost the peer rank{where}: the remote process exited or the network failed"


def what_module(m: re.Match[str], ctx: ClassifyContext) -> str:
    mod = m.group("mod")
    known = {"deep_gemm": " (DeepGEMM)", "flashinfer": " (FlashInfer)", "cutlass": " (CUTLASS DSL)"}
    return f"The image lacks the Python module {mod}{known.get(mod.split('.')[0], '')}"


def what_so(m: re.Match[str], ctx: ClassifyContext) -> str:
    lib = m.group("lib")
    if lib.startswith(("libcuda.", "libnvidia-")):
        return f"The container cannot load the NVIDIA driver library {lib}: it was started without GPU access"
    return f"The image cannot load the shared library {lib}"


REBUILD = f"fix or rebuild the image — {NO_RETRY_IMAGE}"
DEEPGEMM = ("install DeepGEMM into the image (git clone --recursive https://github.com/deepseek-ai/DeepGEMM.git "
             f"&& pip install --no-deps --no-build-isolation .) — {NO_RETRY_IMAGE}")
FORK = ("if VLLM_WORKER_MULTIPROC_METHOD=fork is set in the config, the container's env or the launch script, "
         "remove it (field report 002); otherwise it is the intermittent cold-boot race of vllm#54259 — sparkd "
         "restarts every rank with backoff")
SHM_FULL = ("leaked segments fill it or it is too small — sparkd removes dead nccl-* segments before the next start "
             "and restarts every rank with backoff; if it repeats, give vLLM's container a larger /dev/shm "
             "([container] shm_size) or the host's (host_ipc = true)")
CUSTOM_AR = ("if it repeats, add --disable-custom-all-reduce to the config's vLLM flags (NCCL then does the "
              "all-reduce) — sparkd restarts every rank with backoff")
DOUBLE_PATCH = ("the mxfp4.py patch (fix-ds4-gpu-cache) was applied twice: `grep -c empty_cache` on mxfp4.py must "
                 "print 2 — dedup it or rebuild the image, and add a [[preflight.assert]] for it — "
                 + NO_RETRY_IMAGE)


def rule(cls: FailureClass, tier: Tier, pattern: str, what: What | None = None, do: str | None = None, *,
       flags: int = 0, when: When | None = None, unless_after: str | None = None, provisional: bool = False,
       because: str | None = None, overrides: bool = False) -> Rule:
    return Rule(cls, tier, re.compile(pattern, flags), what, do, when,
                re.compile(unless_after) if unless_after is not None else None, provisional,
                re.compile(because) if because is not None else None, overrides)


def image(pattern: str, what: What, do: str = REBUILD) -> Rule:
    """An image error: never retried, so never from a line vLLM only logged as a warning."""
    return rule(FailureClass.image_error, Tier.CAUSE, pattern, what, do, when=not_a_warning)
