"""The field's systemd unit under a real systemd: Debian's systemd 252 booted as PID 1 in a container
(tests/infra/systemd_image.py), one unit per stand-in, killed from outside like the other supervisors.

The unit is the field's ``vllm-ds4-head.service`` (reference/field-reports/002) word for word where it can be:
``Type=simple``, ``ExecStartPre`` drop caches and ``rm -f /dev/shm/psm_* /dev/shm/sem.mp-*``, ``ExecStart`` the
launch, ``ExecStop`` ``pkill -9 -f "vllm serve"``, ``Restart=on-failure``, ``RestartSec=30``,
``TimeoutStartSec=900``, ``KillMode=mixed``. Two flavours of ``ExecStart``:

- ``process``: the stand-in's argv as sparkd renders it, run by systemd itself (the stand-in lives in the
  unit's cgroup);
- ``docker-exec``: the field's own lines, ``docker start <container>``, ``sleep 5``, ``docker exec <container>
  bash <script>`` against the host's engine (the host's docker CLI and socket are mounted into the systemd
  container), the script being the one sparkd renders, copied into the container.

Scoping, because several units share one container here where the field has one per node: ``ExecStop``'s
pattern also names the unit's own API port, so one unit's stop never reaches another's stand-in; the ``rm``
of ``ExecStartPre`` runs in the systemd container's own /dev/shm (nobody else's files). The systemd container
uses the host's network so that the bench polls every stand-in the same way.

Detection is the journal's ``Main process exited`` line (``short-iso-precise``, µs, the host's clock).
"""

from __future__ import annotations

import contextlib
import shlex
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from benchkit import REPO, ShmLedger, standin_by_prefix, wait_for
from systemd_infra import systemd_infra

RESTART_SEC = 30
DOCKER_CLI = "/usr/local/bin/docker"
LABELS = {"sparkd.test": "1", "sparkd.bench": "1"}


@contextlib.contextmanager
def systemd_host() -> Iterator[Any]:
    """A booted systemd container on the host's network, with the repo's Python and the host's docker CLI."""
    import docker

    infra = systemd_infra()
    client = docker.from_env(timeout=300)
    infra.ensure_image(client)
    volumes = {**infra.python_mounts(REPO), "/usr/bin/docker": {"bind": DOCKER_CLI, "mode": "ro"},
               "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}}
    with infra.booted(client, LABELS, volumes=volumes, name=f"sparkd-bench-systemd-{uuid.uuid4().hex[:8]}",
                      options={"network_mode": "host"}) as node:
        yield node


def unit_text(name: str, exec_start: str, env: dict[str, str], port: int, *, container: str | None) -> str:
    """The field's unit (see the module doc), for the process or the docker-exec flavour."""
    pattern = f"sparkd-standin serve .*--port {port}( |$)"  # `pkill -9 -f "vllm serve"`, scoped to this unit
    pkill = shlex.quote(f"pkill -9 -f {shlex.quote(pattern)} || true")
    lines = ["[Unit]", f"Description=bench: the field's vllm-ds4-head.service ({name})", "", "[Service]",
             "Type=simple", "User=root",
             "ExecStartPre=/bin/bash -c 'sync; echo 3 > /proc/sys/vm/drop_caches; "
             "rm -f /dev/shm/psm_* /dev/shm/sem.mp-* 2>/dev/null; true'"]
    if container is not None:
        lines += [f"ExecStartPre={DOCKER_CLI} start {container}", "ExecStartPre=/bin/sleep 5",
                  f"ExecStart={exec_start}",
                  f"ExecStop={DOCKER_CLI} exec {container} bash -c {pkill}"]
    else:
        lines += [f"ExecStart={exec_start}",
                  f"ExecStop=/bin/bash -c {pkill}"]
    lines += [*(f"Environment={shlex.quote(f'{k}={v}')}" for k, v in env.items()),
              "Restart=on-failure", f"RestartSec={RESTART_SEC}", "TimeoutStartSec=900", "KillMode=mixed", ""]
    return "\n".join(lines)


class NoShm(ShmLedger):
    """The units' stand-ins keep their /dev/shm files in the systemd container's own /dev/shm: a name seen
    there says nothing about the host's, so nothing is noted (and nothing on the host removed)."""

    def note(self, procs: Any) -> None:
        return None


class UnitPeer:
    """One unit in the booted systemd container; the trial interface of tests/bench/trials.py."""

    def __init__(self, node: Any, name: str, argv: list[str], env: dict[str, str], port: int, *,
                 container: str | None = None, script: str | None = None) -> None:
        self.node = node
        self.unit = name
        self.prefix = env["VLLM_PROCESS_NAME_PREFIX"]
        if container is not None:
            exec_start = f"{DOCKER_CLI} exec {container} bash {script}"
            env = {}  # the script exports the launch's environment inside the container
        else:
            exec_start = shlex.join(argv)
        node.write(f"/etc/systemd/system/{name}.service", unit_text(name, exec_start, env, port, container=container))

    def start(self) -> UnitPeer:
        self.node.sh("systemctl daemon-reload")
        self.node.sh(f"systemctl start --no-block {self.unit}")
        return self

    def main_pid(self, old: int | None = None, timeout: float = 60) -> int:
        """The stand-in's API server on the host (found by its own title prefix in its environment)."""

        def current() -> int | None:
            return standin_by_prefix(self.prefix, old)

        return int(wait_for(current, timeout, f"{self.unit}'s stand-in"))

    def log_mark(self) -> float:
        return time.time() - 0.5

    def noticed_at(self, mark: float, pid: int) -> float | None:
        """Wall time of the journal's ``<unit>: Main process exited`` line after ``mark``."""
        since = datetime.fromtimestamp(mark).strftime("%Y-%m-%d %H:%M:%S")
        out = self.node.out(f"journalctl -u {self.unit} --no-pager -o short-iso-precise --since '{since}'",
                            check=False)
        for line in out.splitlines():
            if "Main process exited" in line:
                return datetime.fromisoformat(line.split()[0]).timestamp()
        return None

    def result(self) -> str:
        return self.node.out(f"systemctl show -P ActiveState -P SubState -P Result {self.unit}", check=False
                             ).replace("\n", " ")

    def stop(self) -> None:
        self.node.sh(f"systemctl stop {self.unit}", check=False, timeout=120)
