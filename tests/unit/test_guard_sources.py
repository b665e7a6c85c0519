"""The guard's sources: /proc/meminfo, /proc/pressure/memory and /dev/kmsg, against fixture files written
from the texts below (a GB10 under load, a PSI file under pressure, kernel log records from the field) and
against the real files of this machine."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anyio
import pytest

from sparkd.guard.kmsg import KernelEvent, KernelLog, classify_line, parse_records
from sparkd.guard.meminfo import MeminfoError, MeminfoReader, parse_meminfo
from sparkd.guard.psi import Pressure, PressureReader, PsiTrigger, _unprivileged, parse_pressure
from sparkd.guard.sample import GIB

KIB = 1024

# A GB10 (121.7 GiB pool) serving a model: ~85 GiB held by the driver, in no named field.
GB10_MEMINFO = """\
MemTotal:       127612908 kB
MemFree:         2512340 kB
MemAvailable:    9123456 kB
Buffers:          102400 kB
Cached:         25000000 kB
SwapCached:            0 kB
Active:         14000000 kB
Inactive:       20000000 kB
Active(anon):    3000000 kB
Inactive(anon):   900000 kB
Active(file):   11000000 kB
Inactive(file): 19100000 kB
Unevictable:       30000 kB
Mlocked:           28000 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Dirty:              1200 kB
Writeback:             0 kB
AnonPages:       3800000 kB
Mapped:           900000 kB
Shmem:           1200000 kB
KReclaimable:     700000 kB
Slab:            1400000 kB
SReclaimable:     700000 kB
SUnreclaim:       700000 kB
KernelStack:       40000 kB
PageTables:        60000 kB
CommitLimit:    63806452 kB
Committed_AS:   20000000 kB
VmallocTotal:   135290159040 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
CmaTotal:              0 kB
CmaFree:          940604 kB
"""

GB10_RESIDUAL = (127612908 - 2512340 - 14000000 - 20000000 - 1400000 - 60000 - 30000) * KIB

PSI_UNDER_PRESSURE = """\
some avg10=62.51 avg60=20.07 avg300=4.81 total=123456789
full avg10=45.60 avg60=12.00 avg300=2.50 total=98765432
"""

KMSG_RECORDS = [
    b"3,1021,81234567,-;NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)"
    b" returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359\n",
    b"6,1022,81234600,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=docker-ab.scope,"
    b"mems_allowed=0,global_oom,task_memcg=/system.slice/docker-ab.scope,task=VLLM::EngineCor,pid=4242,uid=0\n",
    b"3,1023,81234601,-;Out of memory: Killed process 4242 (VLLM::EngineCor) total-vm:99999999kB, "
    b"anon-rss:1800000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:9000kB oom_score_adj:500\n"
    b" SUBSYSTEM=memory\n DEVICE=+memory:oom\n",
    b"3,1024,81299999,-;Out of memory: Killed process 999 (chrome) total-vm:1234kB, anon-rss:1000kB\n",
    b"3,1025,81300000,-;Out of memory: Killed process 31337 (python3) total-vm:1234kB, anon-rss:1000kB\n",
    b"6,1026,81300001,-;docker0: port 1(veth9d58612) entered disabled state\n",
]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def rewrite_in_place(path: Path, text: str) -> None:
    """Overwrite the same inode, as the kernel's files change under an open fd."""
    with open(path, "r+") as handle:
        handle.truncate(0)
        handle.write(text)


# ---- /proc/meminfo


def test_parse_gb10_meminfo() -> None:
    """Fields come out in bytes; the driver's share is the residual of the named fields."""
    m = parse_meminfo(GB10_MEMINFO)
    assert (m.mem_total, m.mem_available, m.mem_free) == (127612908 * KIB, 9123456 * KIB, 2512340 * KIB)
    assert (m.cached, m.shmem, m.swap_total, m.swap_free) == (25000000 * KIB, 1200000 * KIB, 0, 0)
    assert m.driver_residual == GB10_RESIDUAL
    assert 85 * GIB < m.driver_residual < 86 * GIB


def test_reader_matches_parser_on_fixture(tmp_path: Path) -> None:
    """The hot-path reader and the plain parser agree, field for field."""
    path = write(tmp_path / "meminfo", GB10_MEMINFO)
    with MeminfoReader(path) as reader:
        assert reader.read() == parse_meminfo(GB10_MEMINFO)


def test_reader_follows_changes_of_width(tmp_path: Path) -> None:
    """Values that gain or lose digits shift every later key; the reader still finds each one."""
    path = write(tmp_path / "meminfo", GB10_MEMINFO)
    with MeminfoReader(path) as reader:
        reader.read()
        changed = (
            GB10_MEMINFO.replace("MemFree:         2512340 kB", "MemFree:       102512340 kB")
            .replace("MemAvailable:    9123456 kB", "MemAvailable:      12 kB")
            .replace("Slab:            1400000 kB", "Slab:       1 kB")
        )
        rewrite_in_place(path, changed)
        assert reader.read() == parse_meminfo(changed)
        assert reader.read().mem_available == 12 * KIB


def test_reader_without_swap_lines(tmp_path: Path) -> None:
    """A kernel without swap lines reads swap as 0."""
    text = "".join(line + "\n" for line in GB10_MEMINFO.splitlines() if not line.startswith("Swap"))
    with MeminfoReader(write(tmp_path / "meminfo", text)) as reader:
        m = reader.read()
    assert (m.swap_total, m.swap_free) == (0, 0)
    assert m == parse_meminfo(text)


def test_missing_field_is_an_error(tmp_path: Path) -> None:
    """No MemAvailable (kernel < 3.14, or not meminfo at all) is refused at open and when it vanishes."""
    text = GB10_MEMINFO.replace("MemAvailable:    9123456 kB\n", "")
    with pytest.raises(MeminfoError):
        parse_meminfo(text)
    with pytest.raises(MeminfoError):
        MeminfoReader(write(tmp_path / "bad", text))
    path = write(tmp_path / "meminfo", GB10_MEMINFO)
    with MeminfoReader(path) as reader:
        rewrite_in_place(path, text)
        with pytest.raises(MeminfoError):
            reader.read()


def test_residual_clamps_at_zero() -> None:
    """Named fields that add up past MemTotal (accounting skew) give a residual of 0, not a negative."""
    text = GB10_MEMINFO.replace("Active:         14000000 kB", "Active:        200000000 kB")
    assert parse_meminfo(text).driver_residual == 0


def test_real_meminfo() -> None:
    """This machine's /proc/meminfo: reader and parser agree on the fixed fields, and the numbers add up."""
    with MeminfoReader() as reader:
        fast = reader.read()
    with open("/proc/meminfo") as handle:
        plain = parse_meminfo(handle.read())
    assert fast.mem_total == plain.mem_total and fast.swap_total == plain.swap_total
    assert abs(fast.mem_available - plain.mem_available) < 512 * 1024**2
    assert 0 < fast.mem_free <= fast.mem_total and 0 < fast.mem_available <= fast.mem_total
    assert 0 <= fast.driver_residual < fast.mem_total


# ---- /proc/pressure/memory


def test_parse_pressure_fixture(tmp_path: Path) -> None:
    """some/full avg10 in percent and totals in microseconds, from the parser and the reader alike."""
    expected = Pressure(62.51, 123456789, 45.60, 98765432)
    assert parse_pressure(PSI_UNDER_PRESSURE) == expected
    reader = PressureReader(write(tmp_path / "memory", PSI_UNDER_PRESSURE))
    try:
        assert reader.read() == expected
    finally:
        reader.close()


def test_pressure_without_full_line(tmp_path: Path) -> None:
    """Old kernels print no `full` line for some resources: full reads 0."""
    text = PSI_UNDER_PRESSURE.splitlines()[0] + "\n"
    assert parse_pressure(text) == Pressure(62.51, 123456789, 0.0, 0)
    reader = PressureReader(write(tmp_path / "memory", text))
    try:
        assert reader.read() == Pressure(62.51, 123456789, 0.0, 0)
    finally:
        reader.close()


def test_not_a_pressure_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        parse_pressure(GB10_MEMINFO)
    with pytest.raises(ValueError):
        PressureReader(write(tmp_path / "memory", GB10_MEMINFO))


@pytest.mark.skipif(not os.path.exists("/proc/pressure/memory"), reason="kernel without PSI")
def test_real_pressure() -> None:
    """This machine's PSI: the reader and the parser see the same counters (which only grow)."""
    reader = PressureReader()
    try:
        first = reader.read()
        plain = parse_pressure(Path("/proc/pressure/memory").read_text())
        second = reader.read()
    finally:
        reader.close()
    assert first.some_total_us <= plain.some_total_us <= second.some_total_us
    assert first.full_total_us <= plain.full_total_us <= second.full_total_us
    assert 0 <= second.some_avg10 <= 100 and 0 <= second.full_avg10 <= 100


@pytest.mark.parametrize(
    ("trigger", "unprivileged"),
    [
        ("some 150000 1000000", "some 300000 2000000"),
        ("full 100000 500000", "full 400000 2000000"),
        ("some 500000 3000000", "some 666666 4000000"),
        ("some 150000 2000000", None),
    ],
)
def test_unprivileged_trigger_rounds_the_window(trigger: str, unprivileged: str | None) -> None:
    """Without CAP_SYS_RESOURCE the kernel takes only 2 s multiples; the stall share is kept."""
    assert _unprivileged(trigger) == unprivileged


@pytest.mark.skipif(not os.path.exists("/proc/pressure/memory"), reason="kernel without PSI")
def test_real_trigger_registers_or_falls_back() -> None:
    """On the real file the trigger registers (as asked, or rounded), or is refused quietly: never raises."""
    trigger = PsiTrigger.register("/proc/pressure/memory", "some 150000 1000000")
    if trigger is not None:
        assert trigger.spec in ("some 150000 1000000", "some 300000 2000000")
        trigger.close()


def test_trigger_on_a_plain_file_is_refused(tmp_path: Path) -> None:
    """A file that cannot be polled is no trigger (the sampler polls instead)."""
    assert PsiTrigger.register(write(tmp_path / "memory", PSI_UNDER_PRESSURE), "some 150000 1000000") is None
    assert PsiTrigger.register(tmp_path / "missing", "some 150000 1000000") is None


@pytest.mark.anyio
async def test_trigger_wakes_on_pollpri() -> None:
    """The wait ends at POLLPRI (here TCP urgent data, as PSI reports a trigger), and times out without it."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    trigger = PsiTrigger(os.dup(peer.fileno()), "test")
    try:
        assert await trigger.wait(0.05) is False
        client.send(b"!", socket.MSG_OOB)
        with anyio.fail_after(5):
            assert await trigger.wait(10.0) is True
        assert trigger.fired == 1
        assert await trigger.wait(0.05) is False  # edge-triggered: one wake per event
    finally:
        trigger.close()
        for s in (client, peer, server):
            s.close()


# ---- /dev/kmsg


def test_parse_records() -> None:
    """A kmsg record is `prio,seq,usec,flags;message` plus continuation lines; plain lines pass through."""
    assert parse_records(KMSG_RECORDS[2]) == [
        "Out of memory: Killed process 4242 (VLLM::EngineCor) total-vm:99999999kB, anon-rss:1800000kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:9000kB oom_score_adj:500"
    ]
    assert parse_records(b"plain line\nanother\n") == ["plain line", "another"]


@pytest.mark.parametrize(
    ("record", "pids", "event"),
    [
        (KMSG_RECORDS[0], (), KernelEvent.nvrm_no_memory),
        (KMSG_RECORDS[1], (), None),  # the oom-kill summary line: the "Killed process" line is the one counted
        (KMSG_RECORDS[2], (), KernelEvent.vllm_oom_kill),
        (KMSG_RECORDS[3], (), KernelEvent.other_oom_kill),
        (KMSG_RECORDS[4], (31337,), KernelEvent.vllm_oom_kill),  # named by PID: vLLM titled as python3
        (KMSG_RECORDS[4], (), KernelEvent.other_oom_kill),
        (KMSG_RECORDS[5], (), None),
    ],
)
def test_classify_line(record: bytes, pids: tuple[int, ...], event: KernelEvent | None) -> None:
    assert classify_line(parse_records(record)[0], pids) is event


def test_kernel_log_counts_new_lines_only(tmp_path: Path) -> None:
    """Opened at the end, the log counts what is written afterwards (a plain file stands in for kmsg)."""
    path = tmp_path / "kmsg"
    path.write_bytes(KMSG_RECORDS[0])  # before the guard started: not counted
    log = KernelLog.open(path)
    assert log is not None
    try:
        assert log.drain() == 0
        with open(path, "ab") as handle:
            handle.write(b"".join(KMSG_RECORDS))
        log.drain(vllm_pids={31337})
        assert (log.nvrm_errors, log.vllm_oom_kills, log.other_oom_kills) == (1, 2, 1)
        assert len(log.lines) == 4 and "NV_ERR_NO_MEMORY" in log.lines[0]
    finally:
        log.close()


def test_kernel_log_from_start_and_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(KMSG_RECORDS))
    log = KernelLog.open(path, from_start=True)
    assert log is not None
    log.drain()
    assert (log.nvrm_errors, log.vllm_oom_kills) == (1, 1)
    log.close()
    assert KernelLog.open(tmp_path / "missing") is None


def test_real_kmsg() -> None:
    """The real /dev/kmsg: opened non-blocking at the end, a drain returns at once; a neutral line written to
    the kernel log (when we may) is read back. Classification is tested on the fixtures above: a test never
    writes a fake driver error or OOM line into a real kernel log."""
    log = KernelLog.open("/dev/kmsg")
    if log is None:
        pytest.skip("/dev/kmsg is not readable here (the guard runs without it)")
    try:
        log.drain()
        try:
            fd = os.open("/dev/kmsg", os.O_WRONLY)
        except OSError:
            return
        try:
            os.write(fd, b"<6>sparkd guard test: kmsg reader check\n")
        finally:
            os.close(fd)
        seen = 0
        for _ in range(100):
            seen += log.drain()
            if seen:
                break
        assert seen >= 1
    finally:
        log.close()


# The driver's and the PCIe layer's fault lines (kept for the failure classifier, not counted by the guard).
XID_RECORD = b"4,2001,91000000,-;NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n"
AER_RECORD = (b"3,2002,91000001,-;pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: "
              b"0000:01:00.0\n")


@pytest.mark.parametrize(("record", "event"), [(XID_RECORD, KernelEvent.xid), (AER_RECORD, KernelEvent.aer)])
def test_fault_lines_are_recognised(record: bytes, event: KernelEvent) -> None:
    assert classify_line(parse_records(record)[0]) is event


def test_since_returns_what_explains_a_failure_after_the_mark(tmp_path: Path) -> None:
    """`since(mark)` gives the lines kept after the mark, without other processes' OOM kills: what the daemon
    passes to the classifier for the instance launched at the mark."""
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    log = KernelLog.open(path, from_start=True)
    assert log is not None
    try:
        with open(path, "ab") as handle:
            handle.write(KMSG_RECORDS[0])
        log.drain()
        mark = log.kept
        with open(path, "ab") as handle:
            handle.write(KMSG_RECORDS[2] + KMSG_RECORDS[3] + XID_RECORD + AER_RECORD)
        log.drain()
        lines = log.since(mark)
        assert [line.split(":")[0] for line in lines] == ["Out of memory", "NVRM", "pcieport 0000"]
        assert "chrome" not in " ".join(lines)
        assert len(log.since(0)) == 4 and log.since(log.kept) == ()
    finally:
        log.close()
