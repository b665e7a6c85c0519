"""The flight recorder's ring: every whole record comes back, whatever a power cut, a truncation or corruption did
to the file; nothing written through a link; a resized ring keeps its newest records; the writer thread syncs at
a bounded rate."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.recorder.record import Floors, PeerMark, Record, decode, encode, from_json, peek, to_json
from sparkd.recorder.ring import HEADER_SIZE, RingFile, read_frames, read_ring, scan_frames
from sparkd.recorder.writer import RingWriter

BOOT = str(uuid.UUID(int=7))


def record(i: int, **kw: object) -> Record:
    return Record(wall=1_000_000.0 + i, mono=float(i), boot=BOOT, run=3, available=(20 << 30) - i * (1 << 20),
                  psi_full=1.5, state="ready", phase="ready", running=i % 4, events=(f"event {i}",), **kw)  # type: ignore[arg-type]


def test_a_record_survives_its_binary_form() -> None:
    r = Record(wall=1.5, mono=2.25, boot=BOOT, run=9, available=5 << 30, free=1 << 30, swap_used=0, psi_some=2.5,
               psi_full=0.5, guard_level="stop", guard_action="cooldown", trend_slope=-1024.0, trend_floor_s=60.0,
               state="degraded", phase="ready", running=3, waiting=1, prompt_tps=1500.0, kv_usage=0.5,
               gpu_power_w=45.0, gpu_util=95.0, pid=4242, restarts=2, floors=Floors(8 << 30, 4 << 30, 2 << 30),
               clean_exit=True, peers=(PeerMark("worker", 0.5, -0.25, True),), kernel=("NVRM: Xid 79",),
               events=("ready → stopping: oom: vLLM ran out of memory.",))
    back = decode(encode(r), seq=5)
    assert back == Record(**{**to_json(r), "seq": 5, "floors": r.floors, "peers": r.peers, "kernel": r.kernel,
                             "events": r.events})  # type: ignore[arg-type]
    assert peek(encode(r)) == (1.5, BOOT, 9, True)
    assert from_json(to_json(back)) == back


def test_unknown_values_stay_unknown_and_long_lines_are_cut() -> None:
    r = Record(wall=1.0, mono=1.0, boot=BOOT, run=1, kernel=("x" * 5000,), state="a state from the future")
    back = decode(encode(r))
    assert back.available is None and back.running is None and back.psi_full is None and back.pid is None
    assert back.state == "unknown" and len(back.kernel[0]) == 480


def ring_bytes(tmp: Path, n: int, size: int = 64 * 1024) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """A ring written by the real writer class: its bytes and each frame's (start, end, payload) in the file."""
    ring = RingFile(tmp / "r.ring", size)
    ring.open()
    for i in range(n):
        ring.append(encode(record(i)))
    ring.sync()
    ring.close()
    raw = (tmp / "r.ring").read_bytes()
    frames = [(HEADER_SIZE + f.offset, HEADER_SIZE + f.end, f.payload) for f in scan_frames(raw[HEADER_SIZE:])]
    return raw, frames


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    return ring_bytes(tmp_path_factory.mktemp("ring"), 700)  # wraps: 700 records of ~170 bytes in 64 KiB


def test_a_full_ring_keeps_the_newest_records_in_order(written: tuple[bytes, list[tuple[int, int, bytes]]],
                                                       tmp_path: Path) -> None:
    raw, _ = written
    (tmp_path / "r.ring").write_bytes(raw)
    records = read_ring(tmp_path / "r.ring")
    seqs = [r.seq for r in records]
    assert seqs == list(range(seqs[0], 701)) and 300 < len(seqs) < 700
    assert records[-1].events == ("event 699",)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=st.lists(st.tuples(st.integers(0, 64 * 1024 + HEADER_SIZE), st.binary(min_size=1, max_size=300)),
                       max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 64 * 1024 + HEADER_SIZE)))
def test_every_whole_record_comes_back_from_a_torn_or_corrupted_ring(
        written: tuple[bytes, list[tuple[int, int, bytes]]], damage: list[tuple[int, bytes]], cut: int | None,
        tmp_path: Path) -> None:
    raw, frames = written
    data = bytearray(raw)
    touched: list[tuple[int, int]] = []
    for at, junk in damage:
        data[at:at + len(junk)] = junk[:max(0, len(data) - at)]
        touched.append((at, at + len(junk)))
    if cut is not None:
        del data[cut:]
        touched.append((cut, len(raw)))
    path = tmp_path / "damaged.ring"
    path.write_bytes(bytes(data))
    found = {(f.seq, f.payload) for f in read_frames(path)}  # never raises
    original = {(decode(p).mono, p) for _, _, p in frames}
    whole = {p for start, end, p in frames if all(end <= a or start >= b for a, b in touched)}
    assert {p for _, p in found} >= whole  # every record nothing touched
    assert {p for _, p in found} <= {p for _, p in original}  # and nothing that was not written
    for r in read_ring(path):  # and every one decodes
        assert r.boot == BOOT


def test_the_reader_takes_any_bytes_at_all() -> None:
    assert list(scan_frames(os.urandom(100_000))) == []
    assert list(scan_frames(b"SPRc" * 1000)) == []


def test_a_writer_goes_on_after_the_newest_record(tmp_path: Path) -> None:
    ring_bytes(tmp_path, 50)
    ring = RingFile(tmp_path / "r.ring", 64 * 1024)
    assert len(ring.open()) == 50 and ring.seq == 50
    ring.append(encode(record(50)))
    ring.close()
    assert [r.seq for r in read_ring(tmp_path / "r.ring")][-2:] == [50, 51]


def test_a_resized_ring_keeps_its_newest_records(tmp_path: Path) -> None:
    ring_bytes(tmp_path, 300)
    smaller = RingFile(tmp_path / "r.ring", 16 * 1024)
    kept = smaller.open()
    smaller.close()
    assert kept and kept[-1].seq == 300 and smaller.carried == len(kept) < 300
    assert (tmp_path / "r.ring").stat().st_size == HEADER_SIZE + 16 * 1024


def test_nothing_is_written_through_a_symlink_or_a_hard_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "r.ring"
    link.symlink_to(victim)
    with pytest.raises(OSError):  # the reader does not follow it either
        read_ring(link)
    ring = RingFile(link, 64 * 1024)
    ring.open()  # the link is set aside, a fresh ring is made
    ring.append(encode(record(1)))
    ring.close()
    assert victim.read_text() == "precious\n" and not link.is_symlink()
    assert [p.name for p in tmp_path.glob("r.ring.bad-*")]
    hard = tmp_path / "h.ring"
    os.link(victim, hard)
    ring = RingFile(hard, 64 * 1024)
    ring.open()
    ring.close()
    assert victim.read_text() == "precious\n"


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level: str) -> object:
        return lambda event, **kw: self.events.append(event)


def test_the_writer_thread_syncs_at_most_once_an_interval(tmp_path: Path) -> None:
    writer = RingWriter(tmp_path / "r.ring", 64 * 1024, sync_interval_s=0.5, log=Log())
    writer.start()
    assert writer.opened.wait(10)
    started = time.monotonic()
    for i in range(40):
        writer.put(encode(record(i)))
        time.sleep(0.025)
    writer.close()
    took = time.monotonic() - started
    assert writer.written == 40 and writer.problem is None
    assert 1 <= writer.syncs <= took / 0.5 + 2  # bounded, and the clean close synced the last ones
    assert len(read_ring(tmp_path / "r.ring")) == 40


def test_a_record_a_little_early_is_synced_at_once_not_after_a_second_wake_up(tmp_path: Path) -> None:
    """Records ride the guard's samples, a hair under the interval apart: each is synced when it comes (the thread
    wakes once a record), not after a wait for the interval's last milliseconds. The writer's clock stands still
    here, so a writer that waited for the interval's end would never sync the second record."""
    now = [100.0]
    writer = RingWriter(tmp_path / "r.ring", 64 * 1024, sync_interval_s=1.0, log=Log(), clock=lambda: now[0])
    writer.start()
    assert writer.opened.wait(10)
    writer.put(encode(record(1)))
    deadline = time.monotonic() + 10
    while writer.syncs < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    now[0] += 0.95  # the next guard sample, 50 ms short of the interval
    writer.put(encode(record(2)))
    while writer.syncs < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    synced = writer.syncs
    now[0] += 0.5  # early by half: waits for its slot (the clean close syncs it)
    writer.put(encode(record(3)))
    time.sleep(0.2)
    early = writer.syncs
    writer.close()
    assert (synced, early) == (2, 2) and len(read_ring(tmp_path / "r.ring")) == 3


def test_a_ring_that_cannot_be_written_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "r.ring").mkdir()  # a directory in the way, and it cannot be set aside
    (tmp_path / "r.ring" / "x").write_text("")
    os.chmod(tmp_path, 0o500)
    try:
        writer = RingWriter(tmp_path / "r.ring", 64 * 1024, sync_interval_s=0.5, log=Log())
        writer.start()
        writer.put(encode(record(1)))
        writer.close()
    finally:
        os.chmod(tmp_path, 0o700)
    if os.geteuid() != 0:
        assert writer.problem is not None and "r.ring" in writer.problem
