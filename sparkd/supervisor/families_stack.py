"""The failure families of the layers around vLLM that are neither its code nor the node's hardware: the container
image as the engine pulls and starts it, a GPU-sharing layer interposed between vLLM and the driver (HAMi's libvgpu),
a CPU kernel library that compiles its kernels at run time (libxsmm under Intel's extensions), the TPU's runtime
(libtpu) and kernel compiler (Mosaic, under Pallas and XLA). Read after the node's families (`families.py` says
how). Pure."""

from __future__ import annotations

import re

from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.rulekit import Tier, fmt, with_mem
from sparkd.supervisor.sentences import NO_RETRY, NO_RETRY_IMAGE

__all__ = ["STACK"]

F, K = FailureClass, Kind
_I = re.IGNORECASE
# HAMi-core's log prefix (`log_utils.h`): `[HAMI-core ERROR (pid:N thread=N file.c:N)]: ...`
_HAMI_ERROR = r"\[HAMI-core ERROR\b[^\]]*\]:? "
_TPU_KERNEL_DO = ("serve a model (head size, dtype, quantization) the platform's kernels implement, or another "
                  f"attention backend — {NO_RETRY}")
_SLICE_DO = (f"launch the TPU slice's hosts together with its own topology (TPU_WORKER_HOSTNAMES, "
             f"TPU_PROCESS_ADDRESSES, the Ray cluster's hosts) — {NO_RETRY}")
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
    Family(F.config_error, "The model or a setting asks for what the TPU's kernels do not implement", (
        sign("the TPU's kernel compiler (Mosaic, under Pallas's kernels) refuses a kernel whose shape or type it does "
             "not implement (`Mosaic failed to compile TPU kernel: Not Implemented: The last dim size is not 128`), "
             "or one it cannot partition: the model (its head size, its dtype) or a setting asks for what the "
             "platform's kernels do not do, and every start fails the same way", do=_TPU_KERNEL_DO, flags=_I,
             message=r"\bMosaic failed to compile (?:TPU )?kernel: (?:Not ?Implemented|Unimplemented|Unsupported)|"
                     r"\bMosaic kernels cannot be automatically partitioned"),
        sign("XLA's status for an operation its backend does not implement (`UNIMPLEMENTED: ...`): generic, a line "
             "that names the kernel says more", message=r"\bUNIMPLEMENTED: \S", tier=Tier.GENERIC,
             do=_TPU_KERNEL_DO),
    )),
    Family(F.config_error, "The TPU slice was started with hosts that do not match it", (
        sign("libtpu refuses the slice's topology it was started with (`TPU initialization failed: Invalid "
             "--..._slice_builder_worker_addresses specified. Expected 16 worker addresses, got 8`): the hosts the "
             "launch named for the slice do not match it", do=_SLICE_DO,
             message=r"TPU initialization failed: Invalid --?[\w-]+ specified|\bExpected \d+ worker addresses, got "
                     r"\d+"),
    )),
)
