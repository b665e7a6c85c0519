"""A Debian image with systemd, booted as PID 1 in a container: the real systemd for sparkd's unit tests.

No registry is reachable, so the image is made from Debian's own packages: ``mmdebstrap`` (installed on the
host with apt-get if missing; it does not touch the host's init) builds a minimal ``bookworm`` root file
system with ``systemd``, ``systemd-sysv``, ``python3``, ``procps`` and ``lintian`` from the Debian mirror into
a tar, and ``docker import`` turns it into ``sparkd-systemd-test:latest``. It has its own ``/usr`` and its own
dpkg database, so a ``.deb`` really installs into it. The recipe's hash is the image label
``sparkd.test.recipe``: the image is rebuilt only when the recipe changes (about a minute).

Containers boot it the way that works on these machines: ``--cap-add SYS_ADMIN --security-opt
seccomp=unconfined --tmpfs /run --tmpfs /run/lock -v /sys/fs/cgroup:/sys/fs/cgroup``. The repo's Python
reaches them through :func:`python_mounts` (the host's interpreter prefix, the venv and the repo, but not the
host's ``/usr``: the image brings its own, and the same Debian release's libraries).

Run ``.venv/bin/python tests/infra/systemd_image.py`` to build it ahead of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import io
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

IMAGE_REPOSITORY = "sparkd-systemd-test"
IMAGE_TAG = "latest"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"
RECIPE_LABEL = "sparkd.test.recipe"
REPO_ROOT = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("SPARKD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
LOCK_PATH = Path(tempfile.gettempdir()) / "sparkd-systemd-image.lock"

RECIPE: dict[str, Any] = {
    "version": 1,
    "suite": os.environ.get("SPARKD_SYSTEMD_SUITE", "bookworm"),  # systemd 252 (Debian 12)
    "variant": "minbase",
    "arch": platform.machine(),
    # systemd as PID 1; python3 gives the repo venv's interpreter its libraries (and runs a packaged venv);
    # procps for ps/pgrep; lintian checks the .deb.
    "packages": ["systemd", "systemd-sysv", "python3", "procps", "lintian"],
    "aptopts": ['APT::Install-Recommends "false"'],
    "dpkgopts": ["path-exclude=/usr/share/locale/*"],
    "changes": ["ENV container=docker", "ENV LANG=C.UTF-8", 'CMD ["/sbin/init"]'],
}

# How systemd boots in a container on these machines (docker SDK keyword arguments).
BOOT_KWARGS: dict[str, Any] = {
    "cap_add": ["SYS_ADMIN"],
    "security_opt": ["seccomp=unconfined"],
    "tmpfs": {"/run": "rw,mode=755", "/run/lock": "rw,mode=1777"},
    "stop_signal": "SIGRTMIN+3",
    # vLLM's (and the stand-in's) shared-memory segments; preflight wants 256 MiB free in /dev/shm.
    "shm_size": "512m",
    # Loopback only: the stand-in's port and sparkd's metrics port never meet the host's or other tests'.
    "network_mode": "none",
}
CGROUP_VOLUME = {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}}


def recipe_hash(recipe: Mapping[str, Any] = RECIPE) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _client(client: Any = None) -> Any:
    if client is not None:
        return client
    import docker

    return docker.from_env(timeout=300)


def image_status(client: Any) -> tuple[str | None, str | None]:
    import docker.errors

    try:
        img = client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return None, None
    return img.id, ((img.attrs.get("Config") or {}).get("Labels") or {}).get(RECIPE_LABEL)


def ensure_mmdebstrap() -> str:
    """The mmdebstrap binary, installed with apt-get (root) when missing."""
    found = shutil.which("mmdebstrap")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("mmdebstrap is missing and cannot be installed here (needs root and apt-get): "
                           "apt-get install mmdebstrap")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    found = shutil.which("mmdebstrap")
    if not found:
        raise RuntimeError("apt-get installed mmdebstrap but it is not on PATH")
    return found


def _build(client: Any, want: str, verbose: bool) -> None:
    mmdebstrap = ensure_mmdebstrap()
    with tempfile.TemporaryDirectory(prefix="sparkd-systemd-rootfs.", dir="/var/tmp") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        cmd = [mmdebstrap, "--mode=root", f"--variant={RECIPE['variant']}", "--format=tar",
               *(f"--aptopt={o}" for o in RECIPE["aptopts"]), *(f"--dpkgopt={o}" for o in RECIPE["dpkgopts"]),
               f"--include={','.join(RECIPE['packages'])}", RECIPE["suite"], str(tar), MIRROR]
        if verbose:
            print("running", " ".join(cmd), flush=True)
        # stdin closed: with a pipe on stdin mmdebstrap would read the apt sources from it.
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1200,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"mmdebstrap failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        changes = [*RECIPE["changes"], f"LABEL {RECIPE_LABEL}={want} sparkd.test=1"]
        client.api.import_image_from_file(str(tar), repository=IMAGE_REPOSITORY, tag=IMAGE_TAG, changes=changes)


def ensure_image(client: Any = None, *, force: bool = False, verbose: bool = False) -> str:
    """Build ``sparkd-systemd-test:latest`` unless one with the current recipe hash exists. Safe to call from
    several processes: they serialise on a lock file, and the later ones find the image built."""
    client = _client(client)
    want = recipe_hash()
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old_id, have = image_status(client)
        if old_id is not None and have == want and not force:
            return IMAGE
        started = time.monotonic()
        _build(client, want, verbose)
        new_id, got = image_status(client)
        if new_id is None or got != want:
            raise RuntimeError(f"docker import did not produce {IMAGE} with recipe {want}")
        if verbose:
            print(f"built {IMAGE} (recipe {want}) in {time.monotonic() - started:.0f}s", flush=True)
        if old_id is not None and old_id != new_id:
            with contextlib.suppress(Exception):
                client.images.remove(old_id)
    return IMAGE


def _build_image_module() -> Any:
    name = "sparkd_tests_infra_build_image"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("build_image.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def python_mounts(repo_root: Path = REPO_ROOT) -> dict[str, dict[str, str]]:
    """``build_image.python_mounts`` without the host's ``/usr`` and ``ld.so.cache``: the interpreter prefix
    (e.g. pyenv's), the venv and the repo, read-only. A venv made from ``/usr/bin/python3`` uses the image's
    python3 of the same Debian release instead."""
    mounts = _build_image_module().python_mounts(repo_root)
    return {src: spec for src, spec in mounts.items() if spec["bind"] not in ("/usr", "/etc/ld.so.cache")}


# ---------------------------------------------------------------------------------------------------------
# A booted container


# In the container; not a tmpfs (docker cp cannot read those), and a name that ps filters for "sparkd" pass over.
EXEC_OUT_DIR = "/var/tmp/node-sh"


class Node:
    """A container running systemd as PID 1, driven with shell commands."""

    def __init__(self, container: Any) -> None:
        self.container = container
        self._calls = itertools.count()
        self._lock = threading.Lock()
        self._read: list[str] = []  # output files read back, removed by the next command

    def sh(self, script: str, *, check: bool = True, timeout: float = 300) -> tuple[int, str]:
        """Run ``script`` under bash in the container; returns (exit code, stdout+stderr).

        The output goes to a file in the container, read back as an archive: Docker loses an exec's output now and
        then when the command ends before its stream is attached (moby/moby#27289, docker/docker-py#2042), which
        the suite met under load as an empty answer with exit code 0."""
        with self._lock:
            path, done, self._read = f"{EXEC_OUT_DIR}/{next(self._calls)}", self._read, []
        prefix = f"rm -f {' '.join(done)}; " if done else ""
        wrapped = f"{prefix}mkdir -p {EXEC_OUT_DIR} && exec >{path} 2>&1\n{script}"
        result = self.container.exec_run(["timeout", str(int(timeout)), "bash", "-c", wrapped], demux=False)
        out = self._output(path, result.output or b"")
        if check and result.exit_code != 0:
            raise AssertionError(f"`{script}` exited {result.exit_code}:\n{out}")
        return result.exit_code, out

    def _output(self, path: str, streamed: bytes) -> str:
        """The output file's text; what the stream carried where there is no file (the script removed it, or the
        container stopped)."""
        import docker.errors

        data = None
        try:
            chunks, _ = self.container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = tar.next()
                file = tar.extractfile(member) if member is not None else None
                data = file.read() if file is not None else None
        except (docker.errors.APIError, tarfile.TarError):  # no such file, or no archive of it
            pass
        if data is None:
            return streamed.decode(errors="replace")
        with self._lock:
            self._read.append(path)
        return data.decode(errors="replace")

    def out(self, script: str, **kwargs: Any) -> str:
        return self.sh(script, **kwargs)[1].strip()

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        data = text.encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(os.path.basename(path))
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        self.sh(f"mkdir -p {os.path.dirname(path)}")
        assert self.container.put_archive(os.path.dirname(path), buf.getvalue())

    def prop(self, unit: str, name: str) -> str:
        return self.out(f"systemctl show -P {name} {unit}")

    def journal(self, unit: str = "sparkd", lines: int = 80) -> str:
        return self.out(f"journalctl -u {unit} --no-pager -n {lines} -o short-monotonic", check=False)

    def wait(self, what: str, predicate: Any, timeout: float = 90, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n--- journal:\n"
                                     f"{self.journal()}")
            time.sleep(interval)


@contextlib.contextmanager
def booted(client: Any, labels: Mapping[str, str], *, volumes: Mapping[str, Mapping[str, str]] | None = None,
           name: str | None = None, boot_timeout: float = 120, options: Mapping[str, Any] | None = None
           ) -> Iterator[Node]:
    """Boot ``IMAGE`` with systemd as PID 1; yields once ``systemctl is-system-running`` settles; removes the
    container afterwards (it carries ``labels``, so the session cleanup would find it too). ``options``: docker
    SDK arguments over BOOT_KWARGS (the benchmarks use the host's network to poll the units' stand-ins)."""
    container = client.containers.run(
        IMAGE, detach=True, name=name, labels=dict(labels),
        volumes={**CGROUP_VOLUME, **(dict(volumes) if volumes else {})}, **{**BOOT_KWARGS, **(options or {})},
    )
    try:
        node = Node(container)
        # PID 1's bus socket appears a moment after the container starts; until then systemctl cannot connect.
        code, state = node.sh("for i in $(seq 600); do s=$(systemctl is-system-running --wait 2>&1);"
                              " case $s in running|degraded) echo $s; exit 0;; esac; sleep 0.2; done; echo $s;"
                              " exit 1", check=False, timeout=boot_timeout)
        if state.strip() not in ("running", "degraded"):
            container.reload()
            raise AssertionError(f"systemd did not boot in the container ({container.status}, exit {code}): "
                                 f"{state}\n{container.logs(tail=50).decode(errors='replace')}")
        yield node
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the recipe hash matches")
    args = parser.parse_args(argv)
    print(ensure_image(force=args.force, verbose=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
