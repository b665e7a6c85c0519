"""What a rehearsal is: the node's real launch with vLLM's stand-in in its place.

``sparkd run --rehearse`` supervises the configured launch exactly as configured — same flags, same environment,
same runtime, same preflight — except that the program is ``sparkd-standin`` (the separate ``sparkd-standin``
distribution, installed next to sparkd), which accepts ``vllm serve``'s flags, logs, serves and fails like vLLM,
and needs no GPU and no weights. Two things follow, and nothing else in sparkd knows about the stand-in:

- ``rehearsal(spec)``: the launch spec with the program swapped, the ``vllm``-style arguments kept;
- ``REHEARSAL_SKIPS``: the preflight checks a rehearsal does not run, each for a reason below. The daemon passes
  them to preflight through the context (``PreflightContext.skip``), as an operator would list them in
  ``[preflight] skip``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from sparkd.launch.program import executable, which
from sparkd.launch.render import LaunchSpec

STANDIN = "sparkd-standin"  # the stand-in's console script
STANDIN_PACKAGE = "sparkd_standin"

# The stand-in loads no weights and takes no GPU memory, so the checks that make room for vLLM's memory would
# only drop a node's page cache (and refuse a start on a small test machine) for nothing:
#   memory      - "enough free memory for gpu_memory_utilization": the stand-in needs a few hundred MiB;
#   page_cache  - "sync and drop caches before the load": there is no load to make room for;
#   vllm_args   - "the serving vLLM parses the argv": the stand-in is not vLLM (it has its own parser).
# Everything else (the launch target, stale processes, ports, /dev/shm, the host, the container) is the node's
# real state and is checked as for vLLM.
REHEARSAL_SKIPS: frozenset[str] = frozenset({"memory", "page_cache", "vllm_args"})
SKIP_REASON = "a rehearsal: the vLLM stand-in loads no weights and takes no GPU memory"


def standin_executable() -> str:
    """The installed ``sparkd-standin``: next to this interpreter (sparkd's venv), else on PATH, else its bare
    name, which preflight's launch-target check then reports as not on PATH."""
    beside = Path(sys.executable).parent / STANDIN
    if executable(beside):
        return str(beside)
    return which(STANDIN) or STANDIN


def rehearsal(spec: LaunchSpec, executable: str | None = None) -> LaunchSpec:
    """The same launch with the stand-in in place of vLLM: same arguments after the program, same environment.

    ``vllm serve MODEL --flags`` becomes ``sparkd-standin serve MODEL --flags``; a script launch
    (``bash SCRIPT ARGS``) runs the stand-in with the script's arguments.
    """
    argv = spec.argv
    rest = argv[2:] if argv[0] == "bash" else argv[1:]
    return LaunchSpec(argv=(executable or standin_executable(), *rest), env=dict(spec.env),
                      config_hash=spec.config_hash, env_edits=spec.env_edits, probe_dir=spec.probe_dir)


def rehearsal_skips() -> Mapping[str, str]:
    """``REHEARSAL_SKIPS`` with their reason, as ``PreflightContext.skip`` takes them."""
    return dict.fromkeys(sorted(REHEARSAL_SKIPS), SKIP_REASON)


def standin_source_root() -> str | None:
    """The directory holding the installed ``sparkd_standin`` package (its checkout for an editable install),
    which a rehearsal in a container needs mounted at the same place; None when it is not installed."""
    found = importlib.util.find_spec(STANDIN_PACKAGE)
    if found is None or not found.origin:
        return None
    return str(Path(found.origin).resolve().parent.parent)
