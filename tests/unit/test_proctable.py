"""The process table's reading of /proc where a process's ``ns/pid`` link cannot be read (no ptrace access)."""

from __future__ import annotations

import os
from pathlib import Path

from sparkd.preflight import proctable

STAT = "241 (sleep) S 1 241 241 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 4200 1000 100 0 0 0 0 0 0 0 0 0 0 0 0 17 0\n"


def fake_proc(tmp_path: Path, *, nspid: str, own_nspid: str) -> Path:
    proc = tmp_path / "proc"
    target = proc / "241"
    target.mkdir(parents=True)
    (target / "status").write_text(f"Name:\tsleep\nState:\tS (sleeping)\nPPid:\t1\nUid:\t0\t0\t0\t0\nNSpid:\t{nspid}\n")
    (target / "stat").write_text(STAT)
    (target / "cmdline").write_bytes(b"VLLM::Worker_TP1\x001000\x00")
    own = proc / "self"
    (own / "ns").mkdir(parents=True)
    (own / "status").write_text(f"Name:\tsparkd\nNSpid:\t{own_nspid}\n")
    os.symlink("pid:[4026532181]", own / "ns" / "pid")
    return proc


def test_an_unreadable_namespace_link_is_read_from_nspid_when_both_run_in_procs_namespace(tmp_path: Path) -> None:
    proc = proctable.read_proc(fake_proc(tmp_path, nspid="241", own_nspid="135"), 241, boot_time=0.0)
    assert proc is not None and proc.pid_ns == 4026532181


def test_a_process_in_a_nested_namespace_stays_unknown(tmp_path: Path) -> None:
    proc = proctable.read_proc(fake_proc(tmp_path, nspid="241 7", own_nspid="135"), 241, boot_time=0.0)
    assert proc is not None and proc.pid_ns is None


def test_sparkd_in_a_nested_namespace_proves_nothing(tmp_path: Path) -> None:
    proc = proctable.read_proc(fake_proc(tmp_path, nspid="241", own_nspid="135 2"), 241, boot_time=0.0)
    assert proc is not None and proc.pid_ns is None
