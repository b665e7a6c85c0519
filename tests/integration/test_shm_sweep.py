"""The /dev/shm sweep against real segments in a /dev/shm of the test's own (a private mount namespace):
other programs' live multiprocessing locks and SharedMemory are never touched (ecosystem.md §8), a segment held
only by a mapping is kept (tests/MUTATION.md M12), and what sparkd's own launch held is removed once it is dead.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import pytest
from test_shm_support import DECOY, PrivateShm, ask

from sparkd.preflight import shm
from sparkd.preflight.shmholders import ShmLedger
from sparkd.runtime import proctree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private /dev/shm needs root (CI runs as root)")
pytest_plugins = ["test_shm_support"]


def test_a_live_spawn_lock_and_shared_memory_of_another_program_are_never_removed(private_shm: PrivateShm) -> None:
    decoy, names = private_shm.start(DECOY, name="decoy")
    sem, psm = names.split()
    assert {sem, psm} <= private_shm.names()
    assert ask(decoy) == "child 0 7"  # the lock works by name before the sweep
    assert private_shm.sweep(dry_run=True) == []
    assert private_shm.sweep() == []
    assert {sem, psm} <= private_shm.names()
    assert ask(decoy) == "child 0 7"  # and after it: a new child still opens the lock by its name


# sparkd's own launch as vLLM builds it: a spawn-context lock (mapped only under glibc's temporary name), a
# SharedMemory ring, and an NCCL-style segment it maps and closes. It starts a helper child (as vLLM's
# EngineCore is one) so that the launch is a tree.
LAUNCH = """\
import ctypes, mmap, multiprocessing as mp, os, sys, time
from multiprocessing import shared_memory

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    ring = shared_memory.SharedMemory(create=True, size=1 << 20)
    fd = os.open("/dev/shm/nccl-launch01", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 20)
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mmap(None, 1 << 20, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    print("sem." + lock._semlock.name.lstrip("/"), ring.name, "nccl-launch01", flush=True)
    time.sleep(900)
"""


def kill_tree_children_first(pid: int) -> None:
    """SIGKILL a tree leaves first, so multiprocessing's resource tracker cannot clean up after its parent."""
    root = psutil.Process(pid)
    for proc in [*reversed(root.children(recursive=True)), root]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs([root], timeout=30)


def test_what_our_launch_held_is_removed_once_it_is_dead_and_only_then(private_shm: PrivateShm,
                                                                       tmp_path: Path) -> None:
    ledger = tmp_path / "shm-ledger.json"
    decoy, decoy_names = private_shm.start(DECOY, name="decoy")
    launch, names = private_shm.start(LAUNCH, name="launch")
    sem, ring, nccl = names.split()
    noted = ShmLedger(ledger).note(proctree.tree_pids(launch.pid), private_shm.dir)
    assert sorted(noted) == sorted([sem, ring, nccl])  # the semaphore found by inode: maps shows sem.XXXXXX
    assert f"/dev/shm/{sem}" not in Path(f"/proc/{launch.pid}/maps").read_text()
    assert private_shm.sweep(ledger=ledger) == []  # alive: every one is held, by descriptor or mapping
    assert {sem, ring, nccl} | set(decoy_names.split()) <= private_shm.names()
    kill_tree_children_first(launch.pid)
    assert {sem, ring, nccl} <= private_shm.names()  # leaked, as a SIGKILLed vLLM leaks them
    assert private_shm.sweep(ledger=ledger, dry_run=True) == sorted([sem, ring, nccl])
    assert private_shm.sweep(ledger=ledger) == sorted([sem, ring, nccl])
    assert not {sem, ring, nccl} & private_shm.names()
    assert set(decoy_names.split()) <= private_shm.names() and ask(decoy) == "child 0 7"
    assert ShmLedger(ledger).owned() == {}  # forgotten once gone


def test_without_the_ledger_a_dead_launchs_semaphore_is_left_alone(private_shm: PrivateShm) -> None:
    launch, names = private_shm.start(LAUNCH, name="launch")
    sem, ring, nccl = names.split()
    kill_tree_children_first(launch.pid)
    assert private_shm.sweep() == sorted([ring, nccl])  # vLLM's and NCCL's naming, unheld
    assert sem in private_shm.names()  # multiprocessing's naming alone proves nothing


def test_holders_are_found_by_inode_across_mount_namespaces(private_shm: PrivateShm) -> None:
    """Seen from outside the namespace, the paths differ (/proc/<pid>/root/dev/shm): the inode still matches."""
    _, names = private_shm.start(DECOY, name="decoy")
    assert set(names.split()) <= shm.held_names(private_shm.dir)
    assert shm.sweep(private_shm.dir, dry_run=True) == []
