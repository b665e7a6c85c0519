#!/usr/bin/env bash
# sparkd at rest on a quiet host (a lent GPU machine: 16 cores, no package index), beside supervisord and earlyoom, and
# beside an earlier tree's sparkd in the same window: bench_footprint.py's features and footprint phases.
#
#   GPU_PYTHON=/opt/torch/.venv/bin/python3 GPU_WHEELS=.whl bash tests/gpu/quiet_footprint.sh [AGAINST_TREE]
#
# GPU_WHEELS holds tests/gpu/wheels.txt's wheels, supervisor's, and bin/earlyoom (a binary that needs only libc);
# AGAINST_TREE a folder holding another commit's sparkd/ (`git archive <commit> sparkd | tar -x -C TREE`).
# The interpreter's folder gets sparkd, sparkctl, sparkd-standin and supervisord launchers (the bench finds them
# beside its interpreter, as in a venv); the JSON lands in $SPARKD_GPU_OUT (default /tmp/gpurun).
set -euo pipefail
py=${GPU_PYTHON:?set GPU_PYTHON to an interpreter}
wheels=${GPU_WHEELS:?set GPU_WHEELS to the wheels folder}
out=${SPARKD_GPU_OUT:-/tmp/gpurun}
against=${1:-}
repo=$(pwd)
mkdir -p "$out"
"$py" -m pip install --quiet --no-index --find-links "$wheels" --target .gpu-deps -r tests/gpu/wheels.txt supervisor
export PYTHONPATH="$repo:$repo/.gpu-deps:$repo/standin"
export PATH="$repo/$wheels/bin:$(dirname "$py"):$PATH"
bin=$(dirname "$py")
launcher() {  # name, module
    printf '#!/bin/sh\nexec %s -c "import sys; sys.argv[0] = %s; from %s import main; sys.exit(main())" "$@"\n' \
        "$py" "'$1'" "$2" > "$bin/$1"
    chmod +x "$bin/$1"
}
launcher sparkd sparkd.cli.sparkd
launcher sparkctl sparkd.cli.ctl
launcher sparkd-standin sparkd_standin.__main__
launcher supervisord supervisor.supervisord
echo "host: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
args=(--phases features,footprint --seconds 60 --json "$out/quiet-footprint.json")
if [ -n "$against" ]; then args+=(--against "$repo/$against"); fi
"$py" tests/bench/bench_footprint.py "${args[@]}"
