# Sourced by quiet_footprint.sh and quiet_profile.sh (a lent GPU machine: no package index): installs
# tests/gpu/wheels.txt's wheels and supervisor from $GPU_WHEELS into .gpu-deps, puts sparkd, sparkctl, sparkd-standin
# and supervisord launchers beside $GPU_PYTHON (the benches find them beside their interpreter, as in a venv), and
# sets $py, $out and $repo.
py=${GPU_PYTHON:?set GPU_PYTHON to an interpreter}
wheels=${GPU_WHEELS:?set GPU_WHEELS to the wheels folder}
out=${SPARKD_GPU_OUT:-/tmp/gpurun}
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
