"""The GPU view: NVML through a fake fed with real readings (tests/data/gpu/), GB10's unified memory, no driver,
and nvidia-smi's text."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkd.host.gpu import fake, nvml, smi
from sparkd.host.gpu.fake import FakeDevice, FakeNvml, gb10
from sparkd.host.gpu.model import GpuView

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"


def recorded(name: str) -> dict:
    data = json.loads((DATA / name).read_text())
    return data.get("view", data)


@pytest.mark.parametrize("name", ["h100x2-nvml-idle.json", "h100x2-incident-gpu.json", "h200x2-nvml-idle.json"])
def test_a_real_reading_reads_back_the_same_through_the_fake(name: str) -> None:
    """The reader, asked through a fake that answers what the H100s answered, makes the same view: every field
    the real NVML gave, in the same units."""
    view = GpuView.from_json(recorded(name))
    again = nvml.NvmlReader(FakeNvml.from_view(recorded(name)), wall=lambda: view.at).read()
    assert again == view
    assert view.devices[0].total_bytes == (150_754_820_096 if "h200" in name else 85_520_809_984)
    assert view.driver == "580.159.04" and not view.devices[0].unified


def test_the_survivor_reading_shows_who_holds_gpu_0() -> None:
    view = GpuView.from_json(recorded("h100x2-incident-gpu.json"))
    gpu0 = view.devices[0]
    assert gpu0.pids() == {946} and gpu0.utilization_pct == 100.0 and gpu0.power_w == pytest.approx(140.0, abs=1)
    assert view.holders() == {946: [gpu0]}


def test_gb10_memory_is_not_supported_and_reads_as_unified() -> None:
    """GB10: NVML says "not supported" for device memory (and power limit, ECC): the device is unified, its memory
    None, nothing unreadable, no exception."""
    view = nvml.NvmlReader(FakeNvml([gb10()])).read()
    (device,) = view.devices
    assert device.unified and device.total_bytes is None and device.free_bytes is None
    assert device.power_w == 11.0 and device.unreadable == () and view.available


def test_a_discrete_device_is_not_unified() -> None:
    assert not nvml.NvmlReader(FakeNvml([FakeDevice("GPU-a")])).read().devices[0].unified


@pytest.mark.parametrize(("error", "said"), [
    (fake.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver here (libnvidia-ml.so cannot be loaded)"),
    (fake.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA driver is not loaded"),
    (fake.NVML_ERROR_UNKNOWN, "NVML does not start: Unknown Error"),
])
def test_no_driver_is_a_skip_in_words(error: int, said: str) -> None:
    view = nvml.NvmlReader(FakeNvml([FakeDevice("GPU-a")], init_error=error)).read()
    assert not view.available and view.skipped == said and view.devices == ()


def test_no_bindings_is_a_skip_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml, "_import", missing)
    monkeypatch.setattr(nvml, "_driver_library_loads", lambda: True)
    view = nvml.NvmlReader().read()
    assert view.skipped == "the NVML bindings are not installed (Python package nvidia-ml-py)"


def test_without_the_drivers_library_the_bindings_are_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml costs a daemon ~2.7 MiB: a node with no NVIDIA driver does without, and is asked again later."""
    loads = [False]

    def imported() -> None:
        raise AssertionError("pynvml imported without a driver")

    monkeypatch.setattr(nvml, "_import", imported)
    monkeypatch.setattr(nvml, "_driver_library_loads", lambda: loads[0])
    reader = nvml.NvmlReader()
    assert reader.read().skipped == nvml.NO_DRIVER
    loads[0] = True
    monkeypatch.setattr(nvml, "_import", lambda: FakeNvml([FakeDevice("GPU-a")]))
    assert reader.read().available  # the driver came: read from then on


def test_nvml_is_started_once() -> None:
    api = FakeNvml([FakeDevice("GPU-a")])
    reader = nvml.NvmlReader(api)
    reader.read()
    reader.read()
    assert api.inits == 1


def test_a_lost_gpu_is_named_not_raised() -> None:
    view = nvml.NvmlReader(FakeNvml([FakeDevice("GPU-a"), replace(FakeDevice("GPU-b"), lost=True)])).read()
    lost = view.devices[1]
    assert lost.total_bytes is None and not lost.unified and "memory: GPU is lost" in lost.unreadable
    assert view.devices[0].total_bytes is not None


def test_no_driver_on_this_machine_is_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the suite runs without a GPU (CI), the real reader says why and raises nothing."""
    view = nvml.NvmlReader().read()
    if view.available:
        pytest.skip("this machine has an NVIDIA GPU")
    assert view.skipped


# ---- nvidia-smi, the fallback ---------------------------------------------------------------------------------


def test_real_query_gpu_csv_parses() -> None:
    devices = smi.parse_gpus((DATA / "h100x2-nvidia-smi-query-gpu.csv").read_text())
    assert [d.index for d in devices] == [0, 1]
    assert devices[0].uuid == "GPU-3ac5e21a-4914-422b-8ff7-2a21823187de"
    assert devices[0].total_bytes == 81559 * 2**20 and devices[0].free_bytes == 81079 * 2**20
    assert devices[0].power_w == 76.61 and devices[0].power_limit_w == 700.0 and not devices[0].unified
    assert devices[0].ecc_uncorrected == 0 and devices[1].temperature_c == 32


def test_query_gpu_agrees_with_nvml_on_the_same_host() -> None:
    by_smi = smi.parse_gpus((DATA / "h100x2-nvidia-smi-query-gpu.csv").read_text())
    by_nvml = GpuView.from_json(recorded("h100x2-nvml-idle.json")).devices
    assert [d.uuid for d in by_smi] == [d.uuid for d in by_nvml]
    for a, b in zip(by_smi, by_nvml, strict=True):
        assert a.total_bytes is not None and b.total_bytes is not None
        assert abs(a.total_bytes - b.total_bytes) < 2**30  # nvidia-smi shows the total less the driver's reserve


def test_not_available_memory_is_unified_and_apps_join_by_uuid() -> None:
    line = "0, GPU-x, NVIDIA GB10, [N/A], [N/A], [N/A], 95, 0, 17.30, [N/A], 44, 2405, [N/A], [N/A], [N/A]"
    apps = smi.parse_apps("4242, GPU-x, [N/A]\nNo running processes found\n")
    (device,) = smi.parse_gpus(line, apps)
    assert device.unified and device.total_bytes is None and device.power_w == 17.3
    assert [(p.pid, p.used_bytes) for p in device.processes] == [(4242, None)]


def test_an_incident_keeps_the_reading_and_nvidia_smi_q(tmp_path: Path) -> None:
    """A failure on a GPU node: gpu.json (the reading and the power history) and nvidia-smi -q beside the record."""
    from sparkd.state.incidents import GpuEvidence, write_gpu

    text = (DATA / "h100x2-nvidia-smi-q.txt").read_text()
    reading = json.loads((DATA / "h100x2-incident-gpu.json").read_text())
    write_gpu(tmp_path, GpuEvidence(reading, text))
    assert json.loads((tmp_path / "gpu.json").read_text())["view"]["devices"][0]["processes"] == [
        {"pid": 946, "used_bytes": 10248781824}]
    assert "Driver Version                                         : 580.159.04" in (
        tmp_path / "nvidia-smi-q.txt").read_text()
