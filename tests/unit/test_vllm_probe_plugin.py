"""The sparkd-vllm-probe plugin against a vLLM in miniature: the three classes it wraps, laid out as vLLM 0.32 lays
them out, in a child interpreter that has only the plugin's directory and the fake on its path (as a container has
the mounted plugin and the image's vLLM). The real vLLM 0.32 is the real-vLLM tier's (tests/realvllm/test_probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkd.host.stepfiles import read_steps
from sparkd.vllm_probe import PLUGIN_DIR

FAKE_VLLM = {
    "vllm/__init__.py": '__version__ = "0.32.0"\n',
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/executor/__init__.py": "",
    "vllm/v1/engine/core.py": """
        import enum, logging, queue

        class EngineShutdownState(enum.IntEnum):
            RUNNING = 0
            REQUESTED = 1
            SHUTTING_DOWN = 2

        class EngineCoreRequestType(enum.Enum):
            ADD = b"\\x00"
            ABORT = b"\\x01"
            UTILITY = b"\\x03"
            WAKEUP = b"\\x05"

        class Scheduler:
            def __init__(self):
                self.running, self.waiting = [1, 2], [3]

        class EngineCore:
            def __init__(self):
                self.scheduler = Scheduler()
                self.steps = 0

            def step(self):
                self.steps += 1
                return {}, True

        class UniProcExecutor:
            def __init__(self):
                from vllm.v1.worker.worker_base import WorkerWrapperBase
                self.driver_worker = WorkerWrapperBase(sample_later=False)

        class VllmConfig:
            def __init__(self, shutdown_timeout):
                self.shutdown_timeout = shutdown_timeout

        class EngineCoreProc(EngineCore):
            def __init__(self, engine_index=0, uniproc=False, shutdown_timeout=120):
                super().__init__()
                self.engine_index = engine_index
                if uniproc:
                    self.model_executor = UniProcExecutor()
                self.vllm_config = VllmConfig(shutdown_timeout)
                self.shutdown_state = EngineShutdownState.RUNNING
                self.input_queue = queue.Queue()
                self.added, self.rejected, self.utilities = [], [], []

            # vLLM 0.32's drain (vllm/v1/engine/core.py), reduced: the state moves on, what comes later is rejected
            def _handle_shutdown(self):
                if self.shutdown_state == EngineShutdownState.REQUESTED:
                    logging.getLogger("vllm").info("draining count=%d", len(self.added))
                    self.shutdown_state = EngineShutdownState.SHUTTING_DOWN
                return True

            def _handle_client_request(self, request_type, request):
                if request_type == EngineCoreRequestType.ADD:
                    if self.shutdown_state != EngineShutdownState.RUNNING:
                        self.rejected.append(request)
                        return
                    self.added.append(request)
                elif request_type == EngineCoreRequestType.UTILITY:
                    shutting = self.shutdown_state != EngineShutdownState.RUNNING
                    self.utilities.append(f"{request} {'rejected' if shutting else 'run'}")

            def _process_input_queue(self):
                while not self.input_queue.empty():
                    self._handle_client_request(*self.input_queue.get_nowait())

            def _process_engine_step(self):
                return self.step()[1]

            def run_busy_loop(self, steps=3):
                for _ in range(steps):
                    self._process_engine_step()

        class DPEngineCoreProc(EngineCoreProc):
            def run_busy_loop(self, steps=3):
                return super().run_busy_loop(steps)
    """,
    "vllm/v1/worker/worker_base.py": """
        class Worker:
            def __init__(self, sample_later):
                self.sample_later = sample_later

            def execute_model(self, scheduler_output):
                if scheduler_output.total_num_scheduled_tokens == -5:
                    raise RuntimeError("vLLM's own failure")
                return None if self.sample_later else "output"

            def sample_tokens(self, grammar_output):
                return "sampled"

        class WorkerWrapperBase:
            def __init__(self, rpc_rank=0, global_rank=None, sample_later=True):
                self.rpc_rank = rpc_rank
                self.global_rank = rpc_rank if global_rank is None else global_rank
                self.worker = Worker(sample_later)

            def __getattr__(self, attr):
                return getattr(self.worker, attr)

            def execute_model(self, scheduler_output):
                return self.worker.execute_model(scheduler_output)
    """,
    "vllm/v1/executor/multiproc_executor.py": """
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        class WorkerProc:
            def __init__(self, rank):
                self.rank = rank
                self.worker = WorkerWrapperBase(rpc_rank=rank, global_rank=rank)

            def worker_busy_loop(self):
                return "looping"
    """,
}
PRELUDE = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
class SO:
    def __init__(self, tokens):
        self.total_num_scheduled_tokens = tokens
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "fake"
    for name, text in FAKE_VLLM.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def child(fake: Path, probe: Path | None, code: str, *, admit: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARKD_PROBE_DIR", "SPARKD_DRAIN_ADMIT")}
    env["PYTHONPATH"] = f"{PLUGIN_DIR}:{fake}"
    if probe is not None:
        env["SPARKD_PROBE_DIR"] = str(probe)
    if admit:
        env["SPARKD_DRAIN_ADMIT"] = "1"
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=fake, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def records(probe: Path) -> dict[str, object]:
    return {f"{r.role}-{r.rank}": r for r in read_steps(probe).records}


def test_vllm_finds_the_plugin_by_its_entry_point(fake_vllm: Path) -> None:
    out = child(fake_vllm, None, """
        from importlib.metadata import entry_points
        print(json.dumps([(e.name, e.value) for e in entry_points(group="vllm.general_plugins")]))
    """)
    assert ["sparkd_probe", "sparkd_vllm_probe:register"] in json.loads(out.stdout)


def test_modules_imported_after_the_plugin_loads_are_wrapped_as_they_import(fake_vllm: Path, tmp_path: Path) -> None:
    """vLLM's API server loads plugins before it imports the engine; its forked children inherit the wrapping."""
    probe = tmp_path / "probe"
    probe.mkdir()
    out = child(fake_vllm, probe, """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        assert "vllm.v1.engine.core" not in sys.modules
        from vllm.v1.engine.core import DPEngineCoreProc, EngineCoreProc
        from vllm.v1.executor.multiproc_executor import WorkerProc
        EngineCoreProc().run_busy_loop(3)
        DPEngineCoreProc(engine_index=1).run_busy_loop(2)
        proc = WorkerProc(rank=1)
        assert proc.worker_busy_loop() == "looping"
        assert proc.worker.execute_model(SO(5)) is None  # vLLM samples in the next call
        print(json.dumps(not any(isinstance(f, type) for f in sys.meta_path if "PatchOnImport" in type(f).__name__)))
    """)
    seen = records(probe)
    assert set(seen) == {"engine-0", "engine-1", "worker-1"}
    e0, e1, w1 = seen["engine-0"], seen["engine-1"], seen["worker-1"]
    assert (e0.step, e0.phase, e0.held) == (3, "idle", 3)  # type: ignore[attr-defined]
    assert e1.step == 2  # type: ignore[attr-defined]
    assert (w1.step, w1.phase, w1.tokens) == (1, "idle", 5)  # type: ignore[attr-defined]  (its part is done)
    assert "sparkd probe: recording engine 0's steps in" in out.stderr
    assert out.stdout.strip() == "true"  # the finder left sys.meta_path once its three modules were wrapped


def test_a_module_already_imported_is_wrapped_at_once_and_a_forked_child_records_its_own(fake_vllm: Path,
                                                                                          tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    child(fake_vllm, probe, """
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        import vllm.v1.engine.core, vllm.v1.executor.multiproc_executor
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        sparkd_vllm_probe.register()  # vLLM may call it again in the same process: once is enough
        pid = os.fork()
        if pid == 0:
            w = WorkerWrapperBase(rpc_rank=0, global_rank=2)
            for tokens in (7, 1, 1):
                w.execute_model(SO(tokens))
                assert w.sample_tokens(None) == "sampled"  # vLLM's own forwarding, untouched
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid)
    """)
    w2 = records(probe)["worker-2"]
    assert (w2.step, w2.phase, w2.last_tokens, w2.longest_tokens) == (3, "idle", 1, w2.longest_tokens)  # type: ignore[attr-defined]
    assert w2.pid != os.getpid()  # type: ignore[attr-defined]


def test_one_gpus_rank_in_the_engine_core_has_its_file_once_the_engine_serves(fake_vllm: Path,
                                                                              tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    child(fake_vllm, probe, """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        import vllm.v1.worker.worker_base
        from vllm.v1.engine.core import EngineCoreProc
        EngineCoreProc(uniproc=True).run_busy_loop(0)
    """)
    seen = records(probe)
    assert set(seen) == {"engine-0", "worker-0"} and seen["worker-0"].step == 0  # type: ignore[attr-defined]


def test_a_forked_childs_failure_leaves_its_parents_file_alone(fake_vllm: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    child(fake_vllm, probe, """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        from vllm.v1.engine.core import EngineCoreProc
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        EngineCoreProc().run_busy_loop(2)
        pid = os.fork()
        if pid == 0:
            WorkerWrapperBase(sample_later=False).execute_model(SO("not a count"))
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    seen = records(probe)
    assert seen["engine-0"].phase == "idle" and seen["engine-0"].step == 2  # type: ignore[attr-defined]
    assert seen["worker-0"].phase == "off"  # type: ignore[attr-defined]


def test_vllms_own_exception_passes_through_and_ends_the_step(fake_vllm: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    child(fake_vllm, probe, """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        w = WorkerWrapperBase(sample_later=False)
        assert w.execute_model(SO(2)) == "output"
        try:
            w.execute_model(SO(-5))
        except RuntimeError as exc:
            assert str(exc) == "vLLM's own failure"
        else:
            raise AssertionError("swallowed")
    """)
    w0 = records(probe)["worker-0"]
    assert (w0.step, w0.phase) == (2, "idle")  # type: ignore[attr-defined]


def test_a_failure_of_the_probe_turns_it_off_once_and_vllm_runs_on(fake_vllm: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    out = child(fake_vllm, probe, """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        w = WorkerWrapperBase(sample_later=False)
        assert w.execute_model(SO(2)) == "output"
        assert w.execute_model(SO("not a count")) == "output"  # the probe's own store fails: vLLM's call stands
        assert w.execute_model(SO(3)) == "output"
        assert "execute_model" not in WorkerWrapperBase.__dict__ or WorkerWrapperBase.execute_model.__module__ == \\
            "vllm.v1.worker.worker_base"
    """)
    w0 = records(probe)["worker-0"]
    assert w0.phase == "off" and "a worker step's beginning failed" in w0.note  # type: ignore[attr-defined]
    assert w0.step == 2  # type: ignore[attr-defined]  (the step it turned off in)
    warnings = [line for line in out.stderr.splitlines() if line.startswith("WARNING vllm.sparkd_probe")]
    assert len(warnings) == 1 and "turned off in this process" in warnings[0] and "vLLM runs on" in warnings[0]


def test_without_a_probe_directory_nothing_is_wrapped(fake_vllm: Path, tmp_path: Path) -> None:
    code = """
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
        import vllm.v1.engine.core as core
        print(json.dumps("_sparkd_probe" in core.EngineCoreProc.__dict__))
    """
    out = child(fake_vllm, None, code)
    assert out.stdout.strip() == "false" and "sparkd probe" not in out.stderr
    out = child(fake_vllm, tmp_path / "missing", code)
    assert out.stdout.strip() == "false"
    assert "sparkd probe: off: SPARKD_PROBE_DIR=" in out.stderr and "is not a directory this process may" in out.stderr


def test_a_vllm_without_the_step_method_says_so_once(fake_vllm: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    core = fake_vllm / "vllm/v1/engine/core.py"
    core.write_text(core.read_text().replace("_process_engine_step", "_other_step"))
    out = child(fake_vllm, probe, """
        import vllm.v1.engine.core
        import sparkd_vllm_probe
        sparkd_vllm_probe.register()
    """)
    assert out.stderr.count("sparkd probe: turned off in this process (this vLLM has no "
                            "EngineCoreProc._process_engine_step") == 1


# A SIGTERM came during a step: two requests the API server had answered 200 wait in the engine core's input queue,
# with a wakeup; the engine core turns to the shutdown, then to its queue, as vLLM 0.32's busy loop does.
DRAIN_TURN = """
    import vllm.v1.engine.core as core
    from sparkd_vllm_probe import register
    register()
    def turn(engine):
        engine.input_queue.put((core.EngineCoreRequestType.ADD, ("a", 0)))
        engine.input_queue.put((core.EngineCoreRequestType.WAKEUP, None))
        engine.input_queue.put((core.EngineCoreRequestType.UTILITY, "sleep"))
        engine.input_queue.put((core.EngineCoreRequestType.ADD, ("b", 0)))
        engine.shutdown_state = core.EngineShutdownState.REQUESTED
        engine._handle_shutdown()
        engine.input_queue.put((core.EngineCoreRequestType.ADD, ("late", 0)))  # sent after the drain began
        engine._process_input_queue()
        return {"added": engine.added, "rejected": engine.rejected, "utilities": engine.utilities,
                "state": engine.shutdown_state.name}
"""


@pytest.mark.parametrize("probe", [False, True])
def test_a_drain_takes_in_the_requests_vllm_accepted_before_its_sigterm(fake_vllm: Path, tmp_path: Path,
                                                                       probe: bool) -> None:
    """With or without the step probe: the two queued requests are drained (counted by vLLM's drain), the one sent
    after the drain began is rejected as vLLM does, and so is a utility call queued between them (a sleep would
    take the weights the drain needs); while vLLM serves nothing changes."""
    out = child(fake_vllm, tmp_path if probe else None, textwrap.dedent(DRAIN_TURN) + textwrap.dedent("""
        print(json.dumps(turn(core.EngineCoreProc())))
        serving = core.EngineCoreProc()
        serving.input_queue.put((core.EngineCoreRequestType.ADD, ("c", 0)))
        serving._handle_shutdown()
        print(json.dumps(serving.input_queue.qsize()))
    """), admit=True)
    lines = out.stdout.splitlines()
    assert json.loads(lines[0]) == {"added": [["a", 0], ["b", 0]], "rejected": [["late", 0]],
                                    "utilities": ["sleep rejected"], "state": "SHUTTING_DOWN"}
    assert json.loads(lines[1]) == 1  # a serving engine core's queue is its own business
    assert "sparkd drain: took in 2 request(s) accepted before the SIGTERM" in out.stderr
    assert "draining count=2" in out.stderr


@pytest.mark.parametrize(("admit", "timeout"), [(False, 120), (True, 0)])
def test_without_the_launchs_ask_or_with_an_abort_vllm_drops_them_as_it_does(fake_vllm: Path, admit: bool,
                                                                            timeout: int) -> None:
    out = child(fake_vllm, None, textwrap.dedent(DRAIN_TURN) + textwrap.dedent(f"""
        print(json.dumps(turn(core.EngineCoreProc(shutdown_timeout={timeout}))))
    """), admit=admit)
    assert json.loads(out.stdout) == {"added": [], "rejected": [["a", 0], ["b", 0], ["late", 0]],
                                      "utilities": ["sleep rejected"], "state": "SHUTTING_DOWN"}
    assert "sparkd drain" not in out.stderr


def test_a_failure_of_the_admission_puts_vllms_drain_back_once(fake_vllm: Path) -> None:
    out = child(fake_vllm, None, textwrap.dedent(DRAIN_TURN) + textwrap.dedent("""
        broken = core.EngineCoreProc()
        del broken.input_queue  # another vLLM's engine core
        broken.shutdown_state = core.EngineShutdownState.REQUESTED
        assert broken._handle_shutdown() is True and broken.shutdown_state.name == "SHUTTING_DOWN"
        print(json.dumps(turn(core.EngineCoreProc())))
    """), admit=True)
    assert json.loads(out.stdout)["rejected"] == [["a", 0], ["b", 0], ["late", 0]]
    assert out.stderr.count("sparkd drain: turned off (AttributeError(") == 1, out.stderr


def test_a_vllm_without_the_drain_says_so_once_and_runs_on(fake_vllm: Path) -> None:
    core = fake_vllm / "vllm/v1/engine/core.py"
    core.write_text(core.read_text().replace("def _handle_shutdown(self):", "def _handle_shutdown_elsewhere(self):"))
    out = child(fake_vllm, None, """
        from sparkd_vllm_probe import register
        register()
        import vllm.v1.engine.core as core
        print(json.dumps(hasattr(core.EngineCoreProc, "_handle_shutdown")))
    """, admit=True)
    assert json.loads(out.stdout) is False
    assert out.stderr.count("sparkd drain: this vLLM has no EngineCoreProc._handle_shutdown") == 1
