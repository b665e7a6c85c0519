"""Root's writes under attack (security review §3), against a running `sparkd run`: what a user could plant in a
state directory they could once write — a FIFO at the launch script's old temp name, `vllm.log` and `incidents` as
links to files and folders that are not sparkd's — finds nothing to write through, and a state directory such a
user could still change is refused at startup. The demo keeps working as the user who runs it, in their own
checkout; root there is refused (the review's `make run` as root in a user's checkout)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import BIN, Fleet, alive, kill_tree, tree
from freeport import free_port

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
# nobody, allowed to read and search any path (the checkout sits under root's 0700 directories here and the
# interpreter under /root) but not to write what it does not own
AS_NOBODY = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
             "--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]


def demo_config(checkout: Path) -> Path:
    """config/examples/demo.toml on ports of this test's own, in ``checkout`` (its state: ./.sparkd-demo/)."""
    text = (REPO / "config" / "examples" / "demo.toml").read_text().replace("port = 8000", f"port = {free_port()}")
    text += f"\n[api]\nport = {free_port()}\n"
    path = checkout / "demo.toml"
    path.write_text(text)
    return path


def run_demo(checkout: Path, config: Path, *prefix: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    with open(checkout / "sparkd.out", "ab") as out:
        return subprocess.Popen([*prefix, str(BIN / "sparkd"), "run", "--config", str(config)], cwd=checkout,
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(status: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = status.parents[2] / "sparkd.out"
            raise AssertionError(f"sparkd exited {proc.returncode}: {out.read_text(errors='replace')[-3000:]}")
        if status.exists() and '"state": "ready"' in status.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError("the demo did not become ready")


@pytest.fixture
def home() -> Iterator[Path]:
    """A home of nobody's under /tmp (pytest's own folders are root's 0700: nobody could not open a config there)."""
    base = Path(tempfile.mkdtemp(prefix="sparkd-home-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_demo_runs_as_its_user_in_their_checkout_and_root_there_is_refused(home: Path) -> None:
    checkout = home / "alice" / "sparkd"
    checkout.mkdir(parents=True)
    for folder in (checkout, checkout.parent):
        os.chown(folder, NOBODY, NOBODY)
    config = demo_config(checkout)
    as_root = run_demo(checkout, config)
    assert as_root.wait(60) == 3
    said = (checkout / "sparkd.out").read_text()
    assert f"the config {config} is refused: " in said  # before a word of it is read (issue 34: StrictModes)
    assert f"{checkout.parent} is owned by nobody (uid {NOBODY}), not root (uid 0)" in said and "Traceback" not in said
    assert not (checkout / ".sparkd-demo").exists()  # root created nothing there
    as_user = run_demo(checkout, config, *AS_NOBODY)
    try:
        wait_ready(checkout / ".sparkd-demo" / "state" / "status.json", as_user)
        state = checkout / ".sparkd-demo" / "state"
        assert state.stat().st_uid == NOBODY and stat.S_IMODE(state.stat().st_mode) == 0o750  # umask 027
    finally:
        family = tree(as_user.pid)
        as_user.send_signal(signal.SIGTERM)
        as_user.wait(60)
        kill_tree(alive(family))


def test_planted_links_and_fifos_find_nothing_to_write_through(sparkd: Fleet, tmp_path: Path) -> None:
    daemon = sparkd()
    state = daemon.state_dir
    (state / "run").mkdir(parents=True)
    (state / "logs").mkdir()
    fifo = state / "run" / ".launch.sh.tmp"
    os.mkfifo(fifo, 0o600)  # the review's root shell: sparkd wrote its script into the FIFO, bash read it back
    victim = tmp_path / "fake-etc" / "vllmlog"
    victim.parent.mkdir()
    victim.write_text("untouched\n")
    victim.chmod(0o600)
    (state / "logs" / "vllm.log").symlink_to(victim)
    foreign = tmp_path / "fake-etc" / "incdir"
    foreign.mkdir()
    for i in range(5):
        (foreign / f"sysdir{i:02d}").mkdir()
    (state / "incidents").symlink_to(foreign)
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    os.kill(pid, signal.SIGKILL)  # a vLLM crash: an incident to write, and the pruner after it
    daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("pid") != pid, 60, "restarted")
    assert victim.read_text() == "untouched\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert sorted(p.name for p in foreign.iterdir()) == [f"sysdir{i:02d}" for i in range(5)]
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_IMODE(fifo.lstat().st_mode) == 0o600
    script = state / "run" / "launch.sh"
    assert stat.S_ISREG(script.lstat().st_mode) and stat.S_IMODE(script.stat().st_mode) == 0o750
    refused = daemon.events("incident_write_failed")
    assert refused and "is a symlink; sparkd keeps incidents only in a real directory" in refused[0]["error"]
    problems = " ".join(daemon.status()["daemon"]["problems"])
    assert "vllm.log: Too many levels of symbolic links" in problems  # said, not written through
