"""The failure families of the layers around vLLM that are neither its code nor the node's hardware: the container
image as the engine pulls and starts it, a GPU-sharing layer interposed between vLLM and the driver (HAMi's libvgpu),
a CPU kernel library that compiles its kernels at run time (libxsmm under Intel's extensions). Read after the node's
families (`families.py` says how). Pure."""

from __future__ import annotations

import re

from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.rulekit import Tier, fmt, with_mem
from sparkd.supervisor.sentences import NO_RETRY_IMAGE

__all__ = ["STACK"]

F, K = FailureClass, Kind
_I = re.IGNORECASE
# HAMi-core's log prefix (`log_utils.h`): `[HAMI-core ERROR (pid:N thread=N file.c:N)]: ...`
_HAMI_ERROR = r"\[HAMI-core ERROR\b[^\]]*\]:? "
_PULL_DO = f"fix the image name or tag in the config, or use an image built for this host's CPU — {NO_RETRY_IMAGE}"

STACK: tuple[Family, ...] = (
    Family(F.oom, "vLLM ran out of memory", (
        sign("HAMi's vGPU layer refuses an allocation beyond the container's memory quota (`Device 0 OOM used / "
             "limit`, allocator.c): an out-of-memory of the share the pod was given, whatever the card has free",
             message=rf"{_HAMI_ERROR}.*?Device (?P<dev>\d+) OOM (?P<used>\d+) ?/ ?(?P<limit>\d+)",
             what=with_mem("HAMi's GPU-sharing layer refused an allocation on device {dev} beyond the container's "
                           "memory quota")),
    )),
    Family(F.image_error, "vLLM's image cannot run it", (
        sign("an error of HAMi's GPU-sharing layer (libvgpu, mounted into the container by the device plugin) other "
             "than its quota (`Illegal device id`, a host pid it cannot find): the layer vLLM's CUDA calls go through "
             "cannot serve what this vLLM or NCCL asks of it, and a retry does the same; generic, so a specific cause "
             "elsewhere in the log says more", message=rf"{_HAMI_ERROR}(?P<said>.+)", tier=Tier.GENERIC,
             what=fmt("HAMi's GPU-sharing layer under vLLM failed ({said})")),
        sign("a CPU kernel library that compiles its kernels at run time (libxsmm, under Intel's extensions and "
             "vLLM's CPU backend) could not produce one for this CPU (`Unable to get JIT kernel for brgemm`): the "
             "image's build does not fit the CPU's instruction set, and every run fails the same way",
             message=r"Unable to get JIT kernel for (?P<kernel>\w+)",
             what=fmt("A CPU kernel library in the image could not compile its {kernel} kernel for this CPU")),
        sign("the container engine or the orchestrator could not pull the image or found none for this platform "
             "(pull access denied, manifest unknown, no matching manifest for linux/arm64, a kubelet's ErrImagePull "
             "or ImagePullBackOff): the image named in the config does not exist as named, or not for this CPU",
             flags=_I, do=_PULL_DO,
             message=r"pull access denied for \S+|manifest unknown|no matching manifest for \S+|"
                     r"\b(?:ErrImagePull|ImagePullBackOff)\b|Failed to pull image \S+.{0,400}?\b(?:not found|denied|"
                     r"unauthorized)\b|"
                     r"Back-off pulling image"),
        sign("the kernel cannot execute the image's entry point: an image built for another CPU architecture (an "
             "amd64 image on a GB10's arm64, or the reverse), which Docker runs without complaint until exec",
             message=r"\bexec format error\b", kinds={K.other, K.python, K.vllm}, do=_PULL_DO),
    )),
)
