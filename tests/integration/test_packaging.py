"""The wheel and the Debian package (`make deb` = packaging/build-deb.sh), and the converted field configs.

The .deb is built once per session for this machine's architecture, then really installed with dpkg into a
clean Debian container (the systemd image: its own /usr and dpkg database, booted with systemd as PID 1, no
repo or host Python mounted), where the packaged sparkd must run, as a command and as the packaged unit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from systemd_infra import systemd_infra

import sparkd

REPO = Path(__file__).resolve().parents[2]
BUILD_DEB = REPO / "packaging" / "build-deb.sh"
VENV_BIN = Path(sys.executable).parent
PREFIX = "/opt/sparkd"


infra = systemd_infra()


@dataclass
class Built:
    wheel: Path
    sdist: Path
    deb: Path
    tree: Path  # the .deb unpacked with dpkg-deb -R (files and DEBIAN/)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("dist")
    if importlib.util.find_spec("build") is None:  # what `make deb` installs first
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "build"], check=True, timeout=300)
    # Lintian runs in the Debian container below (not on the host); the build itself is `make deb`'s.
    env = {**os.environ, "SPARKD_DEB_LINTIAN": "0", "SPARKD_BUILD_PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(BUILD_DEB), "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    assert proc.returncode == 0, f"build-deb.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    deb = Path(proc.stdout.strip().splitlines()[-1])
    tree = out / "tree"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
    return Built(wheel=next(out.glob("sparkd-*.whl")), sdist=next(out.glob("sparkd-*.tar.gz")), deb=deb, tree=tree)


def test_wheel_holds_the_code_the_profiles_and_the_commands(built: Built) -> None:
    names = zipfile.ZipFile(built.wheel).namelist()
    assert built.wheel.name == f"sparkd-{sparkd.__version__}-py3-none-any.whl"
    assert "sparkd/daemon/app.py" in names and "sparkd/launch/rehearsal.py" in names
    assert not any(n.startswith(("sparkd/standin/", "sparkd_standin/")) for n in names)  # its own distribution
    profiles = {Path(n).stem for n in names if n.startswith("sparkd/config/profiles/") and n.endswith(".toml")}
    assert {"latency", "throughput", "balanced", "1m-context"} <= profiles, sorted(names)
    entry_points = zipfile.ZipFile(built.wheel).read(f"sparkd-{sparkd.__version__}.dist-info/entry_points.txt")
    for command in (b"sparkd = sparkd.cli.sparkd:main", b"sparkctl = sparkd.cli.ctl:main"):
        assert command in entry_points
    assert b"sparkd-standin" not in entry_points
    probe = "sparkd/vllm_probe/sparkd_vllm_probe-1.dist-info/entry_points.txt"  # the directory the launch mounts
    assert "sparkd/vllm_probe/sparkd_vllm_probe/hooks.py" in names and probe in names
    assert b"sparkd_probe = sparkd_vllm_probe:register" in zipfile.ZipFile(built.wheel).read(probe)


def test_deb_fields_and_files(built: Built) -> None:
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    assert built.deb.name == f"sparkd_{sparkd.__version__}_{arch.strip()}.deb"
    control = (built.tree / "DEBIAN" / "control").read_text()
    fields = dict(line.split(": ", 1) for line in control.splitlines() if line[:1].strip() and ": " in line)
    assert fields["Package"] == "sparkd" and fields["Architecture"] == arch.strip()
    assert fields["Depends"].startswith(f"python{sys.version_info.major}."), fields  # the venv's interpreter
    assert (built.tree / "DEBIAN" / "conffiles").read_text().split() == ["/etc/sparkd/sparkd.toml"]
    assert (built.tree / "etc/sparkd/sparkd.toml").read_text() == (REPO / "config/sparkd.toml").read_text()
    assert (built.tree / "lib/systemd/system/sparkd.service").read_text() == \
        (REPO / "systemd/sparkd.service").read_text()
    for command in ("sparkd", "sparkctl"):
        assert os.readlink(built.tree / "usr/bin" / command) == f"{PREFIX}/venv/bin/{command}"
        shebang = (built.tree / f"opt/sparkd/venv/bin/{command}").read_text().splitlines()[0]
        assert shebang == f"#!{PREFIX}/venv/bin/python", shebang
    cfg = (built.tree / "opt/sparkd/venv/pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg and str(built.tree) not in cfg
    for script in ("postinst", "prerm", "postrm"):
        path = built.tree / "DEBIAN" / script
        assert os.access(path, os.X_OK) and "@PREFIX@" not in path.read_text()
        assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0, script
    assert "groupadd --system sparkd" in (built.tree / "DEBIAN" / "postinst").read_text()


def test_deb_ships_monitoring_docs_licence_and_completion(built: Built) -> None:
    share = built.tree / "usr/share/sparkd"
    for name in ("sparkd-alerts.yml", "sparkd-alerts.test.yml", "prometheus-scrape.yml"):
        assert (share / "prometheus" / name).read_text() == (REPO / "packaging/prometheus" / name).read_text()
    assert (share / "grafana/sparkd-dashboard.json").read_bytes() == \
        (REPO / "packaging/grafana/sparkd-dashboard.json").read_bytes()
    doc = built.tree / "usr/share/doc/sparkd"
    for name in ("runbook.md", "config.md", "migration.md"):
        assert (doc / name).read_text() == (REPO / "docs" / name).read_text(), name
    licence = (REPO / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0" in licence
    assert (doc / "LICENSE").read_text() == licence
    dist_info = next((built.tree / "opt/sparkd/venv/lib").glob("python*/site-packages/sparkd-*.dist-info"))
    assert licence in [p.read_text() for p in dist_info.rglob("LICENSE*")]  # the wheel carries it too
    assert licence in [zipfile.ZipFile(built.wheel).read(n).decode() for n in zipfile.ZipFile(built.wheel).namelist()
                       if n.endswith("LICENSE")]
    for name in ("sparkd", "sparkctl"):
        bash = (built.tree / "usr/share/bash-completion/completions" / name).read_text()
        assert f"_{name.upper()}_COMPLETE=bash_complete" in bash and f"complete -o nosort -F _{name}_completion" in bash
        assert f"#compdef {name}" in (built.tree / "usr/share/zsh/vendor-completions" / f"_{name}").read_text()


def test_deb_venv_holds_exactly_the_pinned_versions(built: Built) -> None:
    venv_check = _venv_check()
    site = next((built.tree / "opt/sparkd/venv/lib").glob("python*/site-packages"))
    have = {}
    for meta in site.glob("*.dist-info/METADATA"):
        fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").splitlines()[:10]
                      if ": " in line)
        have[venv_check.canonical(fields["Name"])] = fields["Version"]
    pinned = venv_check.pins(REPO / "packaging/constraints.txt")
    assert venv_check.differences(pinned, have) == []
    assert {"pydantic", "anyio", "click", "structlog", "h11"} <= have.keys()


def _venv_check() -> Any:
    spec = importlib.util.spec_from_file_location("venv_check", REPO / "packaging" / "venv_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def debian(docker_client: Any, docker_test_labels: dict[str, str], built: Built) -> Iterator[Any]:
    """A clean Debian with systemd as PID 1 and only the built package mounted (no repo, no host Python)."""
    try:
        infra.ensure_image(docker_client)
    except Exception as exc:
        pytest.fail(f"could not build {infra.IMAGE}: {type(exc).__name__}: {exc}", pytrace=False)
    volumes = {str(built.deb.parent): {"bind": "/dist", "mode": "ro"}}
    with infra.booted(docker_client, docker_test_labels, volumes=volumes) as node:
        yield node


@pytest.mark.docker
@pytest.mark.timeout(600)  # the first docker test may build the systemd image
def test_lintian_reports_no_errors(debian: Any, built: Built) -> None:
    code, out = debian.sh(f"lintian --fail-on error --display-level '>=warning' /dist/{built.deb.name}",
                          check=False, timeout=600)
    errors = [line for line in out.splitlines() if line.startswith("E:")]
    assert code == 0 and not errors, out


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_package_installs_and_runs_in_a_clean_container(debian: Any, built: Built) -> None:
    assert debian.sh("command -v sparkd", check=False)[0] != 0  # clean: nothing of ours before
    debian.sh(f"dpkg -i /dist/{built.deb.name}")
    assert debian.out("dpkg-query -W -f '${Status}' sparkd") == "install ok installed"
    assert debian.out("sparkd --version") == f"sparkd, version {sparkd.__version__}"
    assert "Drive the sparkd daemon" in debian.out("sparkctl --help")
    assert debian.out("readlink -f /usr/bin/sparkd") == f"{PREFIX}/venv/bin/sparkd"
    # Its own virtualenv on the system's interpreter; the system Python's site-packages stay untouched.
    assert debian.sh("python3 -c 'import sparkd'", check=False)[0] != 0
    assert debian.out(f"{PREFIX}/venv/bin/python -c 'import sys; print(sys.prefix)'") == f"{PREFIX}/venv"
    # The shipped config (the field's head node, docker-exec) is valid as installed.
    assert "ok (node spark1, role head" in debian.out("sparkd check-config --config /etc/sparkd/sparkd.toml")
    assert debian.out("dpkg-query -W -f '${Conffiles}' sparkd").split()[0] == "/etc/sparkd/sparkd.toml"
    # The config may hold [launch] api_key: root's, not every local user's (security review §4).
    assert debian.out("stat -c '%a %U' /etc/sparkd/sparkd.toml") == "640 root"
    assert debian.out("getent group sparkd").startswith("sparkd:x:")
    assert debian.out("stat -c %a /var/lib/sparkd") == "750"
    assert debian.sh("test -d /var/cache/sparkd/vllm && test -d /var/cache/sparkd/flashinfer", check=False)[0] == 0
    assert debian.out("systemd-analyze verify sparkd.service 2>&1") == ""  # the man: pages are there
    assert debian.out("systemctl is-enabled sparkd", check=False) == "disabled"  # the operator enables it
    # The shipped config names /etc/sparkd/peer.token: postinst made it, private, and check-config is content.
    assert debian.out("stat -c '%a %U %s' /etc/sparkd/peer.token") == "600 root 65"
    assert "api.token_file" not in debian.out("sparkd check-config --config /etc/sparkd/sparkd.toml 2>&1")
    debian.sh("chmod 644 /etc/sparkd/peer.token")
    assert "[token-file-unsafe]" in debian.out("sparkd check-config --config /etc/sparkd/sparkd.toml 2>&1")
    debian.sh("chmod 600 /etc/sparkd/peer.token")
    # Completion through the installed scripts, the way bash calls them.
    for name, word, expected in (("sparkctl", "re", {"reset", "restart"}), ("sparkd", "check", {"check-config"})):
        shown = debian.out(f"bash -c 'source /usr/share/bash-completion/completions/{name};"
                           f" COMP_WORDS=({name} {word}); COMP_CWORD=1; _{name}_completion {name};"
                           " printf \"%s\\n\" \"${COMPREPLY[@]}\"'")
        assert expected <= {line.split(",")[-1] for line in shown.splitlines()}, shown

    # The packaged unit runs the packaged daemon: a process-runtime node with the packaged stand-in.
    debian.write("/etc/sparkd/sparkd.toml", f"""\
runtime = "process"
[node]
name = "packaged"
role = "single"
[launch]
executable = "{PREFIX}/venv/bin/sparkd-standin"
model = "sparkd-tests/standin"
host = "127.0.0.1"
port = 8000
[launch.env]
SPARKD_STANDIN_STARTUP_SECONDS = "1"
[preflight]
skip = ["memory", "page_cache"]
[supervisor]
stop_grace_s = 10
""")
    debian.sh("systemctl start sparkd")
    debian.wait("the packaged sparkd ready", lambda: json.loads(
        debian.out("sparkctl --json status", check=False) or "{}").get("state") == "ready")
    assert debian.out("stat -c '%a %G' /run/sparkd/sparkd.sock") == "660 sparkd"
    assert debian.prop("sparkd", "StatusText").startswith("ready, pid ")
    debian.sh("systemctl stop sparkd")
    left = [p for p in debian.out("ps -eo pid=,args=").splitlines() if re.search(r"VLLM::|sparkd", p)]
    assert left == [], left

    # Purge takes it all away again (the edited conffile included); the group stays by design.
    debian.sh("dpkg --purge sparkd")
    for path in (PREFIX, "/usr/bin/sparkd", "/usr/bin/sparkctl", "/etc/sparkd", "/var/lib/sparkd",
                 "/var/log/sparkd", "/lib/systemd/system/sparkd.service", "/usr/share/sparkd"):
        assert debian.sh(f"test -e {path}", check=False)[0] != 0, path


STANDIN_CONFIG = f"""\
runtime = "process"
[node]
name = "packaged"
role = "single"
[launch]
executable = "{PREFIX}/venv/bin/sparkd-standin"
model = "sparkd-tests/standin"
host = "127.0.0.1"
port = 8000
[launch.env]
SPARKD_STANDIN_STARTUP_SECONDS = "1"
[supervisor]
stop_grace_s = 10
[preflight]
skip = ["memory", "page_cache"]
"""


def upgraded_deb(built: Built, version: str) -> Path:
    """The built package as a later version: the same files, the maintainer scripts of this tree."""
    tree = built.tree.parent / f"tree-{version}"
    if not tree.exists():
        subprocess.run(["cp", "-a", str(built.tree), str(tree)], check=True)
        control = tree / "DEBIAN" / "control"
        control.write_text(re.sub(r"^Version: .*$", f"Version: {version}", control.read_text(), flags=re.M))
    deb = built.deb.parent / f"sparkd_{version}_upgrade.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)], check=True,
                   capture_output=True)
    return deb


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_upgrade_hands_over_without_a_cold_start(debian: Any, built: Built) -> None:
    newer = upgraded_deb(built, f"{sparkd.__version__}+upgrade1")
    debian.sh(f"dpkg -i /dist/{built.deb.name}")
    debian.write("/etc/sparkd/sparkd.toml", STANDIN_CONFIG)  # leave_running = false: a restart would relaunch
    debian.sh("systemctl start sparkd")
    ready = debian.wait("the packaged sparkd ready", lambda: (s := json.loads(
        debian.out("sparkctl --json status", check=False) or "{}")).get("state") == "ready" and s)
    old_main, vllm_pid = int(debian.prop("sparkd", "MainPID")), ready["pid"]
    born = debian.out(f"cut -d')' -f2- /proc/{vllm_pid}/stat | awk '{{print $20}}'")
    code, out = debian.sh(f"dpkg -i /dist/{newer.name}", check=False)
    assert code == 0, out
    assert "the new daemon adopts the running vLLM" in out, out
    assert debian.out("dpkg-query -W -f '${Version}' sparkd") == f"{sparkd.__version__}+upgrade1"
    now = debian.wait("the new daemon ready", lambda: (s := json.loads(
        debian.out("sparkctl --json status", check=False) or "{}")).get("state") == "ready"
        and s.get("daemon_pid") not in (None, old_main) and s)
    assert now["pid"] == vllm_pid and now.get("launches") == 0, now  # adopted, not relaunched
    assert debian.out(f"cut -d')' -f2- /proc/{vllm_pid}/stat | awk '{{print $20}}'") == born
    assert int(debian.prop("sparkd", "MainPID")) == now["daemon_pid"]
    # `systemctl stop` still stops vLLM after the upgrade.
    debian.sh("systemctl stop sparkd")
    assert debian.sh(f"test -d /proc/{vllm_pid}", check=False)[0] != 0
    left = [p for p in debian.out("ps -eo pid=,args=").splitlines() if re.search(r"VLLM::|sparkd", p)]
    assert left == [], left
    debian.sh("dpkg --purge sparkd")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_upgrade_from_a_daemon_that_cannot_hand_over_leaves_it_running(debian: Any, built: Built) -> None:
    """A daemon that does not answer `sparkctl handover` (older than it, or its socket gone) is neither
    restarted nor does the upgrade fail: postinst says how to finish."""
    newer = upgraded_deb(built, f"{sparkd.__version__}+upgrade2")
    debian.sh(f"dpkg -i /dist/{built.deb.name}")
    debian.write("/etc/sparkd/sparkd.toml", STANDIN_CONFIG)
    debian.sh("systemctl start sparkd")
    ready = debian.wait("the packaged sparkd ready", lambda: (s := json.loads(
        debian.out("sparkctl --json status", check=False) or "{}")).get("state") == "ready" and s)
    main = debian.prop("sparkd", "MainPID")
    debian.sh("mv /run/sparkd/sparkd.sock /run/sparkd/hidden.sock")  # handover cannot reach it
    code, out = debian.sh(f"dpkg -i /dist/{newer.name}", check=False)
    debian.sh("mv /run/sparkd/hidden.sock /run/sparkd/sparkd.sock")
    assert code == 0, out
    assert "cannot hand over" in out and "systemctl restart sparkd" in out, out
    assert debian.prop("sparkd", "MainPID") == main  # the old daemon goes on, vLLM with it
    assert json.loads(debian.out("sparkctl --json status"))["pid"] == ready["pid"]
    debian.sh("systemctl stop sparkd && dpkg --purge sparkd")


@pytest.mark.parametrize("name", ["converted-head.toml", "converted-worker.toml"])
def test_converted_field_configs_pass_check_config(name: str) -> None:
    path = REPO / "docs" / "examples" / name
    proc = subprocess.run([str(VENV_BIN / "sparkd"), "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok (node" in proc.stdout
