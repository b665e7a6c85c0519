"""The flight recorder's GPUs: every record holds the launch's GPUs as the one GPU sampler last read them — each GPU's
power, utilization and memory, their power together and mean utilization — from real H100 readings
(tests/data/gpu/: the hang incident's, rank 0 spinning on GPU 0 at 100 % holding 9.5 GiB), through the ring and
into ``sparkctl postmortem``; a node with no GPU records none."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from loop_harness import config, running

from sparkd.cli.postmortem import render
from sparkd.host.gpu import nvml
from sparkd.host.gpu.fake import FakeNvml
from sparkd.host.gpu.model import GpuView
from sparkd.recorder.postmortem import Finding, NodeRing, Report
from sparkd.recorder.record import Record, decode, encode, from_json, to_json
from sparkd.recorder.ring import read_ring
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
GIB = 1 << 30


class RecordedGpus:
    """NVML answering with a reading recorded on the 2x H100 host."""

    def __init__(self, name: str) -> None:
        data = json.loads((DATA / name).read_text())
        self.view = GpuView.from_json(data.get("view", data))
        self.reader = nvml.NvmlReader(FakeNvml.from_view(self.view.to_json()), wall=lambda: self.view.at)

    async def __call__(self) -> GpuView:
        return self.reader.read()


async def ring_of_a_run(tmp_path: Path, **options: object) -> list[Record]:
    cfg = config(tmp_path, recorder={"enabled": True})
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock, **options) as node:
        await node.until_state("ready")
        await node.until(lambda: node.clock.t > 1010)  # records of ten seconds at ready
    return read_ring(tmp_path / "state" / "recorder.ring")


async def test_a_record_holds_each_gpu_of_the_launch_from_the_one_sampler(tmp_path: Path) -> None:
    gpus = RecordedGpus("h100x2-incident-gpu.json")
    records = await ring_of_a_run(tmp_path, gpus=gpus)
    devices = {d.index: d for d in gpus.view.devices}
    ready = [r for r in records if r.state == "ready"]
    assert ready, [r.state for r in records]
    last = ready[-1]
    assert [g.index for g in last.gpus] == sorted(devices)  # both H100s: the launch names no device
    for mark in last.gpus:
        device = devices[mark.index]
        assert mark.power_w == pytest.approx(device.power_w, abs=0.01)
        assert mark.util_pct == device.utilization_pct
        assert mark.used_bytes is not None and abs(mark.used_bytes - (device.used_bytes or 0)) < 1024  # KiB steps
        assert mark.total_bytes is not None and abs(mark.total_bytes - (device.total_bytes or 0)) < 1024
    busy = next(g for g in last.gpus if g.index == 0)
    assert busy.util_pct == 100 and busy.used_bytes is not None and busy.used_bytes > 9 * GIB  # rank 0, spinning
    assert last.gpu_power_w == pytest.approx(sum(d.power_w or 0 for d in devices.values()), abs=0.01)
    assert last.gpu_util == pytest.approx(sum(d.utilization_pct or 0 for d in devices.values()) / len(devices))
    assert from_json(to_json(last)) == last == replace(decode(encode(last)), seq=last.seq)  # the ring's, the JSON


async def test_a_node_without_a_gpu_records_none(tmp_path: Path) -> None:
    records = await ring_of_a_run(tmp_path)
    assert records and all(r.gpus == () and r.gpu_power_w is None and r.gpu_util is None for r in records)
    assert "gpus" not in to_json(records[-1])  # the JSON the peers and `postmortem --json` get: as before


def test_a_record_without_the_gpu_section_reads_as_before() -> None:
    """A ring written before the GPU section existed (or by a node with none) decodes as it did."""
    record = Record(wall=1.0, mono=2.0, boot="00000000-0000-0000-0000-000000000000", run=3, state="ready")
    assert decode(encode(record)).gpus == ()


async def test_postmortem_shows_each_gpu_of_a_record(tmp_path: Path) -> None:
    records = await ring_of_a_run(tmp_path, gpus=RecordedGpus("h100x2-incident-gpu.json"))
    shown = [r for r in records if r.gpus][-1]
    finding = Finding("spark0", "spark0", "unknown", shown.wall, "spark0 went silent.", (shown,))
    text = render(Report("spark0", None, "spark0 went silent.", (finding,)), [NodeRing("spark0")], [])
    gpu0 = next(line for line in text.splitlines() if "GPU 0:" in line)
    assert "100 %" in gpu0 and " W" in gpu0 and "GiB" in gpu0, text
    assert any("GPU 1:" in line for line in text.splitlines()), text
