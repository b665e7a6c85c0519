"""A user's sparkd (a ``make run`` demo as a normal user, here uid 65534) cannot write root's registry folder: it
registers in its runtime folder, ``$XDG_RUNTIME_DIR/sparkd/instances`` (/run/user/<uid>/…), with one note and no
``registration_failed`` warning; another sparkd of the same user finds it there, and so does root's (which has no
XDG_RUNTIME_DIR of that user: it reads every /run/user/*/sparkd/instances). Both name the user's instance as the
owner of the port its vLLM holds. At its exit the registration is removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import BIN, Sparkd, as_user, base_config, kill_tree, tree
from freeport import free_port

from sparkd.preflight import instances

UID = 65534  # nobody: any uid but the test's will do
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a daemon as another user: needs root")
RUNTIME = instances.USER_RUNTIME_ROOT / str(UID)


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """The user's XDG_RUNTIME_DIR as pam_systemd makes it (0700, the user's); made here when the host lacks it,
    and then removed (only if nothing else was put in it)."""
    made = not RUNTIME.exists()
    if made:
        RUNTIME.mkdir(mode=0o700, parents=True)
        os.chown(RUNTIME, UID, UID)
    yield RUNTIME
    if made:
        for folder in (RUNTIME / "sparkd" / "instances", RUNTIME / "sparkd", RUNTIME):
            with contextlib.suppress(OSError):
                folder.rmdir()


@pytest.fixture
def user_folder() -> Iterator[Path]:
    """A folder of the user's own (tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sparkd-user-"))
    os.chown(path, UID, UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def port_line(config: Path, *, uid: int | None, env: dict[str, str]) -> str:
    result = subprocess.run([*as_user(uid), str(BIN / "sparkd"), "preflight", "--config", str(config), "--check",
                             "ports", "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
    lines = [line for line in result.stdout.splitlines() if " ports " in f" {line} "]
    assert result.returncode == 1 and lines, result.stdout + result.stderr
    return lines[0]


def test_a_users_demo_registers_in_its_runtime_folder_where_its_user_and_root_find_it(
        tmp_path: Path, runtime_dir: Path, user_folder: Path) -> None:
    roots = tmp_path / "instances"  # root's registry folder: the user may not write (or even see) it
    roots.mkdir(mode=0o755)
    port = free_port()
    demo = Sparkd(user_folder, base_config(user_folder, port, node={"name": "users-demo"},
                                           paths={"instances_dir": str(roots)}))
    os.chown(demo.config_path, UID, UID)
    user_env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "HOME": str(user_folder)}
    user_env.pop("VLLM_PROCESS_NAME_PREFIX", None)
    pid = None
    try:
        demo.start(env=user_env, uid=UID)
        pid = demo.wait_state("ready", timeout=120)["pid"]
        registered = instances.file_for(runtime_dir / "sparkd" / "instances", demo.state_dir)
        assert registered.exists() and registered.stat().st_uid == UID
        assert not list(roots.iterdir())
        notes = demo.events("registration_in_user_folder")
        assert len(notes) == 1 and notes[0]["folder"] == str(registered.parent), demo.log()
        assert demo.events("registration_failed") == [], demo.log()
        owner = f"of sparkd instance users-demo (config {demo.config_path}, state {demo.state_dir})"

        # another sparkd of the same user, configured onto the demo's port: the holder is named with its owner
        other = user_folder / "other"
        other.mkdir()
        mine = Sparkd(other, base_config(other, port, paths={"instances_dir": str(roots)}))
        for path in (other, mine.config_path):
            os.chown(path, UID, UID)
        assert owner in port_line(mine.config_path, uid=UID, env=user_env)
        # root's, with no XDG_RUNTIME_DIR of that user: it reads /run/user/*/sparkd/instances
        (tmp_path / "root").mkdir()
        root = Sparkd(tmp_path / "root", base_config(tmp_path / "root", port, paths={"instances_dir": str(roots)}))
        root_env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        assert owner in port_line(root.config_path, uid=None, env=root_env)

        assert demo.stop() == 0
        assert not registered.exists(), "the registration outlived its daemon"
    finally:
        demo.end()
        if pid:
            kill_tree(tree(pid))
