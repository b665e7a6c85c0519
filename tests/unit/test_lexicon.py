"""The failure vocabulary (sparkd/supervisor/lexicon.py): each concept found in the wordings of several writers and
platforms, inside identifiers too, and not where the words only look alike."""

from __future__ import annotations

import pytest

from sparkd.supervisor.lexicon import CONCEPTS, terms


@pytest.mark.parametrize(("text", "held", "not_held"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", {"oom", "shortmem", "mem"}, set()),
    ("hipErrorOutOfMemory", {"oom", "devcode"}, set()),
    ("RuntimeError: The NPU memory is insufficient for this request", {"shortmem", "mem"}, set()),
    ("ACL_ERROR_RT_DEVIDE_OOM", {"oom", "devcode"}, set()),
    ("EJ0001: Failed to initialize the HCCP process", {"ccl", "failed"}, set()),
    ("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", {"oom", "devcode"}, set()),
    ("RuntimeError: SYS_EBUSY: Lack of device memory. (code: -16)", {"shortmem", "mem"}, {"busy"}),
    ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4398046511104 bytes", {"alloc", "mem"}, set()),
    ("raylet crashes unexpectedly (OOM, preempted node, etc.)", {"peer", "gone"}, {"oom"}),
    ("out of resource: shared memory, Required: 232448, Hardware limit: 101376", {"shm"}, {"shortmem", "alloc"}),
    ("Loaded 5 out of 10 shards (2.3 GiB)", {"mem"}, {"alloc", "shortmem"}),
    ("No supported CUDA architectures found for major versions [10].", {"arch", "unsupported"}, set()),
    ("gfx1151 is not supported by this build", {"arch", "unsupported"}, set()),
    ("Bfloat16 is only supported on GPUs with compute capability of at least 8.0", {"arch", "unsupported", "setting"},
     set()),
    ("Model architectures ['FooForCausalLM'] are not supported for now", {"model", "unsupported", "arch"}, set()),
    ("OPS function error: HcclAllreduce, error code is 6", {"ccl", "collective", "devcode", "failed"}, set()),
    ("Communication_Error_Get_Socket(EI0006): Getting socket times out.", {"ccl", "timeout"}, set()),
    ("[PG 0 Rank 0] Watchdog caught collective operation timeout", {"collective", "timeout"}, {"store"}),
    ("The node with node id: ab has been marked dead because the detector has missed too many heartbeats",
     {"peer", "gone"}, set()),
    ("[c10d] The client socket cannot connect to the store at head:29500: Connection refused",
     {"store", "conn", "netfail"}, set()),
    ("RuntimeError: Unable to initialize backend 'tpu': open(/dev/vfio/0): Device or resource busy", {"busy"}, set()),
    ("RuntimeError: synStatus=26 [Generic failure] Device acquire failed.", {"busy", "devcode", "failed"}, set()),
    ("fatal error: 'cstdint' file not found", {"missing", "failed"}, set()),
    ("Fatal Python error: Segmentation fault", {"crash", "failed"}, set()),
    ("self._spin_condition.wait(timeout_ms=read_timeout.timeout_ms())", set(), {"timeout", "failed"}),
    ("rank0 pid 946: init+first all_reduce in 0.8s; pg timeout default", {"collective"}, {"timeout"}),
    ("rank1 pid 821: init+first all_reduce in 0.6s; pg timeout 30.0; holding 8.0 GiB", {"collective"}, {"timeout"}),
    ("[PG 0 Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2)", {"timeout"}, set()),
    ("Get_Socket_Timeout(EI0006)", {"timeout"}, set()),
    ('INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK', set(), {"failed", "mem", "peer"}),
])
def test_a_concept_in_any_wording(text: str, held: set[str], not_held: set[str]) -> None:
    found = terms(text)
    assert held <= found and not not_held & found, sorted(found)


def test_every_concept_can_be_found_through_its_stems() -> None:
    """A concept is searched only when the text holds one of its stems: each stem is lower case, and every concept's
    pattern matches a text that holds one (else a wording would be lost to the cheap test)."""
    samples = {"oom": "OutOfMemory", "kv": "KV cache", "shortmem": "not enough memory", "mem": "memory",
               "alloc": "failed to allocate", "reserved": "but only 1000B is allocated for trace region",
               "shm": "/dev/shm", "hardkernel": "no kernel image", "arch": "sm_90",
               "unsupported": "not supported", "model": "ForCausalLM", "setting": "bfloat16", "ccl": "nccl",
               "gloo": "gloo", "store": "TCPStore", "conn": "socket", "netfail": "refused", "timeout": "timed out",
               "peer": "node", "gone": "died", "collective": "all_reduce", "inuse": "EADDRINUSE",
               "busy": "busy or unavailable", "devcode": "cudaErrorX", "fault": "illegal memory access",
               "lib": "undefined symbol", "driver": "driver", "missing": "not found", "crash": "SIGSEGV",
               "failed": "error"}
    assert set(samples) == {c.name for c in CONCEPTS}
    for concept in CONCEPTS:
        assert all(stem == stem.lower() for stem in concept.stems), concept.name
        assert concept.name in terms(samples[concept.name]), concept.name
