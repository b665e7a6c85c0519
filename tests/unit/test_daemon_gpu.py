"""The daemon's stops and GPUs over the real loop (tests/unit/loop_harness.py): a stop that answers a wedge gets
`hung_stop_grace_s`, a stop that had to SIGKILL says so in the status, the incident and vLLM's log, and a stop
whose GPU memory does not come back keeps the node from launching into it (`gpu_error`)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from loop_harness import config, running

from sparkd.host.gpu import nvml
from sparkd.host.gpu.fake import FakeDevice, FakeNvml
from sparkd.host.gpu.model import GpuView
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio


def wedge(cls: FailureClass) -> v.HealthFailed:
    return v.HealthFailed(Failure.of(cls, f"vLLM is wedged ({cls.value})"))


@pytest.mark.parametrize("cls", [FailureClass.hang, FailureClass.stall, FailureClass.peer_lost])
async def test_a_wedged_vllm_is_stopped_with_the_hung_grace(tmp_path: Path, cls: FailureClass) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = config(tmp_path, supervisor={"stop_grace_s": 90, "hung_stop_grace_s": 4})
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        proc = runtime.current
        assert proc is not None
        proc.ignores_sigterm = True  # a rank spinning in a collective: its SIGTERM handler never runs
        node.daemon.sup.post(wedge(cls))
        await node.until_state("backoff")
        await node.settled()
        assert runtime.stops == [(proc.instance.pid, 4.0)]
        stop = node.status()["last_stop"]
        assert stop["sigkilled"] and stop["killed"] == [proc.instance.pid]
        assert stop["grace_from"] == f"hung_stop_grace_s: vLLM was wedged ({cls.value})"
        assert "SIGKILL to PID" in stop["sentence"]
        (incident,) = (tmp_path / "state" / "incidents").iterdir()
        with anyio.fail_after(10):  # attached beside the loop once the incident is written (a worker thread)
            while not (incident / "stop.json").exists():
                await anyio.sleep(0.01)
        assert json.loads((incident / "stop.json").read_text())["killed"] == [proc.instance.pid]
        assert json.loads((incident / "incident.json").read_text())["stop"]["grace_s"] == 4.0
        assert node.daemon.vllm_log.last(1)[0].startswith("---- sparkd: stop (health failed): SIGTERM, SIGKILL to")


async def test_a_rank_whose_peer_died_is_stopped_with_the_hung_grace(tmp_path: Path) -> None:
    """The head hears that the worker's rank is gone (an oom there, say): its own rank spins in the next collective
    (the H100 runs), whatever class the worker's failure has."""
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = config(tmp_path, supervisor={"stop_grace_s": 90, "hung_stop_grace_s": 4})
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        pid = runtime.current.instance.pid if runtime.current else 0
        worker = Failure.of(FailureClass.oom, "The worker on 10.0.0.2: its rank is gone: CUDA out of memory")
        node.daemon.sup.post(v.HealthFailed(worker, hung=True))
        await node.until_state("backoff")
        await node.settled()
        assert runtime.stops == [(pid, 4.0)]
        assert node.status()["last_stop"]["grace_from"] == "hung_stop_grace_s: its peer rank is gone"


async def test_an_operator_stop_keeps_the_drain_grace(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = config(tmp_path, supervisor={"stop_grace_s": 90, "hung_stop_grace_s": 4})
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        pid = runtime.current.instance.pid if runtime.current else 0
        node.daemon.sup.post(v.StopRequested())
        await node.until_state("stopped")
        await node.settled()
        assert runtime.stops == [(pid, 210.0)]
        stop = node.status()["last_stop"]
        assert not stop["sigkilled"] and stop["reason"] == "operator stop"
        assert stop["grace_from"] == "drain_s 120 s + stop_grace_s 90 s" and stop["kind"] == "drain"


class StuckGpu:
    """NVML answering that the stopped instance's PID still holds GPU 0 (a process stuck in the driver)."""

    def __init__(self) -> None:
        self.device = FakeDevice("GPU-3ac5e21a-4914-422b-8ff7-2a21823187de")
        self.reader = nvml.NvmlReader(FakeNvml([self.device]))

    async def __call__(self) -> GpuView:
        return self.reader.read()


async def test_gpu_memory_that_does_not_come_back_stops_the_next_launch(tmp_path: Path) -> None:
    runtime, clock, gpu = FakeRuntime(), FakeClock(), StuckGpu()
    cfg = config(tmp_path, supervisor={"gpu_release_timeout_s": 3}, restart={"backoff_initial_s": 1})
    async with running(cfg, runtime, clock, gpus=gpu) as node:
        await node.until_state("ready")
        pid = runtime.current.instance.pid if runtime.current else 0
        gpu.device.processes[pid] = 20 * 2**30  # the instance holds 20 GiB, and keeps it after its death
        node.daemon.sup.post(wedge(FailureClass.hang))
        await node.until(lambda: node.status()["last_failure"]["class"] == "gpu_error")
        assert len(runtime.launches) == 1  # not launched into the held memory
        failure = node.status()["last_failure"]["message"]
        assert "still held" in failure and f"PID {pid}" in failure and "reboot" in failure
        assert node.status()["last_stop"]["released"] is False
        del gpu.device.processes[pid]  # the driver let go (or the node was rebooted)
        await node.until(lambda: len(runtime.launches) == 2)


async def test_gpu_memory_that_comes_back_is_verified_and_said(tmp_path: Path) -> None:
    runtime, clock, gpu = FakeRuntime(), FakeClock(), StuckGpu()
    async with running(config(tmp_path), runtime, clock, gpus=gpu) as node:
        await node.until_state("ready")
        node.daemon.sup.post(v.StopRequested())
        await node.until_state("stopped")
        await node.settled()
        stop = node.status()["last_stop"]
        assert stop["released"] is True and "GPU memory of the stopped processes is back" in stop["release"]
