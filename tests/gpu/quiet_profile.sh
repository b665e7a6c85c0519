#!/usr/bin/env bash
# Where sparkd's CPU goes at rest on a quiet host (a lent GPU machine: 16 cores, no package index): idle_profile.py
# over a ready stand-in with the shipped defaults (NVML loaded where a driver is), its loop thread profiled and every
# thread's CPU by name.
#
#   GPU_PYTHON=/opt/torch/.venv/bin/python3 GPU_WHEELS=.whl bash tests/gpu/quiet_profile.sh
#
# The JSON lands in $SPARKD_GPU_OUT (default /tmp/gpurun).
set -euo pipefail
source "$(dirname "$0")/quiet_setup.sh"
"$py" tests/bench/idle_profile.py --settle 20 --seconds 60 --top 30 --json "$out/quiet-profile.json"
