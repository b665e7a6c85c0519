"""Preflight: every launch starts from a clean node with enough memory, or refuses with a reason.

One module per check, named by the check's id (``sparkd/preflight/gpu.py`` is the check ``gpu``), each a small
async unit ``(ctx) -> CheckResult`` under ``@check`` whose decision is a pure function
(tests/unit/test_preflight_decisions.py); its docstring says what it checks and what it fails with. They run in the
order of ``sparkd.config.supervision.PREFLIGHT_CHECKS`` (:mod:`.runner` loads them from it; ``[preflight] skip`` and
``sparkd preflight --check`` take the same ids): the container, the launch target, vLLM's parse of the argv, then
the cleanup (stale processes, ports, /dev/shm), the page cache and memory, the host, the image, RDMA and the GPUs.
A new check is its module and one line in that list. Modules not in the list (``processes``, ``shm``, ``target``,
``holders``, ...) hold what the checks and the stop sweep share.

Before a group's start the head also proves the fabric and the weights on every node (not checks of this
runner: ``sparkd/cluster/fabric_check.py``, ``sparkd/cluster/weights.py``); their parts that read this node live
here: ``netdev``, ``dfping``, ``gid``, ``manifest``, ``ioprio``, ``weights_local``, ``weights_verify``.

Checks that look where vLLM runs (in its container, or on the host) ask the runtime: ``ctx.runtime.where``,
``exec``, ``read_file``, ``missing_target`` (sparkd/runtime/base.py).
"""
