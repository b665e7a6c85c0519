"""The GPU decisions, pure: which devices a launch uses, vLLM's free-memory rule per device, the host's own need,
the release after a stop, power as a wedge's evidence, the GPU metrics and the stop's report. Fed with the real
H100 readings in tests/data/gpu/."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from sparkd.config import config_from_mapping
from sparkd.daemon.views.gpumetrics import gpu_families
from sparkd.guard.meminfo import MemInfo, parse_meminfo
from sparkd.host.gpu import memcheck, power, release
from sparkd.host.gpu.model import GpuDevice, GpuProcess, GpuView
from sparkd.host.gpu.reading import devices_of_launch, pick
from sparkd.launch.devices import Devices, launch_devices
from sparkd.launch.render import render
from sparkd.preflight import gpumemory
from sparkd.preflight.base import Verdict
from sparkd.preflight.processes import launch_title_prefix
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.stopreport import StopReport

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
GIB = 1 << 30


def view(name: str) -> GpuView:
    data = json.loads((DATA / name).read_text())
    return GpuView.from_json(data.get("view", data))


IDLE, SURVIVOR = view("h100x2-nvml-idle.json"), view("h100x2-incident-gpu.json")


# ---- the launch's devices among a reading (which GPUs a launch uses: sparkd.launch.devices) ---------------------


def test_the_launchs_devices_among_a_real_reading() -> None:
    on_1 = launch_devices({"CUDA_VISIBLE_DEVICES": "1"}, container=False)
    assert [d.index for d in pick(on_1, IDLE.devices)] == [1]
    assert [d.index for d in pick(launch_devices({}, container=False), IDLE.devices)] == [0, 1]
    by_uuid = launch_devices({"CUDA_VISIBLE_DEVICES": "GPU-17fcf1a3"}, container=False)
    assert [d.index for d in pick(by_uuid, IDLE.devices)] == [1]
    # in a container of host GPU 1, CUDA's device 0 is host GPU 1
    inner = launch_devices({"CUDA_VISIBLE_DEVICES": "0"}, container=True, gpus="device=1")
    assert [d.index for d in pick(inner, IDLE.devices)] == [1]


@pytest.mark.parametrize(("runtime", "host_env", "launch_env", "container_env", "selected", "prefix"), [
    # the process runtime's vLLM inherits sparkd's own environment (a systemd unit's Environment=)
    ("process", {"CUDA_VISIBLE_DEVICES": "1", "VLLM_PROCESS_NAME_PREFIX": "UNIT"}, {}, {}, [1], "UNIT::"),
    ("process", {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0"}, {}, [0], "VLLM::"),  # the script wins
    ("process", {}, {}, {"CUDA_VISIBLE_DEVICES": "1", "VLLM_PROCESS_NAME_PREFIX": "BOX"}, [0, 1], "VLLM::"),
    # a container's vLLM gets [container] env, never sparkd's own
    ("docker-run", {"CUDA_VISIBLE_DEVICES": "1", "VLLM_PROCESS_NAME_PREFIX": "UNIT"}, {}, {}, [0, 1], "VLLM::"),
    ("docker-exec", {}, {}, {"CUDA_VISIBLE_DEVICES": "1", "VLLM_PROCESS_NAME_PREFIX": "BOX"}, [1], "BOX::"),
])
def test_the_launchs_environment_is_the_one_vllm_starts_with(runtime: str, host_env: dict[str, str],
                                                             launch_env: dict[str, str],
                                                             container_env: dict[str, str], selected: list[int],
                                                             prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config_from_mapping({"runtime": runtime, "node": {"name": "n", "role": "single"},
                               "launch": {"model": "m", "env": launch_env, "default_env": False},
                               "container": {"image": "i", "env": container_env}}, env={})
    env = render(cfg).env
    assert [d.index for d in pick(devices_of_launch(cfg, runtime, env, host_env), IDLE.devices)] == selected
    monkeypatch.setattr("os.environ", host_env)
    assert launch_title_prefix(cfg, runtime, env) == prefix


# ---- vLLM's rule per device, and the host's own need ------------------------------------------------------------


def meminfo(total_gib: float, avail_gib: float) -> MemInfo:
    """The H100 host's real /proc/meminfo (tests/data/gpu), with MemTotal, MemFree and MemAvailable set."""
    kib = 1 << 20
    lines = []
    for line in (DATA / "h100x2-meminfo.txt").read_text().splitlines():
        key = line.split(":")[0]
        value = {"MemTotal": total_gib, "MemFree": avail_gib, "MemAvailable": avail_gib}.get(key)
        lines.append(line if value is None else f"{key}: {int(value * kib)} kB")
    return parse_meminfo("\n".join(lines) + "\n")


def test_a_free_h100_passes_vllms_rule() -> None:
    verdict, found = gpumemory.assess(IDLE.devices[1:], 0.9, {}, meminfo(251.8, 250.0), [], 2 * GIB)
    assert verdict is Verdict.ok
    assert found == ("GPU 1 (NVIDIA H100 80GB HBM3): free 79.2 GiB covers 0.90 x total 79.6 GiB = 71.7 GiB; "
                     "host MemAvailable 250.0 GiB covers 2.0 GiB margin")


def test_a_held_device_fails_naming_its_holder() -> None:
    """The real survivor (PID 946, 9.5 GiB on GPU 0): 0.9 x 79.6 GiB is more than GPU 0 has free."""
    verdict, found = gpumemory.assess(SURVIVOR.devices[:1], 0.9, {946: "VLLM::Worker_TP0"}, meminfo(251.8, 250),
                                      [], 2 * GIB)
    assert verdict is Verdict.fail
    assert found.startswith("GPU 0 (NVIDIA H100 80GB HBM3) [GPU-3ac5e21a-4914-422b-8ff7-2a21823187de]: free 69.6 "
                            "GiB is 2.1 GiB short of 0.90 x total 79.6 GiB = 71.7 GiB, so vLLM would refuse")
    assert "held by PID 946 (VLLM::Worker_TP0, 9.5 GiB)" in found


def test_the_other_gpu_is_not_the_launchs() -> None:
    """The holder is on GPU 0; a launch on GPU 1 passes (the scope decides which devices count)."""
    devices = pick(launch_devices({"CUDA_VISIBLE_DEVICES": "1"}, container=False), SURVIVOR.devices)
    assert gpumemory.assess(devices, 0.9, {}, meminfo(251.8, 250), [], 2 * GIB)[0] is Verdict.ok


def test_host_ram_smaller_than_the_gpu_passes() -> None:
    """A 64 GiB host with an 80 GB GPU: the old host rule wanted 0.9 x 64 GiB free; vLLM wants it on the GPU."""
    verdict, found = gpumemory.assess(IDLE.devices[1:], 0.9, {}, meminfo(64, 40), [], 2 * GIB)
    assert verdict is Verdict.ok, found


def test_the_host_needs_offload_and_swap_space() -> None:
    argv = ["vllm", "serve", "m", "--cpu-offload-gb", "16", "--swap-space=4"]
    need = memcheck.host_need(argv, 2, 2 * GIB)
    assert need.bytes == (2 + 32 + 8) * GIB
    verdict, found = gpumemory.assess(IDLE.devices, 0.9, {}, meminfo(64, 40), argv, 2 * GIB)
    assert verdict is Verdict.fail and found == ("host MemAvailable 40.0 GiB is 2.0 GiB short of 2.0 GiB margin + "
                                                 "--cpu-offload-gb x 2 GPU = 32 GiB + --swap-space x 2 GPU = 8 GiB = "
                                                 "42.0 GiB")


def test_unified_memory_keeps_the_host_check() -> None:
    gb10 = GpuDevice(0, "GPU-gb10", "NVIDIA GB10", unified=True, power_w=11.0)
    assert memcheck.discrete([gb10]) == []
    assert memcheck.discrete(IDLE.devices) == list(IDLE.devices)


def test_the_watched_instances_memory_counts_as_free() -> None:
    """An operator's preflight beside the running vLLM: what the instance holds goes away at the stop."""
    device = gpumemory.without(SURVIVOR.devices[0], frozenset({946}))
    assert device.processes == () and device.free_bytes == SURVIVOR.devices[0].free_bytes + 10248781824


# ---- release after a stop ---------------------------------------------------------------------------------------


class Reads:
    def __init__(self, *views: GpuView) -> None:
        self.views = list(views)

    async def __call__(self) -> GpuView:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


def clock() -> tuple[object, object]:
    t = [0.0]

    async def sleep(s: float) -> None:
        t[0] += s

    return (lambda: t[0]), sleep


def test_release_waits_until_the_pids_are_gone() -> None:
    now, sleep = clock()
    got = anyio.run(lambda: release.wait_released(Reads(SURVIVOR, SURVIVOR, IDLE), {946}, 30, now=now, sleep=sleep))
    assert got.released and got.checked and got.seconds == pytest.approx(0.1)


def test_release_that_never_comes_is_a_sentence_with_reboot_advice() -> None:
    now, sleep = clock()
    got = anyio.run(lambda: release.wait_released(Reads(SURVIVOR), {946, 1}, 2.0, now=now, sleep=sleep))
    assert not got.released and [h.pid for h in got.held] == [946]
    text = got.sentence({946: "disk-sleep"})
    assert ("still held 2 s after its stop: PID 946 (state disk-sleep) on GPU 0 (NVIDIA H100 80GB HBM3) (9.5 GiB)"
            in text)
    assert "reboot" in text


def test_no_reading_is_not_verified_not_blocked() -> None:
    now, sleep = clock()
    got = anyio.run(lambda: release.wait_released(Reads(GpuView(skipped="no NVIDIA driver here")), {1}, 5, now=now,
                                                  sleep=sleep))
    assert got.released and not got.checked and "not verified" in got.sentence()


# ---- power: measured before it is trusted -----------------------------------------------------------------------


def survivor_power() -> list[power.PowerSample]:
    with open(DATA / "h100x2-power-survivor.csv") as handle:
        return [power.PowerSample(float(r["ago_kill_s"]), float(r["power_w1"]), float(r["util_pct1"]))
                for r in csv.DictReader(handle)]


def test_the_measured_peer_kill_reads_as_power_fell() -> None:
    """H100, rank 1 spinning after its peer died: ~244 W while all-reducing, ~121 W stuck, utilization 100 %."""
    drop = power.drop(survivor_power(), since=1.0, window_s=9.0)
    assert drop is not None
    assert drop.before_w == pytest.approx(244, abs=5) and drop.since_w == pytest.approx(121, abs=2)
    assert drop.utilization_pct is not None and drop.utilization_pct > 99
    assert drop.text() == "GPU power fell from 243 W to 121 W, utilization still 100 %"


def test_a_healthy_spell_is_no_fall() -> None:
    healthy = [s for s in survivor_power() if s.at < 0]
    assert power.drop(healthy, since=-4.0, window_s=5.0) is None
    assert power.drop(survivor_power()[:1], since=0.0) is None  # too few samples: no verdict


# ---- metrics ----------------------------------------------------------------------------------------------------


def test_gpu_metrics_carry_the_real_values_with_gpu_and_uuid() -> None:
    """The families sparkd exported on the H100 host, from the reading they were made of."""
    ready = view("h100x2-nvml-idle.json")
    live = (DATA / "h100x2-metrics-ready.txt").read_text().splitlines()
    families = {f.name: f for f in gpu_families(["node"], ["gpu-host"], ready.devices)}
    sample = families["sparkd_gpu_memory_total_bytes"].samples[0]
    assert sample.labels == {"node": "gpu-host", "gpu": "0", "uuid": "GPU-3ac5e21a-4914-422b-8ff7-2a21823187de"}
    assert any(line.startswith('sparkd_gpu_memory_total_bytes{gpu="0"') and line.endswith(" 8.5520809984e+10")
               for line in live)
    assert {line.split("{")[0] for line in live if not line.startswith("#")} == set(families)


def test_a_figure_the_device_does_not_report_is_left_out() -> None:
    gb10 = GpuDevice(0, "GPU-gb10", "NVIDIA GB10", unified=True, power_w=11.0)
    families = {f.name: f for f in gpu_families(["node"], ["n"], [gb10])}
    assert families["sparkd_gpu_memory_total_bytes"].samples == []
    assert families["sparkd_gpu_power_watts"].samples[0].value == 11.0


# ---- the stop's grace and report --------------------------------------------------------------------------------


def test_the_report_of_the_real_hung_stop() -> None:
    data = json.loads((DATA / "h100x2-stop-hung.json").read_text())
    fields = {k: v for k, v in data.items() if k in StopReport.__dataclass_fields__}
    report = StopReport(**{**fields, "killed": tuple(fields["killed"])})
    assert report.sentence() == data["sentence"] and report.sigkilled
    assert report.log_line() == ("---- sparkd: stop (health failed): SIGTERM, SIGKILL to PID 945, 946 after 5 s "
                                 "(hung_stop_grace_s: vLLM was wedged (hang)); killed by SIGKILL (sparkd SIGKILLed "
                                 "PID 945, 946 after the grace)")
    clean = replace(report, killed=())
    assert "ended on SIGTERM within the 5 s grace" in clean.sentence() and not clean.sigkilled
    assert GpuProcess(1).used_bytes is None


def test_a_hang_verdict_carries_the_measured_power_fall() -> None:
    """The daemon's sampler, holding the H100 survivor's power history: a hang declared 40 s into the wedge says the
    draw fell; one declared over a steady draw says nothing more."""
    from sparkd.daemon.watch.gpus import GpuSampler
    from sparkd.testing import FakeClock

    clock = FakeClock(start=1041.0)
    sampler = GpuSampler(Reads(IDLE), clock, None, lambda: Devices(), interval_s=0.25)  # as measured
    sampler.history.extend(power.PowerSample(1000 + s.at, s.watts, s.utilization_pct) for s in survivor_power())
    hang = Failure.of(FailureClass.hang, "vLLM stopped answering: the engine is wedged; sparkd restarts every rank.")
    said = sampler.annotate(hang, wedged_for_s=40).sentence
    assert said.endswith("sparkd restarts every rank (GPU power fell from 244 W to 121 W, utilization still 100 %).")
    steady = [s for s in sampler.history if s.at < 1000]
    sampler.history.clear()
    sampler.history.extend(steady)
    clock.t = 1000.0
    assert sampler.annotate(hang, wedged_for_s=4).sentence == hang.sentence


def test_a_step_probe_verdict_reads_the_power_over_its_own_wedge() -> None:
    """The step probe's verdict knows how long its stuck step has lasted (HealthFailed.wedged_for_s): the power fall
    is read over that time, not over [health] stall_after_s (which the probe's verdict comes long before)."""
    from types import SimpleNamespace

    from sparkd.config import HealthConfig
    from sparkd.daemon.effects.watching import NodeWatchReports
    from sparkd.daemon.watch.gpus import GpuSampler
    from sparkd.supervisor.vocabulary import HealthFailed
    from sparkd.testing import FakeClock

    clock = FakeClock(start=1041.0)
    sampler = GpuSampler(Reads(IDLE), clock, None, lambda: Devices(), interval_s=0.25)
    sampler.history.extend(power.PowerSample(1000 + s.at, s.watts, s.utilization_pct) for s in survivor_power())
    posted: list[object] = []
    node = SimpleNamespace(config=SimpleNamespace(health=HealthConfig(stall_after_s=600)))
    mailbox = SimpleNamespace(post=posted.append, node=lambda: node)
    reports = NodeWatchReports(mailbox, None, None, group=None, gpu=sampler)  # type: ignore[arg-type]
    hang = Failure.of(FailureClass.hang, "rank 1 (worker) on b, PID 7 has not begun step 9; sparkd restarts it.")
    reports.post(HealthFailed(hang, wedged_for_s=40))
    reports.post(HealthFailed(hang))
    told = [obs.failure.sentence for obs in posted]  # type: ignore[attr-defined]
    assert told[0].endswith("(GPU power fell from 244 W to 121 W, utilization still 100 %).")
    assert told[1] == hang.sentence


def test_preflight_waits_for_a_just_ended_process_to_leave_nvml() -> None:
    """Seen on H200: the stale sweep ended PID 767 and the memory check, reading NVML at once, still found its
    20.6 GiB held ('held by PID 767 (?, 20.6 GiB)'); the driver lets go 0.07-0.2 s after the exit. A listed PID
    that has ended is waited for; a live one is not."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from sparkd.preflight.gpu import settled_gpus

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held = GpuView.from_json({**SURVIVOR.to_json(), "devices": [
        {**SURVIVOR.devices[0].to_json(), "processes": [{"pid": dead.pid, "used_bytes": 20 * GIB}]}]})
    reads = Reads(held, held, IDLE)
    got = anyio.run(settled_gpus, SimpleNamespace(gpus=reads))
    assert got == IDLE
    alive = GpuView.from_json({**held.to_json(), "devices": [
        {**held.devices[0].to_json(), "processes": [{"pid": 1, "used_bytes": 1}]}]})
    assert anyio.run(settled_gpus, SimpleNamespace(gpus=Reads(alive, IDLE))) == alive  # read once, not waited


def test_the_launchs_devices_are_worked_out_once_a_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder asks every second: the launch is rendered again only for a config not seen before (a reload)."""
    from sparkd.daemon.watch import gpus

    rendered: list[object] = []

    def counting(cfg: object) -> object:
        rendered.append(cfg)
        return render(cfg)  # type: ignore[arg-type]

    monkeypatch.setattr(gpus, "render", counting)
    def on(devices: str) -> object:
        return config_from_mapping({"runtime": "process",
                                    "launch": {"model": "m", "env": {"CUDA_VISIBLE_DEVICES": devices}}})

    current = [on("1")]
    scope = gpus.LaunchDevices(lambda: current[0], "process", rehearse=False)
    first = scope()
    assert [scope() for _ in range(5)] == [first] * 5 and len(rendered) == 1
    current[0] = on("0")
    assert scope() != first and len(rendered) == 2
