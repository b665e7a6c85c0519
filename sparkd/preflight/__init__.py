"""Preflight: every launch starts from a clean node with enough memory, or refuses with a reason.

One module per kind of check, each check a small async unit ``(ctx) -> CheckResult`` whose decision is a pure
function (tests/unit/test_preflight_decisions.py); :mod:`.runner` runs them in this order:

=================  ==============  =============================================================================
id                 module          fails with
=================  ==============  =============================================================================
container          drift           config_error: an existing container differs from [container]; fork in image ENV
launch_target      target          config_error: target, device or local model path (config.json, shards) missing
vllm_args          vllm_args       config_error: vLLM's own parser rejects the rendered argv
stale_processes    processes       gpu_busy: an orphaned VLLM::* / previous-launch process outlives SIGKILL
ports              ports           port_in_use: API/master port held by anything but a stale vLLM process
dev_shm            shm             unknown: /dev/shm has less room than [preflight] shm_min_free_mib
page_cache         memory          never (cannot drop → warn)
memory             memory          free_memory_refusal: MemFree < gpu_memory_utilization x MemTotal + margin
host               host            unknown: [preflight] apply_host set and the settings would not stick
image              image           config_error: a [[preflight.assert]] does not hold where vLLM runs
rdma               rdma            nccl: a named HCA missing or down; config_error: no /dev/infiniband, memlock,
                                   NCCL_IB_GID_INDEX not the RoCE v2 GID of the fabric address
gpu                gpu             gpu_busy: a compute process that is not a stale vLLM holds a launch's GPU
=================  ==============  =============================================================================

Before a group's start the head also proves the fabric and the weights on every node (not checks of this
runner: ``sparkd/cluster/fabric_check.py``, ``sparkd/cluster/weights.py``); their parts that read this node live
here: ``netdev``, ``dfping``, ``gid``, ``manifest``, ``ioprio``, ``weights_local``, ``weights_verify``.

Checks that look where vLLM runs (in its container, or on the host) ask the runtime: ``ctx.runtime.where``,
``exec``, ``read_file``, ``missing_target`` (sparkd/runtime/base.py).
"""
