"""What `sparkd run` refuses before it builds anything (sparkd/daemon/boot/startup.py): directories another user could
change (sshd's StrictModes, sparkd/host/trustedpaths.py), and a token file that is not root's alone or is short
(security review §3 and §8). Each is one sentence naming the key and an exit status the unit does not restart on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.host.trustedpaths import unsafe

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def owned(path: Path, uid: int, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, -1)
    path.chmod(mode)
    return path


def test_a_directory_someone_else_owns_or_may_write_is_unsafe_and_so_is_all_below_it(tmp_path: Path) -> None:
    home = owned(tmp_path / "home" / "alice", NOBODY)
    assert unsafe(home / "checkout" / ".sparkd-demo" / "state") == f"{home} is owned by nobody (uid {NOBODY}), " \
        "not root (uid 0) (mode 0755)"
    shared = owned(tmp_path / "shared", 0, 0o775)
    assert unsafe(shared / "state") == f"{shared} is writable by its group or others (mode 0775, owner root (uid 0))"
    assert unsafe(owned(tmp_path / "private", 0, 0o750) / "state") is None


def test_a_sticky_world_writable_parent_is_fine_but_not_as_the_directory_itself(tmp_path: Path) -> None:
    sticky = owned(tmp_path / "tmp", 0, 0o1777)
    assert unsafe(owned(sticky / "sparkd", 0, 0o750)) is None  # only root may rename /tmp/sparkd
    assert unsafe(sticky) == f"{sticky} is writable by its group or others (mode 1777, owner root (uid 0))"


def test_a_link_is_judged_by_where_it_lies_and_where_it_leads(tmp_path: Path) -> None:
    safe = owned(tmp_path / "safe", 0, 0o755)
    theirs = owned(tmp_path / "theirs", NOBODY)
    (safe / "to-theirs").symlink_to(theirs)
    assert unsafe(safe / "to-theirs" / "state") == f"{theirs} is owned by nobody (uid {NOBODY}), not root (uid 0) " \
        "(mode 0755)"
    (theirs / "to-safe").symlink_to(safe)  # a link nobody may repoint at will
    assert unsafe(theirs / "to-safe" / "state") is not None
    (safe / "loop").symlink_to(safe / "loop")
    assert "symlinks on its way" in str(unsafe(safe / "loop" / "x"))


def test_root_in_a_users_checkout_is_refused_and_that_user_is_not(tmp_path: Path) -> None:
    """The review ran `make run` as root in a user's checkout: `.sparkd-demo/` was theirs to rewire."""
    checkout = owned(tmp_path / "alice" / "sparkd", NOBODY)
    demo = checkout / ".sparkd-demo" / "state"
    assert unsafe(demo, owners=frozenset({0})) is not None  # sparkd as root
    assert unsafe(demo, owners=frozenset({0, NOBODY})) is None  # sparkd as alice (here: nobody) herself


def sparkd_run(tmp_path: Path, paths: str, api: str = "") -> subprocess.CompletedProcess[str]:
    config = tmp_path / "c.toml"
    config.write_text(f'runtime = "process"\n[node]\nname = "t"\n[launch]\nmodel = "m"\nport = 18999\n'
                      f'[paths]\n{paths}\n[api]\nport = 0\nsocket_group = ""\n{api}')
    return subprocess.run([sys.executable, "-m", "sparkd.cli", "run", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_sparkd_run_refuses_a_state_dir_another_user_could_rewire(tmp_path: Path) -> None:
    theirs = owned(tmp_path / "theirs", NOBODY)
    result = sparkd_run(tmp_path, f'state_dir = "{theirs}/state"\nrun_dir = "{tmp_path}/run"')
    assert result.returncode == 3, result.stderr
    assert f"[paths] state_dir {theirs}/state is not safe for sparkd, which runs as root: {theirs} is owned by " \
           "nobody" in result.stderr
    assert "Traceback" not in result.stderr and not (theirs / "state").exists()  # nothing was created there


@pytest.mark.parametrize(("secret", "mode", "owner", "words"), [
    ("s" * 64, 0o640, 0, "is open to group or others (mode 0640): chmod 600"),
    ("s" * 64, 0o600, NOBODY, f"is owned by uid {NOBODY}, who could replace the secret"),
    ("short", 0o600, 0, "holds 5 bytes; at least 32 are needed"),
])
def test_sparkd_run_refuses_a_token_file_that_is_not_roots_alone_or_is_short(
        tmp_path: Path, secret: str, mode: int, owner: int, words: str) -> None:
    token = tmp_path / "peer.token"
    token.write_text(secret + "\n")
    token.chmod(mode)
    os.chown(token, owner, -1)
    result = sparkd_run(tmp_path, f'state_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"',
                        f'token_file = "{token}"\n')
    assert result.returncode == 2, result.stderr
    assert f"[api] token_file {token} {words}" in result.stderr and "Traceback" not in result.stderr


def test_check_config_refuses_a_launch_program_another_user_may_change_unless_allowed(tmp_path: Path) -> None:
    """Security review §3 and review 2, #27: a process-runtime script or executable writable by a user is run as
    root. A refusal (exit 2), unless [lint] allow names the rule: then a warning."""
    theirs = owned(tmp_path / "theirs", NOBODY)
    for key in ("script", "executable"):
        program = theirs / f"{key}.sh"
        program.write_text("#!/bin/bash\nexec vllm serve m \"$@\"\n")
        program.chmod(0o755)
        for allow, status, level in (("", 2, "error"), ('[lint]\nallow = ["launch-program-writable"]\n', 0, "warning")):
            config = tmp_path / "c.toml"
            config.write_text(f'runtime = "process"\n[launch]\nmodel = "m"\n{key} = "{program}"\n{allow}')
            result = subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(config)],
                                    cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
            assert result.returncode == status, result.stderr
            assert f"{level}: launch.{key}: {program} is run by sparkd as root, but {theirs} is owned by nobody" \
                in result.stderr and "[launch-program-writable]" in result.stderr, result.stderr
