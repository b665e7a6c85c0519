#!/usr/bin/env bash
# sparkd at rest on a quiet host (a lent GPU machine: 16 cores, no package index), beside supervisord and earlyoom, and
# beside an earlier tree's sparkd in the same window: bench_footprint.py's features and footprint phases.
#
#   GPU_PYTHON=/opt/torch/.venv/bin/python3 GPU_WHEELS=.whl bash tests/gpu/quiet_footprint.sh [AGAINST_TREE]
#
# GPU_WHEELS holds tests/gpu/wheels.txt's wheels, supervisor's, and bin/earlyoom (a binary that needs only libc);
# AGAINST_TREE a folder holding another commit's sparkd/ (`git archive <commit> sparkd | tar -x -C TREE`).
# The interpreter's folder gets sparkd, sparkctl, sparkd-standin and supervisord launchers (the bench finds them
# beside its interpreter, as in a venv); the JSON lands in $SPARKD_GPU_OUT (default /tmp/gpurun). STANDIN_THREADS=N:
# every stand-in process keeps N idle threads, as a real vLLM's keep torch's, NCCL's and CUDA's pools.
# FOOTPRINT_SECONDS=N: the footprint window (default 60).
set -euo pipefail
against=${1:-}
source "$(dirname "$0")/quiet_setup.sh"
args=(--phases features,footprint --seconds "${FOOTPRINT_SECONDS:-60}" --json "$out/quiet-footprint.json")
if [ -n "${STANDIN_THREADS:-}" ]; then args+=(--standin-threads "$STANDIN_THREADS"); fi
if [ -n "$against" ]; then args+=(--against "$repo/$against"); fi
"$py" tests/bench/bench_footprint.py "${args[@]}"
