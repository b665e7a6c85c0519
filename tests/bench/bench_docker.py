"""Benchmark: recovery and detection on the docker-exec runtime (the field's), one container, three supervisors.

    .venv/bin/python tests/bench/bench_docker.py [--kills 10] [--unit-kills 4] [--json out.json]

One long-lived container from the test image (``sparkd-test:latest``: the host's /usr, Python and the repo
mounted read-only, the host's network and IPC, as sparkd's docker-exec runtime creates it) holds the stand-in
(3 s startup, the head of a two-node world on its own, like bench_recovery.py). In turn:

- sparkd with ``runtime = "docker-exec"`` (it creates the container; restart at once, no budget, as in
  bench_recovery.py): SIGKILL of the stand-in's API server (its host PID) → /health 200 again;
- own startup: the script sparkd rendered into the container, copied beside it, run by hand with ``docker exec
  <container> bash <script>`` (the field's line), spawn → /health 200;
- supervisord: ``[program:standin] command=docker exec <container> bash <script>``, ``autorestart=true``;
- the field's unit under a real systemd (unitpeer.py, docker-exec flavour: ``docker start``, ``sleep 5``,
  ``docker exec``, ``RestartSec=30``), several units at once, their kills staggered.

Detection: the kill → sparkd's ``exit_seen`` (its pidfd on the exec's host PID), supervisord's ``exited:`` line
(the ``docker exec`` client ends when the exec does), the journal's ``Main process exited`` (the same).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_recovery import BENCH_RESTART, UNIT_STAGGER_S, Ports, detection, summary
from benchkit import (
    BIN,
    REPO,
    Owned,
    ShmLedger,
    bench_parser,
    end_process,
    kill_delays,
    log,
    median,
    run_bench,
    sparkd_config,
    standin_by_prefix,
    standin_env,
    unique_prefix,
    wait_for,
    wait_healthy,
)
from peers import SparkdPeer, SupervisordPeer
from trials import parallel, sequential
from unitpeer import NoShm, UnitPeer, systemd_host

IMAGE = "sparkd-test:latest"
SCRIPT = "/tmp/bench-launch.sh"  # beside sparkd's own /tmp/sparkd-launch.sh, a copy of it
UNIT_WINDOW_S = 60.0  # RestartSec=30, sleep 5, the startup


def container_section(name: str) -> dict[str, Any]:
    """sparkd's [container] for the bench's container, the test image built first if it is missing."""
    import docker as docker_sdk

    sys.path.insert(0, str(REPO / "tests" / "infra"))
    import build_image

    build_image.ensure_image(docker_sdk.from_env(timeout=300))
    mounts = [{"source": src, "target": opt["bind"], "read_only": opt.get("mode") == "ro"}
              for src, opt in build_image.python_mounts(REPO).items()]
    return {"name": name, "image": IMAGE, "mounts": mounts, "gpus": "", "host_ipc": True,
            "labels": {"sparkd.test": "1", "sparkd.bench": "1"}}


def docker(*args: str, timeout: float = 60) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=timeout).stdout


class DockerSupervisordPeer(SupervisordPeer):
    """supervisord runs the ``docker exec`` client; the stand-in it reaches is found by its title prefix."""

    def __init__(self, tmp: Path, container: str, prefix: str) -> None:
        super().__init__(tmp, {"standin": (["docker", "exec", container, "bash", SCRIPT], {})})
        self.prefix = prefix

    def main_pid(self, old: int | None = None, timeout: float = 60, program: str | None = None) -> int:
        return int(wait_for(lambda: standin_by_prefix(self.prefix, old), timeout, "supervisord's stand-in"))


def own_startup(container: str, port: int, prefix: str, runs: int, owned: Owned) -> list[float]:
    out = []
    for n in range(runs):
        t0 = time.monotonic()
        client = subprocess.Popen(["docker", "exec", container, "bash", SCRIPT], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        ready = wait_healthy(port, 60)
        pid = standin_by_prefix(prefix)
        if pid is not None:
            owned.add_tree(pid)
            owned.kill_all()
        end_process(client)
        if ready is not None:
            out.append(round(ready - t0, 4))
        log(f"  own startup (docker exec) {n + 1}/{runs}: {out[-1] if out else None} s")
    return out


def unit_trials(node: Any, container: str, n: int, owned: Owned) -> list[dict[str, Any]]:
    """n units, each its own stand-in (own port and prefix) in the same container, each killed once."""
    units, ports = [], []
    for i in range(n):
        p, prefix = Ports(), unique_prefix()
        script = f"/tmp/bench-launch-u{i}.sh"
        text = docker("exec", container, "cat", f"{SCRIPT}.in")
        text = text.replace(PORT_MARK[0], str(p.api)).replace(PORT_MARK[1], str(p.master)).replace(
            PORT_MARK[2], prefix)
        subprocess.run(["docker", "exec", "-i", container, "bash", "-c", f"cat > {script}"], input=text, text=True,
                       check=True, timeout=30)
        units.append(UnitPeer(node, f"vllm-bench-d{i}", [], {"VLLM_PROCESS_NAME_PREFIX": prefix}, p.api,
                              container=container, script=script))
        ports.append(p)
    for unit in units:
        unit.start()
    try:
        for unit, p in zip(units, ports, strict=True):
            if wait_healthy(p.api, 120) is None:
                raise RuntimeError(f"unit {unit.unit} never became ready:\n{node.journal(unit.unit)}")
        delays = kill_delays(n, seed=19)
        jobs = [(unit, p.api, UNIT_STAGGER_S * i + delays[i], None)
                for i, (unit, p) in enumerate(zip(units, ports, strict=True))]
        trials = parallel(jobs, owned, NoShm(), window=UNIT_WINDOW_S, label="unit (docker exec)")
        for trial, unit in zip(trials, units, strict=True):
            trial["result"] = unit.result()
        return trials
    finally:
        for unit in units:
            unit.stop()


PORT_MARK = ("@API_PORT@", "@MASTER_PORT@", "@PREFIX@")


def template(container: str, ports: Ports, prefix: str) -> None:
    """Turn the copied script into a template the units fill in with their own ports and prefix."""
    text = docker("exec", container, "cat", SCRIPT)
    for value, mark in ((str(ports.api), PORT_MARK[0]), (str(ports.master), PORT_MARK[1]), (prefix, PORT_MARK[2])):
        text = text.replace(value, mark)
    subprocess.run(["docker", "exec", "-i", container, "bash", "-c", f"cat > {SCRIPT}.in"], input=text, text=True,
                   check=True, timeout=30)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    owned, ledger = Owned(), ShmLedger()
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-docker-"))
    container = f"sparkd-bench-{uuid.uuid4().hex[:8]}"
    delays = kill_delays(args.kills)
    started = time.monotonic()
    results: dict[str, Any] = {"kills": args.kills, "container": container}
    rec: dict[str, list[dict[str, Any]]] = {}
    try:
        ports, prefix = Ports(), unique_prefix()
        cfg = sparkd_config(tmp / "sparkd", ports.api, standin_env(prefix), master_port=ports.master,
                            api_port=ports.metrics, restart=BENCH_RESTART, container=container_section(container))
        cfg["runtime"] = "docker-exec"
        log(f"docker-exec: sparkd, {args.kills} kills")
        peer = SparkdPeer(tmp / "sparkd", cfg).start()
        try:
            rec["sparkd"] = sequential(peer, ports.api, delays, owned, ledger, window=60.0, label="sparkd docker-exec")
        finally:
            peer.close()
        docker("exec", container, "cp", "/tmp/sparkd-launch.sh", SCRIPT)
        log("docker-exec: the stand-in's own startup (docker exec by hand)")
        startup_runs = own_startup(container, ports.api, prefix, args.startup_runs, owned)
        results["startup"] = {"median_s": median(startup_runs), "runs": startup_runs}
        log(f"docker-exec: supervisord running docker exec, {args.kills} kills")
        sv = DockerSupervisordPeer(tmp / "supervisord", container, prefix).start()
        try:
            rec["supervisord"] = sequential(sv, ports.api, delays, owned, NoShm(), window=60.0,
                                            label="supervisord docker exec")
        finally:
            sv.close()
            pid = standin_by_prefix(prefix)
            if pid is not None:
                owned.add_tree(pid)
        owned.kill_all()
        if args.unit_kills:
            log(f"docker-exec: the field's unit under systemd, {args.unit_kills} units")
            template(container, ports, prefix)
            with systemd_host() as node:
                rec["unit"] = unit_trials(node, container, args.unit_kills, owned)
    finally:
        left = owned.kill_all()
        ledger.cleanup()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=120)
        log(f"docker-exec: ended {left} leftover process(es) of ours, removed the container {container}")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    startup = results["startup"]["median_s"]
    results["recovery"] = {k: summary(v, startup) for k, v in rec.items()}
    results["detection"] = {k: detection(v) for k, v in rec.items()}
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def main() -> int:
    parser = bench_parser(__doc__, "bench-docker.json")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--unit-kills", type=int, default=4)
    parser.add_argument("--startup-runs", type=int, default=3)
    return run_bench(parser, bench)


if __name__ == "__main__":
    os.environ.setdefault("PATH", str(BIN))
    sys.exit(main())
