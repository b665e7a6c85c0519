"""Process identity and the signal guards, against real processes this test starts (and ends, by PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import anyio
import psutil
import pytest

from sparkd.guard.kill import Victims
from sparkd.runtime import proctree
from sparkd.runtime.proctree import MARKER_ENV, Expected, ProcessIdentity, same_identity, same_process

PY = sys.executable


class Started:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def __call__(self, argv: list[str], env: dict[str, str] | None = None, ready: bool = True
                 ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                env={**os.environ, **env} if env else None)
        self.procs.append(proc)
        if ready:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def end(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            if proc.stdout:
                proc.stdout.close()


@pytest.fixture
def started() -> Iterator[Started]:
    made = Started()
    yield made
    made.end()


def python(body: str) -> list[str]:
    return [PY, "-c", "import signal, sys, time\n" + textwrap.dedent(body) + "\nprint('ready', flush=True)\n"
            "time.sleep(600)\n"]


def terminate(pid: int, grace_s: float, **kw: object) -> list[int]:
    return anyio.run(lambda: proctree.terminate_tree(pid, grace_s, **kw))  # type: ignore[arg-type]


def test_terminate_tree_sigkills_a_child_that_ignores_sigterm(started: Started) -> None:
    """tests/MUTATION.md M32: without the SIGKILL after the grace, a stop would wait forever."""
    child = started(python("signal.signal(signal.SIGTERM, signal.SIG_IGN)"))
    begun = time.monotonic()
    assert terminate(child.pid, 0.5) == [child.pid]
    assert child.wait(10) == -signal.SIGKILL
    assert time.monotonic() - begun >= 0.5  # it had its grace


def test_terminate_tree_ends_a_tree_that_honours_sigterm_without_sigkill(started: Started) -> None:
    child = started(python("pass"))
    assert terminate(child.pid, 10) == []
    assert child.wait(10) == -signal.SIGTERM


def test_tree_lists_the_root_first_and_roots_finds_it(started: Started) -> None:
    """A stop lists the tree (the kernel's children lists) right before its SIGTERM to the first member; the
    guard SIGTERMs the root it finds among the tree's PIDs."""
    parent = started(python("import subprocess; kid = subprocess.Popen(['sleep', '600'])"))
    members = proctree.tree(parent.pid)
    try:
        assert [p.pid for p in members[:1]] == [parent.pid] and len(members) == 2
        assert members[1].ppid() == parent.pid
        pids = {p.pid for p in members}
        assert proctree.roots(pids) == {parent.pid}
        assert proctree.roots(pids - {parent.pid}) == {members[1].pid}  # a part cut off is its own root
        assert proctree.tree_pids(parent.pid) == pids
    finally:
        for member in reversed(members):
            member.kill()


def test_create_time_is_part_of_the_identity(started: Started) -> None:
    """tests/MUTATION.md M11, as a unit test: a reused PID (same PID, another create time) is not the process."""
    child = started(python("pass"))
    created = psutil.Process(child.pid).create_time()
    assert same_process(child.pid, created) is not None
    assert same_process(child.pid, created - 1.0) is None
    assert same_identity(ProcessIdentity(child.pid, created - 1.0, marker="m"), None) is None
    assert terminate(child.pid, 0.5, identity=ProcessIdentity(child.pid, created - 1.0)) == []
    assert child.poll() is None


@pytest.mark.parametrize("pid", [0, 1, -5])
def test_no_pid_at_or_below_1_is_ever_signalled(pid: int) -> None:
    assert proctree.never_signal(pid)
    assert same_process(pid, 0.0) is None
    if pid == 1:  # signal 0 only checks that the signal could be sent: harmless even unguarded
        assert proctree.signal_all([psutil.Process(1)], 0) == []
    assert Victims([pid]).pids == []


def test_terminate_tree_refuses_init_in_a_pid_namespace() -> None:
    """Inside its own PID namespace the test program is PID 1: asked to end PID 1, it must refuse."""
    code = ("import anyio; from sparkd.runtime import proctree; "
            "print('killed', anyio.run(lambda: proctree.terminate_tree(1, 0.2)), flush=True)")
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "killed []", out


def test_sparkd_itself_and_its_ancestors_are_never_signalled(started: Started) -> None:
    """A program whose parent is a shell this test starts asks every kill path to end that shell (and
    terminate_tree to end itself): the stop path, signal_all, the guard's Victims, the stale sweep's end."""
    code = ("import os, anyio, psutil; from sparkd.runtime import proctree; from sparkd.guard.kill import Victims; "
            "from sparkd.preflight import stale; parent = os.getppid(); "
            "print(anyio.run(lambda: proctree.terminate_tree(parent, 0.2)), "
            "anyio.run(lambda: proctree.terminate_tree(os.getpid(), 0.2)), "
            "proctree.signal_all([psutil.Process(parent)], 15), Victims([parent, os.getpid()]).pids, "
            "[s.pid for s in anyio.run(lambda: stale.end([psutil.Process(parent)], 0.2, 0.2))[0]], flush=True)")
    shell = subprocess.run(["sh", "-c", f'{PY} -c "$0"; echo shell survived', code], capture_output=True,
                           text=True, timeout=60)
    assert shell.stdout.splitlines() == ["[] [] [] [] []", "shell survived"], shell


def test_a_launch_is_proven_by_its_marker_through_exec(started: Started) -> None:
    marker = proctree.launch_marker()
    launch = started(["bash", "-c", 'exec "$0" -c "$1"', PY, "import time; print('ready', flush=True); "
                      "time.sleep(600)"], env={MARKER_ENV: marker}, ready=False)
    identity = ProcessIdentity.of(launch.pid, marker)  # recorded at launch: maybe still bash
    assert launch.stdout is not None and launch.stdout.readline().strip() == "ready"
    assert psutil.Process(launch.pid).cmdline()[0] == PY  # it exec'd since
    assert same_identity(identity) is not None  # no expectation needed: the marker proves it
    assert same_identity(ProcessIdentity(launch.pid, identity.create_time, marker="another"),
                         Expected(executable=PY)) is None  # another launch's marker: refused, whatever it runs
    assert terminate(launch.pid, 5, identity=identity) == []
    assert launch.wait(10) == -signal.SIGTERM
    assert same_identity(identity) is None  # gone


def test_a_retitled_launch_is_proven_by_what_it_runs(started: Started) -> None:
    marker = proctree.launch_marker()
    title = "VLLMPTTEST::EngineCore"
    launch = started(["bash", "-c", 'exec "$0" -c "$1"', PY,
                      f"import setproctitle, time; setproctitle.setproctitle({title!r}); "
                      "print('ready', flush=True); time.sleep(600)"], env={MARKER_ENV: marker}, ready=False)
    identity = ProcessIdentity.of(launch.pid, marker)  # recorded at launch: maybe still bash
    assert launch.stdout is not None and launch.stdout.readline().strip() == "ready"
    assert psutil.Process(launch.pid).cmdline()[0] == title  # it exec'd and retitled itself since
    # Its title overwrote the environment's memory: the marker cannot be read, so what it runs must show it.
    assert same_identity(identity) is None
    expected = Expected(executable="vllm", title_prefix="VLLMPTTEST::")
    assert same_identity(identity, expected) is not None
    assert same_identity(identity, Expected(executable="vllm")) is None
    record = ProcessIdentity.from_record(identity.to_record())
    assert record == identity
    assert terminate(launch.pid, 5, identity=record, expected=expected) == []
    assert launch.wait(10) == -signal.SIGTERM
    assert same_identity(identity) is None  # gone


def test_a_forged_record_naming_an_unrelated_process_is_not_proven(started: Started) -> None:
    """reliability.md 3e: the record names an unrelated `sleep` with its exact create time."""
    sleep = started(["sleep", "600"], ready=False)
    time.sleep(0.2)
    created = psutil.Process(sleep.pid).create_time()
    vllm = Expected(executable="vllm", script="/run/sparkd/launch.sh", title_prefix="VLLM::")
    for forged in (ProcessIdentity(sleep.pid, created), ProcessIdentity(sleep.pid, created, marker="forged"),
                   ProcessIdentity(sleep.pid, created, cmdline=["sleep", "600"], exe="/usr/bin/sleep")):
        assert same_identity(forged, vllm) is None
        assert terminate(sleep.pid, 0.2, identity=forged, expected=vllm) == []
    assert sleep.poll() is None
    assert same_identity(ProcessIdentity(sleep.pid, created), Expected(executable="sleep")) is not None


@pytest.mark.parametrize(("cmdline", "expected", "proven"), [
    (["/usr/bin/python3.12", "/usr/local/bin/vllm", "serve", "/m"], Expected("vllm"), True),
    (["/usr/local/bin/vllm", "serve", "/m"], Expected("/usr/local/bin/vllm"), True),
    (["VLLM::EngineCore"], Expected("vllm"), True),
    (["VLLMX::EngineCore"], Expected("vllm", title_prefix="VLLMX::"), True),
    (["VLLM::EngineCore"], Expected("vllm", title_prefix="VLLMX::"), False),  # another launch's prefix
    (["bash", "-c", "echo 500 > /proc/self/oom_score_adj; exec bash \"$0\"", "/s/run/launch.sh"],
     Expected("vllm", script="/s/run/launch.sh"), True),
    (["bash", "/other/launch.sh"], Expected("vllm", script="/s/run/launch.sh"), False),
    (["/usr/bin/python3", "-c", "import vllm"], Expected("vllm"), False),
    (["/usr/bin/python3", "/srv/app.py"], Expected("/usr/bin/python3"), False),  # an interpreter proves nothing
    (["sleep", "600"], Expected("vllm"), False),
    ([], Expected("vllm"), False),
])
def test_expected_launch_matches(cmdline: list[str], expected: Expected, proven: bool) -> None:
    assert expected.matches(cmdline) is proven
