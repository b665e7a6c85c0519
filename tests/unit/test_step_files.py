"""The step file: the plugin's writer and sparkd's reader (sparkd.host.stepfiles) through the one format
(sparkd.vllm_probe.sparkd_vllm_probe.layout)."""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from sparkd.host.stepfiles import MAX_FILES, host_pid, process_state, read_step_file, read_steps
from sparkd.vllm_probe.sparkd_vllm_probe import layout
from sparkd.vllm_probe.sparkd_vllm_probe.writer import StepWriter


def test_a_fresh_file_names_its_process_and_has_no_step(tmp_path: Path) -> None:
    before = time.monotonic_ns()
    w = StepWriter(str(tmp_path), layout.WORKER, 3, local_rank=1, world_size=4, title="VLLM::Worker_TP1",
                   vllm="0.32.0")
    r = read_step_file(tmp_path / "worker-3.step")
    assert (r.role, r.rank, r.local_rank, r.world_size, r.pid) == ("worker", 3, 1, 4, os.getpid())
    assert (r.step, r.phase, r.began_ns, r.ended_ns, r.note) == (0, "idle", 0, 0, "")
    assert (r.title, r.vllm, r.host) == ("VLLM::Worker_TP1", "0.32.0", socket.gethostname())
    assert r.pid_ns == os.stat("/proc/self/ns/pid").st_ino and r.start_ticks > 0
    assert r.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert before <= r.anchor_mono_ns <= time.monotonic_ns()
    assert abs(r.wall_ns(r.anchor_mono_ns) - time.time_ns()) < 5e9
    assert os.stat(w.path).st_size == layout.SIZE and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    w.close()


def test_steps_begin_and_end_as_the_reader_sees_them(tmp_path: Path) -> None:
    w = StepWriter(str(tmp_path), layout.ENGINE, 0)
    w.begin()
    w.end(held=2)
    w.begin(tokens=4096)
    r = read_step_file(Path(w.path))
    assert (r.role, r.step, r.phase, r.tokens, r.held, r.done, r.in_step) == ("engine", 2, "step", 4096, 2, 1, True)
    assert 0 < r.ended_ns <= r.began_ns and r.longest_ns > 0 and (r.last_ns, r.last_tokens) == (0, -1)  # inside
    w.collective()
    assert read_step_file(Path(w.path)).phase == "collective"
    w.end()
    r = read_step_file(Path(w.path))
    assert (r.step, r.phase, r.last_tokens, r.done) == (2, "idle", 4096, 2)
    w.begin(3)
    assert read_step_file(Path(w.path)).phase == "step"  # a collective mark is of its own step only
    w.off("a worker step's end failed: OSError(28)")
    r = read_step_file(Path(w.path))
    assert r.phase == "off" and r.note == "a worker step's end failed: OSError(28)"
    w.close()


def test_the_longest_step_and_its_tokens_are_kept(tmp_path: Path) -> None:
    w = StepWriter(str(tmp_path), layout.WORKER, 0)
    w.begin(8192)
    time.sleep(0.05)
    w.end()
    w.begin(1)
    w.end()
    r = read_step_file(Path(w.path))
    assert r.longest_tokens == 8192 and r.longest_ns >= 50_000_000 > r.last_ns and r.last_tokens == 1


def test_a_block_that_changes_while_read_is_torn() -> None:
    data = bytearray(layout.BEGIN.pack(5, 10, 3, 5))
    reads = []

    def read(at: int, size: int) -> bytes:
        reads.append(at)
        chunk = bytes(data[at - layout.BEGIN_AT:at - layout.BEGIN_AT + size])
        data[:] = layout.BEGIN.pack(6, 11, 3, 6)  # the writer begins the next step between any two reads
        return chunk

    with pytest.raises(layout.Torn):
        layout.read_block(read, layout.BEGIN_AT, layout.BEGIN)
    assert reads == [layout.BEGIN_AT + 24, layout.BEGIN_AT, layout.BEGIN_AT]  # tail, block, head


def test_the_reader_refuses_what_is_not_a_step_file(tmp_path: Path) -> None:
    (tmp_path / "short.step").write_bytes(b"\0" * 100)
    (tmp_path / "magic.step").write_bytes(b"\1" * layout.SIZE)
    (tmp_path / "link.step").symlink_to(tmp_path / "magic.step")
    (tmp_path / "other.txt").write_text("not ours")
    StepWriter(str(tmp_path), layout.WORKER, 0).begin(1)
    reading = read_steps(tmp_path, now_ns=lambda: 42)
    assert reading.read_at_ns == 42 and [r.rank for r in reading.records] == [0]
    problems = "\n".join(reading.problems)
    assert "short.step: not a regular file of 512 bytes" in problems
    assert "magic.step: not a step file of format 1" in problems
    assert "link.step:" in problems and len(reading.problems) == 3


def test_a_missing_directory_and_too_many_files(tmp_path: Path) -> None:
    assert read_steps(tmp_path / "none").problems[0].endswith("No such file or directory")
    for rank in range(MAX_FILES + 2):
        StepWriter(str(tmp_path), layout.WORKER, rank)
    reading = read_steps(tmp_path)
    assert len(reading.records) == MAX_FILES and f"{MAX_FILES + 2} step files" in reading.problems[0]


def test_a_step_block_torn_on_every_retry_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    w = StepWriter(str(tmp_path), layout.WORKER, 0)
    with open(w.path, "r+b") as handle:  # head and tail copies that never agree
        handle.seek(layout.BEGIN_AT)
        handle.write(struct.pack("<q", 7))
    reading = read_steps(tmp_path)
    assert reading.records == () and "kept changing" in reading.problems[0]


def test_the_process_of_a_record_is_found_and_a_gone_one_is_not(tmp_path: Path) -> None:
    StepWriter(str(tmp_path), layout.WORKER, 0)
    (r,) = read_steps(tmp_path).records
    assert host_pid(r) == os.getpid()
    assert host_pid(r, hint=1) == os.getpid()
    assert host_pid(dataclasses.replace(r, start_ticks=r.start_ticks + 1), proc=Path("/proc")) is None


def test_a_process_in_a_container_is_found_by_its_innermost_pid(tmp_path: Path) -> None:
    """A fake /proc: host PID 4242 is PID 12 in its container; host PID 12 is someone else."""
    proc = tmp_path / "proc"
    for pid, start, nspid in ((4242, 777, "4242\t12"), (12, 555, "12")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python3) S " + " ".join(["0"] * 18) + f" {start} 0 0")
        (proc / str(pid) / "status").write_text(f"Name:\tpython3\nNSpid:\t{nspid}\n")
    w = StepWriter(str(tmp_path), layout.WORKER, 1)
    (r,) = read_steps(tmp_path).records
    inside = dataclasses.replace(r, pid=12, start_ticks=777)
    assert host_pid(inside, proc=proc) == 4242
    assert host_pid(dataclasses.replace(inside, start_ticks=778), proc=proc) is None
    w.close()


def test_proc_is_listed_only_when_the_hint_and_the_records_pid_are_not_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Read every second while vLLM serves: a known process costs two small reads, not a walk of /proc."""
    StepWriter(str(tmp_path), layout.WORKER, 0)
    (r,) = read_steps(tmp_path).records
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: listed.append(str(path)) or real(path))
    assert host_pid(r, hint=os.getpid()) == os.getpid() and host_pid(r) == os.getpid()
    assert listed == []
    assert host_pid(dataclasses.replace(r, start_ticks=r.start_ticks + 1)) is None
    assert listed == ["/proc"]


def test_a_processs_state_letter(tmp_path: Path) -> None:
    assert process_state(os.getpid()) == "R"
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").write_text("9 (a (b) c) T 1 2 3")
    assert process_state(9, proc=tmp_path) == "T" and process_state(10, proc=tmp_path) is None
