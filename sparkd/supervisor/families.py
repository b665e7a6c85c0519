"""Failure families: what a failure IS, read from an event's structure — the exception's type, where it was raised, an
error code, the kind of line — and from its vocabulary, the kinds of word one error event holds together
(`lexicon.py`), with a phrase only one sign among several. Pure.

Each :class:`Family` is one row: the class it gives, what happened in words, and its signs (`familykit.py`). A sign
that names facts (the port, the sizes, the module missing) says so in its own words; the others quote the error. The
rows live by their seam: the start-up's here (the memory check, a port, a GPU held), the families between the ranks
and of vLLM's own processes in `families_ranks.py` (a peer gone, a rendezvous that never formed, NCCL, a rank that
stopped answering, the engine's death), the node's in `families_node.py` (memory, the image, the configuration from
`families_config.py`, the GPU's faults), the layers around vLLM in `families_stack.py`. A line of advice
(`Event.advice`) is no family's evidence, and an exception that ended a side thread is read at most at the generic
tier (`_SIDE_THREAD`). :func:`judge` reads them all and keeps the lowest tier; in a tie, the first row, in this order:
the startup memory check, a port and a GPU held, whose words are unmistakable; then the families between the ranks,
whose errors may mention memory or a timeout as their detail; then memory, before the image and the configuration (an
out-of-memory raised while importing is memory, not the image); then the GPU's faults, the wedges and the engine's
death. After the table, :data:`BY_KIND` decides an error no family explains by the kind of line or where it was raised
(an unrecognised CUDA error is the GPU's, an error raised inside a collective is NCCL's).

Adding a family is a row here and a case in ``tests/unit/test_families.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.events import Event, Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families_node import ERROR_LINES, NODE, PROFILED_UNCHANGED
from sparkd.supervisor.families_ranks import BETWEEN_RANKS, PROCESSES
from sparkd.supervisor.families_stack import STACK
from sparkd.supervisor.familykit import Family, FamilyHit, Sign, sign, what_of
from sparkd.supervisor.rulekit import Tier, const, with_mem
from sparkd.supervisor.sentences import NO_RETRY, port_what, what_free_memory
from sparkd.supervisor.subsystems import Subsystem

__all__ = ["BY_KIND", "FAMILIES", "Family", "FamilyHit", "Sign", "judge"]

F, S, K = FailureClass, Subsystem, Kind
_I = re.IGNORECASE
_ACCELERATOR = r"(?:device|GPU|NPU|HPU|TPU|XPU|accelerator)"

STARTUP: tuple[Family, ...] = (
    Family(F.free_memory_refusal, "vLLM refused to start because too little memory was free", (
        sign("vLLM's startup check compares the free memory with gpu_memory_utilization before it loads anything; "
             "this wording names the sizes",
             message=r"Free memory on device (?:\w+:\d+ )?\(~?(?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\)(?: on startup)? "
                     r"is less than desired GPU memory utilization \((?P<util>[\d.]+)(?:, ~?(?P<want>[\d.]+) GiB)?\)",
             terms="mem", what=what_free_memory),
        sign("the same check in other wordings (0.11-0.32, GPU and CPU backends), or cut before its end",
             terms="mem", message=r"(?:Free|Available) memory on (?:device|node)\b"),
        sign("the same check when weights are held outside the process (0.32)", terms="mem",
             message=r"Externally held weights on device .* exceed the desired GPU memory utilization"),
        sign("memory grew while vLLM profiled: another process (or the page cache) released memory at startup",
             message=r"Error in memory profiling\. Initial free memory (?P<before>[\d.]+) GiB, current free memory "
                     r"(?!(?P=before) GiB)(?P<after>[\d.]+) GiB", terms="mem",
             what=with_mem("vLLM's memory profiling failed: free memory grew from {before} to {after} GiB while it "
                           "profiled (on GB10 the page cache or another process released memory)")),
        sign("the same, cut before its sizes", message=r"Error in memory profiling", terms="mem",
             unless=PROFILED_UNCHANGED),  # the image's (`families_node.py`), not memory another process released
    )),
    Family(F.port_in_use, "A port vLLM needs was already in use", (
        sign("torch's TCPStore names the port it could not listen on", terms="inuse", what=port_what,
             message=r"failed to listen on any local network address\. port: (?P<port>\d+).*EADDRINUSE"),
        sign("Gloo's and c10d's bind names the port", terms="inuse", what=port_what,
             message=r"failed to bind to \S*?:(?P<port>\d+) \(errno: 98"),
        sign("asyncio's and uvicorn's bind names the address and port", terms="inuse", what=port_what, flags=_I,
             message=r"bind on address \('[^']*', (?P<port>\d+)\)\)?: address already in use"),
        sign("ZMQ names the endpoint it could not bind, in its words for EADDRINUSE (`Address already in use "
             "(addr='tcp://*:5557')`, or its own `Address in use` where the system gives no text, as on Windows)",
             terms="inuse", what=port_what,
             message=r"\bAddress (?:already )?in use \(addr='[a-z]+://[^']*:(?P<port>\d+)'\)"),
        sign("EADDRINUSE, errno 98 (Linux) or 10048 (Windows): bind() found the port taken, whoever reports it "
             "(torch's TCPStore, uvicorn, ZMQ, Gloo), in the system's words or ZMQ's and Winsock's own (`Address in "
             "use`, `Only one usage of each socket address`)", terms="inuse",
             message=r"EADDRINUSE|\[Errno 98\]|errno: 98\b|[Aa]ddress already in use|WSAEADDRINUSE|\b10048\b|"
                     r"(?:^|: )Address in use(?= \(|[.,;]|$)|Only one usage of each socket address"),
        sign("a listener that could not listen on or bind a port, whose writer says another process holds it (HCCL's "
             "`listen on ip[...] and specific port[16666] fail. Please check ... whether the port is been using by "
             "other process`, a server's `bind port 8000 failed: the port is occupied by another program`): the port "
             "is taken, whatever library or server needed it, and the links or collectives that wait for it after "
             "are its fallout", terms="inuse", what=port_what, flags=_I,
             message=r"\b(?:listen|bind)\w*\b[^\n]{0,160}?\bport\b\W{0,2}(?P<port>\d+)?[^\n]{0,240}?\b(?:us(?:ed|ing)|"
                     r"occupied|taken|held) by (?:an ?)?other (?:process|program|application|service)"),
        sign("a service that finds its earlier run already at the address and port it would start at (Ray's head: `Ray "
             "is trying to start at 10.0.0.1:6379, but is already running at 10.0.0.1:6379`): a stale run holds the "
             "port", what=port_what, flags=_I,
             message=r"\btrying to (?:start|listen|bind|run) (?:at|on) \S+?:(?P<port>\d+),? but (?:it )?is already "
                     r"running at\b"),
        sign("a port, an address or a bind said to be in use (or bound) already, in any writer's words (CANN's "
             "`Failed to bind the IP port. Reason: The IP address and port have been bound already.`)", terms="inuse",
             message=r"\b(?:port|bind\w*|listen\w*|address|socket)\b.{0,80}\b(?:already in use|already allocated|"
                     r"bound already|already (?:been )?bound)|"
                     r"\b(?:already in use|already allocated)\b.{0,40}\bport\b", flags=_I),
    )),
    Family(F.config_error, "An address vLLM was told to use is not this host's", (
        sign("EADDRNOTAVAIL, errno 99 (10049 on Windows): a bind or a socket asked for an address that is none of this "
             "host's (a host, data-parallel or master address set for another machine or pod), whoever reports it "
             "(ZMQ, torch's store, uvicorn): the launch's address settings, which no restart changes", flags=_I,
             message=r"Cannot assign requested address|\bEADDRNOTAVAIL\b|\[Errno 99\]|errno:? 99\b|"
                     r"\bWSAEADDRNOTAVAIL\b",
             do=f"set an address this node has (its host, data-parallel or master address) in the config — "
                f"{NO_RETRY}"),
        sign("a network interface the launch names for the ranks' sockets (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) "
             "that this host does not have: Gloo's device lookup finds no address for it", flags=_I,
             message=r"Unable to find address for:? (?P<iface>\S+)",
             do=f"name an interface this node has in GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME — {NO_RETRY}"),
    )),
    Family(F.config_error, "The Ray cluster gives the node vLLM's driver runs on no accelerator", (
        sign("vLLM's Ray executor finds no accelerator of the cluster on the node it runs on, the driver's (`Current "
             "node has no GPU available`, `Ray does not allocate any GPUs on the driver node`): the cluster as it was "
             "set up (a head started without its GPUs, a host address that names another node, Ray's 'GPU' resource "
             "on NPUs) cannot place rank 0 there, and every start meets the same cluster — unlike a placement that "
             "waits for nodes still joining (the rendezvous family's)", flags=_I,
             message=r"\b(?:current|this|driver(?:'s)?) node has no (?:GPU|NPU|TPU|XPU|HPU|accelerator)s? available|"
                     r"\bdoes not allocate any (?:GPU|NPU|TPU|XPU|HPU|accelerator)s? on the driver node",
             do=f"run the driver (vLLM's head) on a node whose accelerators the Ray cluster registered (`ray status`), "
                f"with VLLM_HOST_IP set to that node's address — {NO_RETRY}"),
    )),
    Family(F.config_error, "vLLM's workers were started in a way the accelerator's runtime cannot take", (
        sign("torch refuses to initialise a device runtime (CUDA, XPU, NPU, HIP under CUDA's name) in a process "
             "forked after its parent initialised it, and says which start method it needs: the launch's "
             "multiprocessing method (VLLM_WORKER_MULTIPROC_METHOD=fork, or a script that touched the GPU before vLLM "
             "forked), which every start repeats; what follows (the rendezvous that waits for the dead workers) is "
             "its fallout", flags=_I,
             message=r"Cannot re-initiali[sz]e \w+ in (?:a )?forked subprocess|"
                     r"To use \w+ with multiprocessing, you must use the '?spawn'? start method",
             do="set VLLM_WORKER_MULTIPROC_METHOD=spawn in the launch's environment, and touch no GPU before vLLM "
                f"starts its workers — {NO_RETRY}"),
    )),
    Family(F.gpu_busy, "The accelerator is busy or held by another process", (
        sign("cudaErrorDevicesUnavailable: the device is in exclusive-process mode and another process holds it",
             terms="busy", message=r"busy or unavailable|DevicesUnavailable|DEVICES?_UNAVAILABLE", flags=_I,
             what=const("CUDA reported the GPU busy or unavailable")),
        sign("EBUSY on the accelerator's device file or while its backend initialises (a TPU's /dev/vfio, an NPU's "
             "/dev/davinci): another process holds the device", terms="busy", flags=_I,
             message=rf"(?:/dev/(?:vfio|accel|nvidia|davinci|dri|kfd|hl)\S*|\b{_ACCELERATOR}\b[^\n]{{0,80}}"
                     r"initiali[sz]\w*|initiali[sz]\w* [^\n]{0,80}\b(?:backend|device)\b)[^\n]{0,120}Device or "
                     r"resource busy"),
        sign("an accelerator the process could not acquire, or one another process occupies (Gaudi's 'Device "
             "acquire failed', an NPU 'occupied')", terms="busy", flags=_I,
             message=rf"\b(?:{_ACCELERATOR}|card)\b[^.\n]{{0,40}}\b(?:acquire failed|already acquired|could not be "
                     r"acquired|is occupied|occupied by|held by another|(?:already )?in use by (?:another |a )?"
                     r"process)"),
        sign("AWS Neuron's runtime finds none of the cores it was asked for free (`Neuron Core(s) not available - "
             "Requested:nc0-nc1 Available:0`): another process holds them", flags=_I,
             message=r"\bNeuron ?Core\(?s?\)? (?:are |is )?not available\b.{0,80}Available:\s*0\b",
             what=const("The Neuron cores vLLM asked for are held by another process")),
        sign("the runtime's own reason for a device it could not set up: the process of an earlier run still runs on "
             "it (Ascend's 'Maybe the last training process is running'): whatever call failed first (HCCL's, a "
             "context's) is its wrapper", terms="busy",
             message=r"\b(?:last|previous|earlier|old) (?:\w+ )?process(?:es)? (?:is |are )?(?:still )?running",
             what=const("The device is still held by a process of an earlier run, the runtime says")),
    )),
)

FAMILIES: tuple[Family, ...] = (*STARTUP, *BETWEEN_RANKS, *NODE, *STACK, *PROCESSES)

# An error no family explains, decided by what kind of line it is, what its writer said or where it was raised.
BY_KIND: tuple[Family, ...] = (
    Family(F.nccl, "NCCL failed", (
        sign("NCCL's WARN is its error line, whatever it says (`No usable listening interface found`)",
             kinds={K.nccl}, message=r"\bWARN\b", tier=Tier.GENERIC),
        sign("an exception raised inside a collective (an all-reduce, a broadcast, the communicator) is the collective "
             "backend's", raised_in={S.collective}, tier=Tier.GENERIC),
    )),
    Family(F.hang, "A rank stopped answering", (
        sign("a wait that ran out (a timeout type, or an error line that says something timed out) where no family "
             "names what was waited on: vLLM or a rank stopped answering", types=r"\w*Time[dD]?[oO]ut\w*|timeout",
             tier=Tier.GENERIC),
        sign("the same on an error line: something timed out (not a parameter named timeout, not a wait that will "
             "retry)", terms="timeout", kinds=ERROR_LINES, tier=Tier.GENERIC, unless=r"\bretry|\bretrying\b",
             message=r"\b(?:timed out|times out|time(?:d)? ?out after|deadline exceeded|timeout (?:error|exceeded|"
                     r"detected|expired|reached|occurred)|Timeout(?:Error|Exception)?:)", flags=_I),
    )),
    Family(F.engine_dead, "vLLM's engine died", (
        sign("an exception no family names, raised inside the engine's step (the model's forward, the sampler, V0's "
             "engine loop, V1's busy loop): it ends the engine, which is the engine's death whatever the exception",
             raised_in={S.step}, tier=Tier.GENERIC),
    )),
    Family(F.gpu_error, "The GPU or its driver reported an error", (
        sign("a CUDA or HIP error no family names: the device or its driver reported it", kinds={K.cuda, K.python},
             message=r"\b(?:CUDA|HIP) (?:driver )?error\b|\b(?:cuda|hip)Error\w+", tier=Tier.GENERIC),
        sign("torch_npu's wrapper of an NPU runtime error whose own lines are not in the log (`The Inner error is "
             "reported as above. The process exits for this inner error, and the current working operator name is "
             "aclnnRmsNorm.`): the device's runtime reported it, as a CUDA error no family names",
             kinds={K.python}, message=r"The Inner error is reported as above\b", tier=Tier.GENERIC),
    )),
)


# An exception that ended a thread (Python's `Exception in thread X:` before its traceback) ended that thread, not the
# process: a side thread's error (Ray's log printer failing to import IPython) is at most generic, so what ended the
# process (Ray's memory monitor killing the workers) comes first when the log says it.
_SIDE_THREAD = Tier.GENERIC
# How a process is stopped, not why it failed: a Ctrl-C while vLLM builds its config is no config error.
_STOPS = frozenset({"KeyboardInterrupt", "SystemExit", "CancelledError", "GeneratorExit"})
_NO_FACTS = ClassifyContext()
_ANY_LEVEL = tuple((family, s) for family in FAMILIES for s in family.signs if s.any_level)


def judge(event: Event, ctx: ClassifyContext | None = None) -> FamilyHit | None:
    """The reading of the family table with the lowest tier (the first row in a tie); else the first of `BY_KIND`. A
    line logged below ERROR is evidence only for the few signs that read it (a warning quoting an optional import's
    ImportError is none)."""
    if event.kind in (Kind.code, Kind.frame) or event.advice or (
            event.exception is not None and event.exception.name in _STOPS):
        return None
    ctx = ctx or _NO_FACTS
    if event.below_error:
        low = event.text.lower()
        return _best(((f, s) for f, s in _ANY_LEVEL if any(n in low for n in s.needles)), event, ctx, by_kind=False)
    if event.exception is None and not event.terms:
        return None  # a line that holds no word of a failure's vocabulary states none (`lexicon.py`)
    hit = _best(((f, s) for f in FAMILIES for s in f.signs), event, ctx, by_kind=False) or _best(
        ((f, s) for f in BY_KIND for s in f.signs), event, ctx, by_kind=True)
    if hit is not None and event.exception is not None and event.exception.thread is not None:
        return replace(hit, tier=max(hit.tier, _SIDE_THREAD))
    return hit


def _best(signs: Iterable[tuple[Family, Sign]], event: Event, ctx: ClassifyContext, *, by_kind: bool
          ) -> FamilyHit | None:
    """The first sign of the lowest tier that reads the event, and what it says."""
    best: tuple[Family, Sign, re.Match[str] | bool] | None = None
    for family, s in signs:
        if best is not None and s.tier >= best[1].tier:
            continue
        found = s.reads(event)
        if found is not False:
            best = (family, s, found)
            if s.tier is Tier.CAUSE:
                break
    if best is None:
        return None
    family, s, found = best
    what, quoted = what_of(family, s, event, found, ctx)
    return FamilyHit(family.cls, s.tier, what, s, by_kind=by_kind, quoted=quoted, do=s.do)
