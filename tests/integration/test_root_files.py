"""Security review 2 against `sparkd run` and the command-line programs as root: what root takes from a file must
come from a file only root could have written, and what the programs write is written as the daemon would.

- #27: a config owned by nobody (and its directory, and the unit's environment file) is refused before it is read,
  at startup and on reload; a launch program nobody may change is refused unless `[lint] allow` says so;
- #26: a TLS key another user owns, or that group and others may read, is refused;
- #19: `[launch] extra_args` with `--hf-token`/`--api-key` values is refused, saying how to pass them;
- #21: a state folder the CLI makes first gets the daemon's mode (0750);
- #32: `import-compose -o` over a link writes nothing through it, and its file is 0600.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack_tools import NOBODY
from daemon_harness import BIN, STANDIN, Fleet, alive, base_config, kill_tree, render_toml, tree
from freeport import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of another user need root")


def sparkd(*args: str, env: dict[str, str] | None = None, umask: int | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A sparkd command; one that does not end in ``timeout`` (a `run` that was not refused) is ended with all it
    started, and fails the test."""
    def preexec() -> None:
        if umask is not None:
            os.umask(umask)
    proc = subprocess.Popen([str(BIN / "sparkd"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=preexec, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        family = tree(proc.pid)
        kill_tree(alive(family))
        proc.communicate(timeout=30)
        raise AssertionError(f"sparkd {' '.join(args)} did not end: it ran") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wrapper(folder: Path) -> Path:
    """What nobody would have root run: it leaves a mark, then serves (the stand-in)."""
    path = folder / "pwn.sh"
    path.write_text(f"#!/bin/sh\nid > {folder}/PWNED.txt\nexec {STANDIN} \"$@\"\n")
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    return path


def test_a_config_someone_else_could_write_is_refused_before_it_is_read(tmp_path: Path, theirs: Path) -> None:
    """Review 2, #27: sparkd run executed nobody's script as root (uid=0 in PWNED.txt)."""
    cfg = base_config(tmp_path, free_port())
    cfg["launch"]["executable"] = str(wrapper(theirs))
    config = theirs / "sparkd.toml"
    config.write_text(render_toml(cfg))
    config.chmod(0o664)
    os.chown(config, NOBODY, NOBODY)
    ran = sparkd("run", "--config", str(config))
    assert ran.returncode == 3, ran.stderr
    assert ran.stderr.startswith(f"sparkd: the config {config} is refused: {theirs} is owned by nobody (uid 65534), "
                                 "not root (uid 0) (mode 0755)"), ran.stderr
    assert "sparkd does not start with it" in ran.stderr and "Traceback" not in ran.stderr
    checked = sparkd("check-config", "--config", str(config))
    assert f"the config {config} is refused" in checked.stderr and "[root-file-unsafe]" in checked.stderr
    assert not (theirs / "PWNED.txt").exists() and not (tmp_path / "state").exists()
    # The same config, root's, in a folder of root's: nobody's program is still refused, unless allowed.
    safe = tmp_path / "sparkd.toml"
    safe.write_text(render_toml(cfg))
    refused = sparkd("run", "--config", str(safe))
    assert refused.returncode == 2 and f"{theirs}/pwn.sh is run by sparkd as root, but {theirs} is owned by " \
        "nobody" in refused.stderr and "[launch-program-writable]" in refused.stderr, refused.stderr
    assert not (theirs / "PWNED.txt").exists()


def test_the_environment_file_and_the_tls_key_are_held_to_the_same_rule(tmp_path: Path, theirs: Path) -> None:
    """Review 2, #27 (/etc/default/sparkd) and #26: a key owned by nobody, mode 0644, passed run and check-config."""
    cfg = base_config(tmp_path, free_port())
    config = tmp_path / "sparkd.toml"
    config.write_text(render_toml(cfg))
    env_file = theirs / "sparkd.env"
    env_file.write_text("SPARKD_LOG__LEVEL=debug\n")
    ran = sparkd("run", "--config", str(config), env={"SPARKD_ENVIRONMENT_FILES": str(env_file)})
    assert ran.returncode == 3 and f"the environment file {env_file} is refused: {theirs} is owned by nobody" \
        in ran.stderr, ran.stderr
    key = tmp_path / "node.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(tmp_path / "node.pem"), "-days", "1", "-subj", "/CN=n"],
                   check=True, capture_output=True, timeout=60)
    cfg["api"].update(tls_cert=str(tmp_path / "node.pem"), tls_key=str(key), tls_ca=str(tmp_path / "node.pem"))
    config.write_text(render_toml(cfg))
    for uid, mode, status, said in (
            (NOBODY, 0o600, 3, f"[api] tls_key {key} is refused: {key} is owned by nobody (uid 65534), not root"),
            (0, 0o644, 2, f"[api] tls_key {key} is open to group or others (mode 0644): chmod 600 {key}; it is "
                          "this node's private key")):
        os.chown(key, uid, -1)
        key.chmod(mode)
        ran = sparkd("run", "--config", str(config))
        assert ran.returncode == status and said in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
        checked = sparkd("check-config", "--config", str(config))
        assert said in checked.stderr and "[tls-unusable]" in checked.stderr, checked.stderr


def test_a_reload_of_a_config_that_became_someone_elses_is_refused(sparkd_fleet: Fleet) -> None:
    daemon = sparkd_fleet()
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    os.chown(daemon.config_path, NOBODY, -1)
    refused = daemon.ctl("reload")
    assert refused.returncode != 0 and f"the config {daemon.config_path} is refused: {daemon.config_path} is owned " \
        "by nobody" in refused.stdout + refused.stderr, refused
    os.chown(daemon.config_path, 0, -1)
    os.chmod(daemon.config_path.parent, 0o777)
    refused = daemon.ctl("reload")
    assert refused.returncode != 0 and "is writable by its group or others (mode 0777" in refused.stdout + \
        refused.stderr, refused
    os.chmod(daemon.config_path.parent, 0o755)
    assert daemon.ctl("reload").returncode == 0
    assert daemon.status()["pid"] == pid and daemon.status()["state"] == "ready"


@pytest.fixture
def sparkd_fleet(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.close()


def test_secret_flags_in_extra_args_are_refused(tmp_path: Path) -> None:
    """Review 2, #19: both values were in every user's /proc/PID/cmdline, and --hf-token's in the journal and
    status.json; check-config said nothing."""
    cfg = base_config(tmp_path, free_port())
    cfg["launch"]["extra_args"] = ["--hf-token", "hf_EXTRAARGS_888", "--api-key", "sk-EXTRAARGS-999"]
    config = tmp_path / "sparkd.toml"
    config.write_text(render_toml(cfg))
    for command in ("check-config", "run"):
        done = sparkd(command, "--config", str(config))
        assert done.returncode == 2, done.stderr
        assert "error: launch.extra_args: --hf-token puts a secret on vLLM's command line, which every user of the " \
            "host can read (/proc/PID/cmdline)" in done.stderr and "set HF_TOKEN in [launch.env]" in done.stderr
        assert "--api-key puts a secret" in done.stderr and "set [launch] api_key_file" in done.stderr
        assert "hf_EXTRAARGS_888" not in done.stderr + done.stdout and "sk-EXTRAARGS-999" not in done.stderr
    assert not (tmp_path / "state" / "status.json").exists()  # nothing ran


def test_a_state_folder_the_cli_makes_first_has_the_daemons_mode(tmp_path: Path) -> None:
    """Review 2, #21: `weights verify` before the daemon's first start made state/ 0755, and it stayed so."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = base_config(tmp_path, free_port())
    cfg["launch"]["model"] = str(model)
    config = tmp_path / "sparkd.toml"
    config.write_text(render_toml(cfg))
    done = sparkd("weights", "verify", "--config", str(config), umask=0o022)
    assert done.returncode == 0, done.stderr
    state = tmp_path / "state"
    assert state.is_dir() and stat.S_IMODE(state.stat().st_mode) == 0o750
    for path in state.rglob("*"):
        assert not stat.S_IMODE(path.stat().st_mode) & 0o027, path


COMPOSE = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.32.0
    environment:
      HF_TOKEN: hf_COMPOSESECRET_111
    command: ["/m", "--api-key", "sk-COMPOSEAPIKEY-22"]
"""


def test_import_compose_writes_nothing_through_a_link_and_keeps_its_file_to_root(tmp_path: Path) -> None:
    """Review 2, #32: `-o link.toml` wrote the imported config, secrets in clear, 0644, into the link's target."""
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE)
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    (tmp_path / "link.toml").symlink_to(victim)
    for force in ((), ("--force",)):
        done = sparkd("import-compose", str(compose), "-o", str(tmp_path / "link.toml"), *force, umask=0o022)
        assert done.returncode == 2 and "is a symlink: never written through" in done.stderr, done.stderr
    assert victim.read_text() == "root's own\n"
    out = tmp_path / "sparkd.toml"
    done = sparkd("import-compose", str(compose), "-o", str(out), umask=0o022)
    assert done.returncode == 0 and stat.S_IMODE(out.stat().st_mode) == 0o600, done.stderr
    assert "sk-COMPOSEAPIKEY-22" not in out.read_text() + done.stderr and 'api_key_file = "/etc/sparkd/api-key"' \
        in out.read_text()
