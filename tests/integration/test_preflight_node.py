"""Preflight checks against the real node: real processes (titled like vLLM's), real sockets, real /dev/shm
files, the real page cache. Each check: one case where it passes, one where it fixes, one where it must fail,
and (stale processes, ports, /dev/shm) decoys it must not touch."""

from __future__ import annotations

import json
import os
import socket
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from freeport import free_port
from test_preflight_support import (
    DECOY_ARGS,
    MAP_ONLY,
    PREFIX,
    Children,
    ProcView,
    config,
    context,
    leak,
    listener,
    open_paths,
    shm_owner,
    write_record,
)

from sparkd.host.gpu.model import GpuView
from sparkd.launch.rehearsal import SKIP_REASON, rehearsal_skips
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict
from sparkd.preflight.dev_shm import check_shm
from sparkd.preflight.gpu import check_gpu
from sparkd.preflight.host import check_host
from sparkd.preflight.launch_target import check_launch_target
from sparkd.preflight.memory import check_memory, read_meminfo
from sparkd.preflight.page_cache import check_page_cache
from sparkd.preflight.ports import check_ports
from sparkd.preflight.runner import watched_pids
from sparkd.preflight.stale_processes import check_stale_processes
from sparkd.runtime.proctree import MARKER_ENV, launch_marker
from sparkd.state.lock import NodeLock
from sparkd.supervisor.failures import FailureClass

pytest_plugins = ["test_preflight_support"]  # fixtures: children, view, shm_dir
P = PREFIX  # the title prefix of the tests' launches: VLLMPFTEST::Worker_TP0


def run(check: object, ctx: PreflightContext) -> CheckResult:
    async def go() -> CheckResult:
        return await check(ctx)  # type: ignore[operator]

    return anyio.run(go)


# ---- stale processes -------------------------------------------------------------------------------------------


def test_stale_none(tmp_path: Path, children: Children, view: ProcView) -> None:
    decoy = children(args=DECOY_ARGS)
    result = run(check_stale_processes, context(tmp_path, view.add(decoy.pid)))
    assert result.verdict is Verdict.ok and result.found == "no stale vLLM process"
    assert decoy.alive()


def test_stale_orphans_are_ended_neighbours_decoys_and_the_watched_instance_survive(
        tmp_path: Path, children: Children, view: ProcView) -> None:
    engine = children(title=f"{P}::EngineCore", orphan=True)  # their launcher is gone: the field's litter
    worker = children("signal.signal(signal.SIGTERM, signal.SIG_IGN)", title=f"{P}::Worker_TP0",
                      orphan=True)  # needs SIGKILL
    # Titled with our own prefix, but its launcher (this test) lives: a neighbour's live vLLM, never stale.
    live = children(title=f"{P}::Worker_TP0")
    decoy = children(args=DECOY_ARGS)  # its command line mentions VLLM::Worker_TP0 and vllm serve
    decoy_code = children(f"# {P}::Worker_TP1 vllm", orphan=True)  # and one whose code does
    watched = children(title=f"{P}::Worker_TP0", orphan=True)
    # Titled by a vLLM with the default prefix: not our launch's.
    other = children(title="VLLM::Worker_TP0", orphan=True)
    # Our prefix, orphaned, but another user's (security.md §7: a user titles their own processes as they like)
    nobody = children("os.setgid(65534)\nos.setuid(65534)", title=f"{P}::Worker_TP1", orphan=True)
    ctx = context(tmp_path, view.add(engine.pid, worker.pid, live.pid, decoy.pid, decoy_code.pid, watched.pid,
                                     other.pid, nobody.pid, os.getpid()),
                  protect=frozenset({watched.pid}), preflight={"kill_grace_s": 0.5})
    result = run(check_stale_processes, ctx)
    assert result.verdict is Verdict.fixed, result
    assert f"{engine.pid} {P}::EngineCore (orphaned)" in result.found
    assert f"{worker.pid} {P}::Worker_TP0 (orphaned)" in result.found
    assert "ended 2 process(es)" in result.did
    assert not engine.alive() and not worker.alive()
    # (other sparkd instances on this host may end `other` meanwhile: with the default prefix it is their litter)
    assert live.alive() and decoy.alive() and decoy_code.alive() and watched.alive() and nobody.alive()
    for spared in (live, other, watched, nobody):
        assert f"{spared.pid} " not in result.found
    assert f"{P}::Worker_TP0" in " ".join(decoy.cmdline())  # the decoy really mentions it


def test_stale_a_live_trees_titled_processes_are_neighbours(tmp_path: Path, children: Children,
                                                            view: ProcView) -> None:
    """A titled process whose parent (this test, standing in for an API server or a person's shell) lives is a
    neighbour even when the view cannot show that parent: its launcher may be alive, so nothing is proven."""
    shown = children(title=f"{P}::EngineCore")
    unseen = children(title=f"{P}::Worker_TP0")
    ctx = context(tmp_path, view.add(shown.pid, unseen.pid, os.getpid()), preflight={"kill_grace_s": 0.5})
    result = run(check_stale_processes, ctx)  # their parent shown: alive, and no reaper
    assert result.verdict is Verdict.ok and result.found == "no stale vLLM process", result
    os.unlink(view.root / str(os.getpid()))  # the parent not shown: still not proven gone
    result = run(check_stale_processes, ctx)
    assert result.verdict is Verdict.ok, result
    assert shown.alive() and unseen.alive()


def test_stale_previous_launch_from_the_record(tmp_path: Path, children: Children, view: ProcView) -> None:
    marker = launch_marker()
    api_server = children(args=("serve", "/models/m"), env={MARKER_ENV: marker})  # untitled, like vLLM's API server
    reused = children(args=DECOY_ARGS)  # a record pointing at its PID with another create time: a reused PID
    ctx = context(tmp_path, view.add(api_server.pid, reused.pid))
    write_record(ctx.cfg, api_server.pid, marker=marker)
    result = run(check_stale_processes, ctx)
    assert result.verdict is Verdict.fixed and f"{api_server.pid} " in result.found
    assert "(previous launch)" in result.found
    assert not api_server.alive()

    write_record(ctx.cfg, reused.pid, create_time=psutil.Process(reused.pid).create_time() - 1000)
    result = run(check_stale_processes, ctx)
    assert result.verdict is Verdict.ok and reused.alive()


def test_stale_a_forged_record_ends_nothing(tmp_path: Path, children: Children, view: ProcView) -> None:
    """reliability.md 3e: a record naming an unrelated process with its exact create time."""
    unrelated = children(args=("serve", "/models/m"))  # what the config launches would look like, but no marker
    marked_elsewhere = children(env={MARKER_ENV: "another-launch"})
    ctx = context(tmp_path, view.add(unrelated.pid, marked_elsewhere.pid))
    for pid, marker in ((unrelated.pid, None), (unrelated.pid, "forged"), (marked_elsewhere.pid, "forged")):
        write_record(ctx.cfg, pid, marker=marker)
        result = run(check_stale_processes, ctx)
        assert result.verdict is Verdict.ok, (pid, marker, result)
    assert unrelated.alive() and marked_elsewhere.alive()


def test_stale_dry_run_touches_nothing(tmp_path: Path, children: Children, view: ProcView) -> None:
    worker = children(title=f"{P}::Worker_TP1", orphan=True)
    result = run(check_stale_processes, context(tmp_path, view.add(worker.pid), dry_run=True))
    assert result.verdict is Verdict.warn and "would SIGTERM" in result.did
    assert worker.alive()


# ---- ports ------------------------------------------------------------------------------------------------------


def test_ports_free(tmp_path: Path, view: ProcView) -> None:
    port = free_port()
    result = run(check_ports, context(tmp_path, view, launch={"port": port}))
    assert result.verdict is Verdict.ok and result.found == f"API port (launch.port) {port} is free"


def test_ports_held_by_stale_vllm_are_freed(tmp_path: Path, children: Children, view: ProcView) -> None:
    holder, port = listener(children, title=f"{P}::Worker_TP0", orphan=True)
    master, master_port = listener(children, title=f"{P}::Worker_TP0", orphan=True)
    ctx = context(tmp_path, view.add(holder.pid, master.pid), launch={"port": port},
                  node={"role": "head"}, cluster={"master_port": master_port})
    result = run(check_ports, ctx)
    assert result.verdict is Verdict.fixed, result
    assert f"API port (launch.port) {port} was held by stale vLLM PID {holder.pid} ({P}::Worker_TP0)" in result.found
    assert f"master port (torch.distributed TCPStore) {master_port} was held by stale vLLM PID {master.pid}" in (
        result.found)
    assert not holder.alive() and not master.alive()
    with socket.socket() as sock:  # and the port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_ports_held_by_anything_else_fail_naming_it(tmp_path: Path, children: Children, view: ProcView) -> None:
    decoy, port = listener(children, args=DECOY_ARGS)
    result = run(check_ports, context(tmp_path, view.add(decoy.pid), launch={"port": port}))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.port_in_use
    assert f"is held by PID {decoy.pid} ({decoy.cmdline()[0]} -c import mmap" in result.found
    assert f"{P}::Worker_TP0 VLLM::Worker_TP0 vllm serve" in " ".join(decoy.cmdline())
    assert "not a stale vLLM process" in result.found
    assert decoy.alive()


def test_ports_dry_run_frees_nothing(tmp_path: Path, children: Children, view: ProcView) -> None:
    holder, port = listener(children, title=f"{P}::Worker_TP0", orphan=True)
    result = run(check_ports, context(tmp_path, view.add(holder.pid), launch={"port": port}, dry_run=True))
    assert result.verdict is Verdict.warn and "would end" in result.did
    assert holder.alive()


# ---- /dev/shm ---------------------------------------------------------------------------------------------------


def test_shm_clean(tmp_path: Path, shm_dir: Path) -> None:
    (shm_dir / "not-a-segment").write_bytes(b"x")
    result = run(check_shm, context(tmp_path, shm_dir=shm_dir))
    assert result.verdict is Verdict.ok and (shm_dir / "not-a-segment").exists()


def test_shm_leaks_removed_live_owners_and_decoys_kept(tmp_path: Path, children: Children, shm_dir: Path) -> None:
    leaked = [leak(shm_dir / "psm_0badf00d"), leak(shm_dir / "nccl-x1"), leak(shm_dir / "torch_999999999_7_0")]
    mapped = shm_owner(children, shm_dir / "psm_11ve0000")  # only mapped by a live process (no descriptor)
    assert str(shm_dir / "psm_11ve0000") not in open_paths(mapped.pid)
    assert str(shm_dir / "psm_11ve0000") in Path(f"/proc/{mapped.pid}/maps").read_text()
    opened = shm_owner(children, shm_dir / "nccl-open", how="open")  # only held open by a live process
    decoy = leak(shm_dir / "vllm_psm_not_ours")  # does not match the patterns
    semaphore = leak(shm_dir / "sem.mp-abc12345", 4096)  # multiprocessing's naming: nobody's proof it is ours
    live_torch = leak(shm_dir / f"torch_{opened.pid}_1_0")  # its creator still runs: it may be in flight
    result = run(check_shm, context(tmp_path, shm_dir=shm_dir))
    assert result.verdict is Verdict.fixed, result
    assert "3 leaked segment(s)" in result.found
    assert f"freed {3 << 20} bytes" in result.did
    assert not any(p.exists() for p in leaked)
    assert (shm_dir / "psm_11ve0000").exists() and (shm_dir / "nccl-open").exists() and decoy.exists()
    assert semaphore.exists() and live_torch.exists()
    assert mapped.alive() and opened.alive()


def test_shm_a_stale_vllm_processs_semaphore_is_noted_before_the_kill_and_removed_after(
        tmp_path: Path, children: Children, view: ProcView, shm_dir: Path) -> None:
    stale_engine = children(f"fd = os.open({str(shm_dir / 'sem.mp-st4le001')!r}, os.O_CREAT | os.O_RDWR, 0o600)\n"
                            "os.ftruncate(fd, 1 << 20)\n" + MAP_ONLY, title=f"{P}::EngineCore", orphan=True)
    unowned = leak(shm_dir / "sem.mp-n0tours1", 4096)
    ctx = context(tmp_path, view.add(stale_engine.pid), shm_dir=shm_dir)
    assert run(check_stale_processes, ctx).verdict is Verdict.fixed and not stale_engine.alive()
    assert "sem.mp-st4le001" in (ctx.cfg.paths.state_dir / "shm-ledger.json").read_text()
    result = run(check_shm, ctx)
    assert result.verdict is Verdict.fixed and "1 leaked segment(s)" in result.found
    assert "sem.mp-st4le001" in result.found
    assert not (shm_dir / "sem.mp-st4le001").exists() and unowned.exists()


def test_shm_another_users_segments_are_never_the_launchs(
        tmp_path: Path, children: Children, view: ProcView, shm_dir: Path) -> None:
    """security.md §7: another user's unheld psm_* is not removed by its naming; a stale process holding another
    user's file (through an O_PATH descriptor, or even open for real) does not make it the launch's; its own
    file, held for real, is noted and removed once it is gone."""
    theirs = leak(shm_dir / "psm_user1res")
    path_only, opened = leak(shm_dir / "sem.mp-user1a", 4096), leak(shm_dir / "sem.mp-user1b", 4096)
    for path in (theirs, path_only, opened):
        os.chown(path, 1, 1)
        path.chmod(0o600)
    mine = shm_dir / "sem.mp-m1ne0001"
    root_path_only = leak(shm_dir / "sem.mp-r00tpath", 4096)  # the holder's own uid, but only an O_PATH to it
    engine = children(f"a = os.open({str(path_only)!r}, os.O_PATH)\nb = os.open({str(opened)!r}, os.O_RDWR)\n"
                      f"c = os.open({str(root_path_only)!r}, os.O_PATH)\n"
                      f"fd = os.open({str(mine)!r}, os.O_CREAT | os.O_RDWR, 0o600)\nos.ftruncate(fd, 4096)\n",
                      title=f"{P}::Worker_TP1", orphan=True)
    ctx = context(tmp_path, view.add(engine.pid), shm_dir=shm_dir)
    assert run(check_stale_processes, ctx).verdict is Verdict.fixed and not engine.alive()
    ledger = (ctx.cfg.paths.state_dir / "shm-ledger.json").read_text()
    assert mine.name in ledger and "user1" not in ledger and root_path_only.name not in ledger
    result = run(check_shm, ctx)
    assert result.verdict is Verdict.fixed and result.found.endswith(f"1 leaked segment(s) no live process holds: "
                                                                     f"{mine.name}"), result
    assert not mine.exists() and theirs.exists() and path_only.exists() and opened.exists()
    assert root_path_only.exists()


def test_shm_dry_run_and_too_little_room(tmp_path: Path, children: Children, shm_dir: Path) -> None:
    held = shm_owner(children, shm_dir / "psm_ne1ghb0r", how="open")  # a neighbour's: named, never removed
    segment = leak(shm_dir / "psm_deadbeef")
    result = run(check_shm, context(tmp_path, shm_dir=shm_dir, dry_run=True))
    assert result.verdict is Verdict.warn and f"would remove them, freeing {1 << 20} bytes" in result.did
    assert segment.exists()
    huge = os.statvfs(shm_dir).f_blocks * os.statvfs(shm_dir).f_frsize // (1 << 20) + 1
    result = run(check_shm, context(tmp_path, shm_dir=shm_dir, preflight={"shm_min_free_mib": huge}))
    assert result.verdict is Verdict.fail and "free, less than the" in result.found
    assert "; the largest: psm_ne1ghb0r (0 B, held by PID " in result.found  # sparse: nothing allocated
    assert f"held by PID {held.pid} ({held.cmdline()[0]} -c import mmap" in result.found
    assert not segment.exists()  # the sweep still ran
    assert (shm_dir / "psm_ne1ghb0r").exists() and held.alive()


# ---- page cache and memory ------------------------------------------------------------------------------------

GIB_KB = 1 << 20


def meminfo(total_gib: float, free_gib: float, cached_gib: float = 0.0, *, driver_gib: float = 0.0) -> str:
    rest = total_gib - free_gib - cached_gib - driver_gib - 1
    kb = {"MemTotal": total_gib, "MemFree": free_gib, "MemAvailable": free_gib + cached_gib, "Buffers": 0,
          "Cached": cached_gib, "Shmem": 0, "Active": cached_gib, "Inactive": rest, "Slab": 0.5,
          "PageTables": 0.5, "Unevictable": 0}
    return "".join(f"{k}: {int(v * GIB_KB)} kB\n" for k, v in kb.items())


def test_page_cache_dropped_for_real(tmp_path: Path) -> None:
    """The one real drop on this machine: cache a 128 MiB file of ours, sync, drop, see Cached fall."""
    data = tmp_path / "cached.bin"
    with open(data, "wb") as handle:
        handle.write(os.urandom(1 << 20) * 128)
    data.read_bytes()
    before = read_meminfo(Path("/proc")).cached
    result = run(check_page_cache, context(tmp_path))
    data.unlink()
    assert result.verdict is Verdict.fixed, result
    reclaimed = int(result.did.split("reclaimed ")[1].split(" bytes")[0])
    assert reclaimed > 64 << 20 and f"{before}" not in result.found  # found shows GiB/MiB, did the bytes


def test_page_cache_write_path_dry_run_and_off(tmp_path: Path, view: ProcView) -> None:
    view.write("meminfo", meminfo(119.7, 11, 100))
    knob = view.write("sys/vm/drop_caches", "")
    result = run(check_page_cache, context(tmp_path, view, dry_run=True))
    assert result.verdict is Verdict.warn and "would sync and drop caches" in result.did
    assert knob.read_text() == ""
    result = run(check_page_cache, context(tmp_path, view, preflight={"drop_caches": False}))
    assert result.verdict is Verdict.ok and "not dropped" in result.found and knob.read_text() == ""
    result = run(check_page_cache, context(tmp_path, view))
    assert knob.read_text() == "3\n" and "reclaimed 0 bytes" in result.did  # a file does not drop anything


def test_page_cache_cannot_drop_is_a_warning(tmp_path: Path, view: ProcView) -> None:
    view.write("meminfo", meminfo(119.7, 11, 100))
    (view.root / "sys/vm/drop_caches").mkdir(parents=True)  # not writable as a file
    result = run(check_page_cache, context(tmp_path, view))
    assert result.verdict is Verdict.warn and "cannot drop caches" in result.found


def test_memory_enough_on_this_machine(tmp_path: Path) -> None:
    result = run(check_memory, context(tmp_path, launch={"gpu_memory_utilization": 0.05},
                                       preflight={"memory_margin_gib": 0}))
    assert result.verdict is Verdict.ok and "covers 0.05 x MemTotal" in result.found


def test_memory_short_names_the_top_holders(tmp_path: Path, children: Children, view: ProcView) -> None:
    hog = children("hog = bytearray(96 << 20)\nhog[::4096] = b'x' * len(hog[::4096])", args=("--hog",))
    small = children()
    view.add(hog.pid, small.pid).write("meminfo", meminfo(119.7, 40, 0))
    result = run(check_memory, context(tmp_path, view))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.free_memory_refusal
    assert "MemFree 40.0 GiB is 69.7 GiB short of 0.90 x MemTotal 119.7 GiB + 2.0 GiB margin" in result.found
    top = result.found.split("top memory holders: ")[1]
    first = top.split(", PID")[0]
    assert first.startswith(f"PID {hog.pid} ") and first.endswith(" MiB)"), top
    assert float(first.rsplit("(", 1)[1].split()[0]) >= 96
    assert "reboot" not in result.found


def h100(name: str) -> Any:
    """A real NVML reading of the H100 host (tests/data/gpu) as the check's GPU port."""
    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "gpu" / name).read_text())
    view = GpuView.from_json(data.get("view", data))

    async def read() -> GpuView:
        return view

    return read


def test_memory_on_discrete_gpus_is_vllms_rule_per_device(tmp_path: Path, view: ProcView) -> None:
    """A host whose MemFree could never cover 0.9 x its MemTotal: with the H100s' reading the check is vLLM's rule
    on each GPU of the launch, and the real survivor (PID 946, 9.5 GiB on GPU 0) is named; GPU 1 alone passes."""
    view.write("meminfo", meminfo(119.7, 40, 0))
    on_both = replace(context(tmp_path, view), gpus=h100("h100x2-incident-gpu.json"))
    result = run(check_memory, on_both)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.free_memory_refusal
    assert "GPU 0 (NVIDIA H100 80GB HBM3) [GPU-3ac5e21a" in result.found and "held by PID 946" in result.found
    on_1 = replace(context(tmp_path, view, launch={"env": {"CUDA_VISIBLE_DEVICES": "1"}}),
                   gpus=h100("h100x2-incident-gpu.json"))
    result = run(check_memory, on_1)
    assert result.verdict is Verdict.ok and result.found.startswith("GPU 1 (NVIDIA H100 80GB HBM3): free 78.9 GiB")


def test_memory_short_with_nothing_to_explain_it_says_reboot(tmp_path: Path, view: ProcView) -> None:
    view.write("meminfo", meminfo(119.7, 80, driver_gib=35))
    result = run(check_memory, context(tmp_path, view))
    assert result.verdict is Verdict.fail and "a reboot is likely needed" in result.found
    assert "35.0 GiB is held outside any process or cache" in result.found


def test_memory_dry_run_counts_the_cache_it_would_drop(tmp_path: Path, view: ProcView) -> None:
    view.write("meminfo", meminfo(119.7, 11, 100))
    result = run(check_memory, context(tmp_path, view, dry_run=True))
    assert result.verdict is Verdict.warn and "only once the page cache" in result.found
    result = run(check_memory, context(tmp_path, view))  # not a dry run: the cache should have been dropped
    assert result.verdict is Verdict.fail


def test_memory_and_page_cache_skip_only_when_told(tmp_path: Path, view: ProcView) -> None:
    """A rehearsal's skips come through the context (sparkd.launch.rehearsal); the stand-in's argv alone skips
    nothing."""
    view.write("meminfo", meminfo(119.7, 1, 100))
    standin = {"executable": str(Path(os.__file__).parent / "sparkd-standin")}
    told = replace(context(tmp_path, view, launch=standin), skip=rehearsal_skips())
    for check in (check_memory, check_page_cache):
        result = run(check, told)
        assert result.verdict is Verdict.ok and result.found == f"skipped ({SKIP_REASON})"
    assert run(check_memory, context(tmp_path, view, launch=standin)).verdict is Verdict.fail


# ---- host hardening -------------------------------------------------------------------------------------------

SWAPS_ON = "Filename\tType\tSize\tUsed\tPriority\n/swap.img  file  8388604  0  -2\n"
SWAPS_OFF = "Filename\tType\tSize\tUsed\tPriority\n"


def hardening(view: ProcView, swaps: str, min_free: int, overcommit: int) -> None:
    view.write("swaps", swaps)
    view.write("sys/vm/min_free_kbytes", f"{min_free}\n")
    view.write("sys/vm/overcommit_memory", f"{overcommit}\n")


def test_host_hardened(tmp_path: Path, view: ProcView) -> None:
    hardening(view, SWAPS_OFF, 3145728, 0)
    result = run(check_host, context(tmp_path, view))
    assert result.verdict is Verdict.ok


def test_host_reported_then_applied(tmp_path: Path, view: ProcView) -> None:
    hardening(view, SWAPS_ON, 67584, 1)
    result = run(check_host, context(tmp_path, view))
    assert result.verdict is Verdict.warn and "reported only" in result.did
    assert "swap is on: /swap.img (8.0 GiB), want off" in result.found
    assert "vm.min_free_kbytes is 67584 (66.0 MiB), want >= 1572864 (1.5 GiB)" in result.found
    assert "vm.overcommit_memory is 1, want 0" in result.found
    dry = run(check_host, context(tmp_path, view, dry_run=True, preflight={"apply_host": True}))
    assert dry.verdict is Verdict.warn and dry.did.startswith("would apply")
    assert (view.root / "sys/vm/min_free_kbytes").read_text() == "67584\n"

    swapoff = ("sh", "-c", f"printf 'Filename\\tType\\tSize\\tUsed\\tPriority\\n' > {view.root / 'swaps'}")
    ctx = context(tmp_path, view, preflight={"apply_host": True, "min_free_kbytes": 3145728})
    ctx = type(ctx)(**{**ctx.__dict__, "swapoff": swapoff})
    result = run(check_host, ctx)
    assert result.verdict is Verdict.fixed, result
    assert (view.root / "sys/vm/min_free_kbytes").read_text() == "3145728\n"
    assert (view.root / "sys/vm/overcommit_memory").read_text() == "0\n"
    assert "/swap.img" not in (view.root / "swaps").read_text()


def test_host_apply_that_does_not_stick_fails(tmp_path: Path, view: ProcView) -> None:
    hardening(view, SWAPS_ON, 3145728, 0)
    ctx = context(tmp_path, view, preflight={"apply_host": True})
    ctx = type(ctx)(**{**ctx.__dict__, "swapoff": ("sh", "-c", "echo 'swapoff: /swap.img: busy' >&2; exit 1")})
    result = run(check_host, ctx)
    assert result.verdict is Verdict.fail and "swapoff: /swap.img: busy" in result.found


# ---- GPU compute processes (no NVML here: a fake nvidia-smi on PATH, the fallback) ----------------------------

# The H100 host's real `nvidia-smi --query-gpu` line (tests/data/gpu/h100x2-nvidia-smi-query-gpu.csv), by index.
QUERY_GPU_LINE = "{index}, {uuid}, NVIDIA H100 80GB HBM3, 81559, 0, 81079, 0, 0, 76.61, 700.00, 57, 345, 2619, 0, 0\n"


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str,
             gpus: str = "0, GPU-0000\n1, GPU-1111\n") -> None:
    """An nvidia-smi answering the fallback's two queries (sparkd.host.gpu.smi): the GPUs (``gpus``: index, UUID) and
    the compute apps (``output``: pid, name, GPU UUID)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    listed = "".join(QUERY_GPU_LINE.format(index=i.strip(), uuid=u.strip())
                     for i, u in (line.split(",") for line in gpus.splitlines() if line))
    apps = "".join(f"{p.strip()}, {u.strip()}, 1024\n" for p, _, u in (line.split(",") for line in
                                                                     output.splitlines() if line))
    smi.write_text("#!/bin/sh\n"
                   'case "$1" in --query-gpu=*) cat <<\'EOF\'\n' + listed + "EOF\n;;\n"
                   "--query-compute-apps=*) cat <<'EOF'\n" + apps + "EOF\n;;\n*) exit 9;;\nesac\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")


def test_gpu_without_a_driver_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run(check_gpu, context(tmp_path))
    if "skipped" not in result.found:
        pytest.skip("this machine has an NVIDIA driver")
    assert result.verdict is Verdict.ok and result.found in (
        "skipped: no NVIDIA driver here (libnvidia-ml.so cannot be loaded)",
        "skipped: the NVML bindings are not installed (Python package nvidia-ml-py)")


def test_gpu_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: ProcView) -> None:
    fake_smi(tmp_path, monkeypatch, "")
    assert run(check_gpu, context(tmp_path, view)).verdict is Verdict.ok


def test_gpu_leftover_stale_vllm_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: Children,
                                         view: ProcView) -> None:
    worker = children(title=f"{P}::Worker_TP0", orphan=True)
    fake_smi(tmp_path, monkeypatch, f"{worker.pid}, /usr/bin/python3, GPU-0000\n")
    result = run(check_gpu, context(tmp_path, view.add(worker.pid)))
    assert result.verdict is Verdict.fixed and f"PID {worker.pid} ({P}::Worker_TP0)" in result.found
    assert not worker.alive()


def test_gpu_leftover_other_process_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: Children,
                                          view: ProcView) -> None:
    decoy = children(args=DECOY_ARGS)
    fake_smi(tmp_path, monkeypatch, f"{decoy.pid}, /usr/bin/python3, GPU-1111\n")
    result = run(check_gpu, context(tmp_path, view.add(decoy.pid)))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.gpu_busy
    assert f"PID {decoy.pid} ({decoy.cmdline()[0]} -c import mmap" in result.found
    assert decoy.alive()


def test_gpu_a_compute_process_on_another_gpu_is_not_a_leftover(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: Children, view: ProcView) -> None:
    """A neighbour's vLLM on GPU 1 of a two-GPU box: a launch on GPU 0 (CUDA_VISIBLE_DEVICES) leaves it alone and
    launches; a launch that names no GPU (so uses both) fails naming it."""
    neighbour = children(title=f"{P}::Worker_TP0")  # a live tree's: a neighbour
    fake_smi(tmp_path, monkeypatch, f"{neighbour.pid}, /usr/bin/python3, GPU-1111\n")
    env = {"VLLM_PROCESS_NAME_PREFIX": PREFIX, "CUDA_VISIBLE_DEVICES": "0"}
    result = run(check_gpu, context(tmp_path, view.add(neighbour.pid), launch={"env": env}))
    assert result.verdict is Verdict.ok, result
    assert result.found == "no leftover GPU compute process; 1 on GPUs this launch does not use, left alone"
    result = run(check_gpu, context(tmp_path, view, launch={"env": {"VLLM_PROCESS_NAME_PREFIX": PREFIX}}))
    assert result.verdict is Verdict.fail and f"PID {neighbour.pid} ({P}::Worker_TP0)" in result.found
    assert neighbour.alive()


# ---- launch target (process runtime; the Docker side is in test_preflight_docker.py) ---------------------------


def model_dir(root: Path, shards: int = 2, *, drop: int | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    (root / "model.safetensors.index.json").write_text(
        '{"weight_map": {' + ", ".join(f'"w{k}": "{n}"' for k, n in enumerate(names)) + "}}")
    for k, name in enumerate(names, 1):
        if k != drop:
            (root / name).write_bytes(b"\0")
    return root


def test_target_and_local_model_present(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "models" / "m")
    result = run(check_launch_target, context(tmp_path, launch={"model": str(model)}))
    assert result.verdict is Verdict.ok, result
    assert f"model {model}: config.json and all 2 shards of model.safetensors.index.json" in result.found


def test_target_missing_script_is_a_config_error(tmp_path: Path) -> None:
    ghost = tmp_path / "workspace" / "vllm-head-090.sh"
    result = run(check_launch_target, context(tmp_path, launch={"script": str(ghost)}))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert result.found == f"the launch target {ghost} does not exist"


def test_target_model_missing_a_shard_is_a_config_error(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "models" / "m", shards=3, drop=2)
    result = run(check_launch_target, context(tmp_path, launch={"model": str(model)}))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert "is missing 1 of 3 weight shards listed in model.safetensors.index.json on this host: " \
           "model-00002-of-00003.safetensors" in result.found


# ---- sparkd preflight beside a running daemon -------------------------------------------------------------------


def test_one_shot_preflight_spares_the_instance_a_running_daemon_watches(tmp_path: Path, children: Children) -> None:
    instance = children(args=("serve", "/models/m"))
    cfg = config(tmp_path)
    write_record(cfg, instance.pid)
    assert watched_pids(cfg) == frozenset()  # no daemon: the recorded launch is a leftover, and stale
    with NodeLock(cfg.paths.state_dir / "sparkd.lock"):  # a daemon holds the node
        assert watched_pids(cfg) == frozenset({instance.pid})
    assert watched_pids(cfg) == frozenset()
