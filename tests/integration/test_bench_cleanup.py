"""The group bench interrupted as an operator's Ctrl-C interrupts it (SIGINT to its process group) while its
hand-started ranks load: nothing it started is left running, its namespaces are gone, and it wrote no JSON into
the directory it ran from (its default goes to the temporary directory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from daemon_harness import alive, kill_tree
from waiting import until

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tests" / "bench" / "bench_group.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def ranks_of(bench: psutil.Process) -> list[psutil.Process]:
    """The stand-in ranks in the bench's tree; a process that ends while it is looked at is skipped (one such
    process used to make the whole answer empty, so a loaded machine never saw both ranks)."""
    try:
        tree = bench.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    ranks = []
    for p in tree:
        try:
            if "sparkd-standin" in " ".join(p.cmdline()):
                ranks.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return ranks


def test_an_interrupted_group_bench_leaves_nothing_running(tmp_path: Path) -> None:
    # ranks that load for 300 s: the interrupt surely comes while they load, however slow this machine is
    bench = subprocess.Popen([sys.executable, str(BENCH), "--sizes", "2", "--restarts", "0", "--bare", "1"],
                             cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "SPARKD_BENCH_STARTUP_S": "300"})
    seen: list[psutil.Process] = []
    try:
        root = psutil.Process(bench.pid)
        until(lambda: len(ranks_of(root)) == 2, "both ranks started by hand", 60)
        seen = [q for p in ranks_of(root) for q in (p, *p.children(recursive=True))]
        os.killpg(bench.pid, signal.SIGINT)  # Ctrl-C: the bench and its poller; the ranks run in their own sessions
        _, err = bench.communicate(timeout=120)
        left = alive(seen)
        assert left == [], f"left running: {[p.pid for p in left]}\n{err}"
        assert "Traceback" not in err and bench.returncode == 130, err
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"{bench.pid % 10000}g" not in namespaces, namespaces
        assert list(tmp_path.iterdir()) == []
    finally:
        if bench.poll() is None:  # a failed assertion above: Ctrl-C first, so that its own cleanup ends its daemons
            os.killpg(bench.pid, signal.SIGINT)
            try:
                bench.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.communicate()
        kill_tree(alive(seen))


def test_the_group_bench_writes_its_json_to_the_temporary_directory() -> None:
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    from benchkit import bench_parser

    path = Path(bench_parser(None, "bench-group.json").parse_args([]).json)
    assert path == Path(tempfile.gettempdir()) / "sparkd-bench-group.json"
