"""Pieces of the classifier's sentences: the class defaults, facts from the context, what to do after a fault.

A sentence is "what happened (how it ended); what to do." The class table (`failures.TREATMENT`) holds the
default halves; the rules (`rules.py`) build a specific "what" from their match and these helpers. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sparkd.supervisor.failures import TREATMENT, FailureClass

if TYPE_CHECKING:
    from sparkd.supervisor.context import ClassifyContext

NO_RETRY = "sparkd will not retry a config error"
NO_RETRY_IMAGE = "sparkd will not retry an image error"
# The API server's SIGTERM/SIGINT line (rules.py); classify.py names no error beside it.
STOPPED_FROM_OUTSIDE = ("vLLM shut down because its API server received SIGTERM or SIGINT from outside sparkd: `docker "
                        "stop`, systemd, earlyoom, an orchestrator or a person stopped it, not a failure inside vLLM")
INTERRUPTED = ("vLLM was interrupted (KeyboardInterrupt: SIGINT) from outside sparkd: a person, a launcher or an "
               "orchestrator stopped it, not a failure inside vLLM")
LAUNCHER_STOPPED = ("vLLM's launcher (torchrun) received signal {sig} from outside sparkd and stopped its workers: a "
                    "person, a script or an orchestrator stopped it, not a failure inside vLLM")
SERVICE_STOPPED = ("vLLM's service or container was stopped from outside sparkd (systemd stopping the unit, the "
                   "orchestrator killing the container): not a failure inside vLLM")
STOPPED_FROM_OUTSIDE_DO = ("find who sent it (`journalctl`, `docker events`) and stop vLLM with `sparkctl stop` when "
                           "it is to stay down — sparkd restarts with backoff")

_GIB = 1024**3


def quote(text: str, limit: int = 200) -> str:
    """A log line as a sentence quotes it: verbatim in backticks (tabs and line breaks made spaces), at most `limit`
    characters."""
    text = re.sub(r"[\t\r\n]+", " ", text.strip())
    return f"`{text if len(text) <= limit else text[:limit - 1] + '…'}`"


def default_what(cls: FailureClass) -> str:
    return TREATMENT[cls].what


def default_do(cls: FailureClass) -> str:
    return TREATMENT[cls].do


def gib(n: int) -> str:
    return f"{n / _GIB:.1f} GiB"


def mem_note(ctx: ClassifyContext) -> str:
    if ctx.mem_available_bytes is None:
        return ""
    return f", with {gib(ctx.mem_available_bytes)} MemAvailable"


def port_name(port: int, ctx: ClassifyContext) -> str:
    if ctx.master_port is not None and port == ctx.master_port:
        return f"the torch.distributed master port {port}"
    if ctx.api_port is not None and port == ctx.api_port:
        return f"the API port {port}"
    if port in (29500, 29501):
        return f"the torch.distributed master port {port}"
    return f"port {port}"


def port_what(m: re.Match[str], ctx: ClassifyContext) -> str:
    port = m.groupdict().get("port")
    if port is None:
        return default_what(FailureClass.port_in_use)
    name = port_name(int(port), ctx)
    return f"{name[0].upper()}{name[1:]} was already in use"


def what_free_memory(m: re.Match[str], ctx: ClassifyContext) -> str:
    free, total, util, want = m.group("free"), m.group("total"), m.group("util"), m.group("want")
    if want is None:  # the shortened form the field quotes: "(4.75/119.67 GiB) ... utilization (0.9)."
        want = f"{float(util) * float(total):.1f}"
    return (f"vLLM refused to start: only {free} of {total} GiB was free and it wants {want} GiB at "
            f"gpu_memory_utilization {util}{mem_note(ctx)}")


# ---- what to do: after a device's fault (its groups: `devicecodes.py`), for RDMA's locked memory ----

REBOOT_DO = ("the GPU needs a reset: check `nvidia-smi` and `journalctl -k`, then reboot or power-cycle the node — "
             "sparkd restarts with backoff and stops at the restart breaker")
APP_XID_DO = ("a GPU kernel faulted (an illegal memory access or a killed channel), usually a bug in vLLM or a kernel "
              "for this model and settings — sparkd restarts with backoff; if it repeats, change the kernel backend "
              "or the vLLM build")
MEMLOCK_DO = ("the locked-memory limit is too low for RDMA: raise memlock to unlimited (ulimit -l unlimited; "
              "systemd LimitMEMLOCK=infinity; docker --ulimit memlock=-1 or compose ulimits: memlock: -1) or grant "
              "CAP_IPC_LOCK ([container] cap_add = [\"IPC_LOCK\"]), and give the container a large /dev/shm — sparkd "
              "restarts with backoff, but this repeats until the limit is raised")

