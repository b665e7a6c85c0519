"""The phases of run_all.py (see its doc): each takes the Run and notes its figures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from probewatch import ProbeWatch
from run_all import GIB, HERE, SAFE_ENV, Run, kill_pid, wait_gone

PY = sys.executable
SPARKD = [PY, "-m", "sparkd.cli"]
SPARKCTL = [PY, "-c", "from sparkd.cli.sparkctl import main; main()"]


def toml_config(path: Path, state: Path, *, util: float, env: dict[str, str], port: int = 8011,
                margin: float = 2.0, extra: str = "") -> Path:
    envs = "\n".join(f'{k} = "{v}"' for k, v in {**SAFE_ENV, **env}.items())
    path.write_text(f'''runtime = "process"
[node]
name = "gpu-host"
role = "single"
[launch]
executable = "{HERE / 'fake_vllm.py'}"
model = "fake/model"
host = "127.0.0.1"
port = {port}
gpu_memory_utilization = {util}
[launch.env]
{envs}
[preflight]
skip = ["vllm_args", "image", "rdma", "host", "page_cache"]
memory_margin_gib = {margin}
[paths]
state_dir = "{state}/state"
run_dir = "{state}/run"
log_dir = "{state}/logs"
[api]
port = 0
socket_group = false
[log]
format = "json"
{extra}
''')
    return path


def sparkd_env(src: Path | None = None) -> dict[str, str]:
    base = os.environ.get("PYTHONPATH", "")
    return {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{src}:{base}" if src else base}


# ---- info --------------------------------------------------------------------------------------------------


def info(run: Run) -> None:
    import torch

    from sparkd.host.gpu.nvml import NvmlReader
    from sparkd.host.gpu.smi import QUERY_APPS, QUERY_GPU

    smi = shutil.which("nvidia-smi") or "nvidia-smi"
    for name, args in (("nvidia-smi-query-gpu.csv", QUERY_GPU), ("nvidia-smi-query-apps.csv", QUERY_APPS),
                       ("nvidia-smi-q.txt", ("-q",)), ("nvidia-smi.txt", ())):
        result = subprocess.run([smi, *args], capture_output=True, text=True, timeout=60)
        (run.out / name).write_text(result.stdout)
    view = NvmlReader().read()
    (run.out / "nvml-idle.json").write_text(json.dumps(view.to_json(), indent=2) + "\n")
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()[:5])
    run.note("info", {"driver": view.driver, "cuda": view.cuda, "torch": torch.__version__,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                      "devices": [f"{d.index} {d.name} {d.uuid} total {d.total_bytes}" for d in view.devices],
                      "meminfo": {k: v.strip() for k, v in meminfo.items()}, "date": time.strftime("%Y-%m-%d"),
                      "kernel": os.uname().release, "cpus": os.cpu_count()})


# ---- preflight ---------------------------------------------------------------------------------------------


def launch_gpu(run: Run) -> int:
    """The GPU the preflight's launch runs on: GPU 1 of two (GPU 0 then holds what is not the launch's), the only one
    of one."""
    return len(run.handles) - 1


def preflight(run: Run) -> None:
    d = run.out / "preflight"
    d.mkdir(exist_ok=True)
    g = launch_gpu(run)
    cfg = toml_config(d / "sparkd.toml", d, util=0.9, env={"CUDA_VISIBLE_DEVICES": str(g)})

    def pf(case: str, *, dry: bool = True, config: Path = cfg, src: Path | None = None,
           expect_pid: int | None = None) -> dict[str, Any]:
        t0 = time.time()
        result = subprocess.run([*SPARKD, "preflight", "--config", str(config), *(["--dry-run"] if dry else []),
                                 "--json"], capture_output=True, text=True, timeout=300, env=sparkd_env(src))
        (d / f"{case}.json").write_text(result.stdout + ("\n# stderr\n" + result.stderr if result.stderr else ""))
        try:
            data = json.loads(result.stdout)
        except ValueError:
            run.note(f"preflight.{case}", {"rc": result.returncode, "stderr": result.stderr[-2000:]})
            return {}
        checks = {c["id"]: c for c in data["results"]}
        pick = {k: [checks[k]["verdict"], checks[k]["found"], checks[k].get("did", "")]
                for k in ("stale_processes", "memory", "gpu") if k in checks}
        figures: dict[str, Any] = {"rc": result.returncode, "seconds": round(time.time() - t0, 2), **pick}
        if expect_pid is not None:
            figures["memory_names_holder"] = f"PID {expect_pid}" in checks.get("memory", {}).get("found", "")
        run.note(f"preflight.{case}", figures)
        return checks

    pf("idle")
    if g > 0:  # another GPU than the launch's
        pid = run.holder("-", 16, 0)
        pf(f"foreign_on_gpu0_launch_on_gpu{g}", expect_pid=pid)
        release(run, pid, 0, "foreign_gpu0")
    pid = run.holder("-", 16, g)
    pf(f"foreign_on_gpu{g}", expect_pid=pid)
    release(run, pid, g, f"foreign_gpu{g}")
    pid = run.holder("VLLM::Worker_TP0", 20, g, orphan=True)
    run.note("preflight.stale_parent", psutil.Process(pid).ppid())
    pf(f"stale_on_gpu{g}_dry", expect_pid=pid)
    t0 = time.time()
    pf(f"stale_on_gpu{g}_real", dry=False, expect_pid=pid)
    run.note("preflight.stale_after_real", {"pid_alive": psutil.pid_exists(pid) and psutil.Process(pid).status()
                                            != psutil.STATUS_ZOMBIE, f"gpu{g}_pids": run.compute_pids(g),
                                            f"gpu{g}_used_gib": round(run.used_gib(g), 2),
                                            "seconds": round(time.time() - t0, 2)})
    host_smaller(run, d, pf)


def host_smaller(run: Run, d: Path, pf: Callable[..., dict[str, Any]]) -> None:
    """A launch whose gpu_memory_utilization x host MemTotal (+ margin) is more than the host has free: the old
    host-only rule refuses it, vLLM's per-device rule passes it (the GPU is free)."""
    lines = Path("/proc/meminfo").read_text().splitlines()
    mem = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines)
           if k in ("MemTotal", "MemFree", "MemAvailable")}
    g = launch_gpu(run)
    total_gpu = run.nvml.nvmlDeviceGetMemoryInfo(run.handles[g]).total
    natural = mem["MemTotal"] < total_gpu
    margin = 2.0 if natural else round(0.1 * mem["MemTotal"] / GIB + 1, 1)
    cfg = toml_config(d / "host-smaller.toml", d, util=0.9, env={"CUDA_VISIBLE_DEVICES": str(g)}, margin=margin)
    run.note("preflight.host_smaller_setup", {
        "host_mem_total_gib": round(mem["MemTotal"] / GIB, 1), "host_mem_free_gib": round(mem["MemFree"] / GIB, 1),
        "gpu_total_gib": round(total_gpu / GIB, 1), "host_smaller_than_gpu": natural, "margin_gib": margin,
        "old_rule_need_gib": round((0.9 * mem["MemTotal"]) / GIB + margin, 1)})
    pf("host_smaller_new_rule", config=cfg)
    if run.main_src is not None:
        pf("host_smaller_old_rule", config=cfg, src=run.main_src)


def release(run: Run, pid: int, gpu: int, what: str) -> float:
    """SIGKILL ``pid`` and time how long its memory stays listed on ``gpu`` after it is gone."""
    kill_pid(pid)
    gone = wait_gone(pid)
    t0 = time.time()
    while pid in run.compute_pids(gpu) and time.time() - t0 < 30:
        time.sleep(0.01)
    seconds = round(time.time() - t0, 3)
    run.note(f"release.{what}", {"exit_s": round(gone, 3), "freed_after_exit_s": seconds,
                                 "used_gib_now": round(run.used_gib(gpu), 2)})
    return seconds


# ---- survivor (standalone) ---------------------------------------------------------------------------------


def start_pair(run: Run, d: Path, port: str, timeout: int, handler: str = "vllm") -> list[subprocess.Popen[bytes]]:
    ranks = [run.spawn([PY, str(HERE / "nccl_rank.py"), str(r), "2", port, "--timeout", str(timeout), "--handler",
                        handler], d / f"rank{r}.log") for r in (0, 1)]
    t0 = time.time()
    while time.time() - t0 < 180:
        logs = [(d / f"rank{r}.log").read_text(errors="replace") for r in (0, 1)]
        if all(" iter " in t for t in logs):
            return ranks
        if any(p.poll() is not None for p in ranks):
            raise RuntimeError("a rank ended during startup: " + logs[0][-500:] + logs[1][-500:])
        time.sleep(0.5)
    raise RuntimeError("the ranks never iterated")


def survivor(run: Run) -> None:
    import anyio

    from sparkd.host.gpu.reading import read_gpus
    from sparkd.host.gpu.release import wait_released
    from sparkd.runtime import proctree

    d = run.out / "survivor"
    d.mkdir(exist_ok=True)
    ranks = start_pair(run, d, "29541", 30)
    t_h0 = time.time()
    time.sleep(8)
    t_kill = time.time()
    ranks[0].kill()
    run.event("survivor: SIGKILL rank 0 (the TCPStore host)")
    proc = psutil.Process(ranks[1].pid)
    proc.cpu_percent(None)
    cpu = []
    while time.time() - t_kill < 40 and ranks[1].poll() is None:
        time.sleep(5)
        cpu.append(round(proc.cpu_percent(None)))
    t_obs = time.time()
    run.note("survivor.power", {"healthy_gpu1": run.power_between(t_h0, t_kill, 1),
                                "after_kill_gpu1": run.power_between(t_kill + 3, t_obs, 1),
                                "healthy_gpu0": run.power_between(t_h0, t_kill, 0), "survivor_cpu_pct": cpu})
    log_text = (d / "rank1.log").read_text(errors="replace")
    marks = {m: _first_at(log_text, m) for m in ("recvValue failed", "Watchdog caught collective operation timeout",
                                                  "should dump")}
    run.note("survivor.log", {"lines": len(log_text.splitlines()), "first": marks, "kill_at": round(t_kill, 3)})
    if ranks[1].poll() is None:
        t_stop = time.time()
        killed = anyio.run(lambda: proctree.terminate_tree(ranks[1].pid, 5.0))
        ranks[1].wait()
        stopped = time.time() - t_stop
        release = anyio.run(lambda: wait_released(read_gpus, {ranks[1].pid}, 30.0, now=time.monotonic))
        run.note("survivor.stop", {"grace_s": 5.0, "seconds": round(stopped, 2), "sigkilled": killed,
                                   "returncode": ranks[1].returncode, "released": release.released,
                                   "release_s": round(release.seconds, 3)})
    else:
        run.note("survivor.exited", {"returncode": ranks[1].returncode, "after_kill_s": round(t_obs - t_kill, 1)})


def _first_at(text: str, mark: str) -> str | None:
    for line in text.splitlines():
        if mark in line:
            return line[:300]
    return None


# ---- the daemon --------------------------------------------------------------------------------------------


class Daemon:
    def __init__(self, run: Run, d: Path, name: str, health: str, port: int) -> None:
        self.run, self.d, self.name = run, d, name
        state = d / name
        self.world = min(2, len(run.handles))  # two ranks on two GPUs, one on one
        self.probe_dir = state / "run" / "probe"  # <run_dir>/probe: the launch renders the step probe
        self.cfg = toml_config(d / f"{name}.toml", state, util=0.5, port=port,
                               env={"FAKE_VLLM_WORLD": str(self.world), "FAKE_VLLM_PORT": str(29550 + port % 10),
                                    "FAKE_VLLM_DIR": str(state)},
                               extra=f"""[supervisor]
stop_grace_s = 20
hung_stop_grace_s = 5
startup_timeout_s = 300
[restart]
backoff_initial_s = 1
backoff_max_s = 5
[guard]
enabled = false
[health]
{health}
""")
        self.cfg.write_text(self.cfg.read_text().replace("[api]\nport = 0", f"[api]\nport = {port + 1000}"))
        assert f"port = {port + 1000}" in self.cfg.read_text()
        self.state = state / "state"
        self.log = d / f"{name}-daemon.log"
        self.port = port
        self.proc = run.spawn([*SPARKD, "run", "--config", str(self.cfg)], self.log, sparkd_env())

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.state / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        t0 = time.time()
        while time.time() - t0 < timeout:
            s = self.status()
            if s and pred(s):
                return s
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: not reached in {timeout:.0f} s; state {self.status().get('state')}")

    def events(self, *names: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") in names:
                out.append(e)
        return out

    def fault(self) -> str:
        """The last rank faulted: SIGKILLed when a peer waits for it in the all-reduce, SIGSTOPped when alone (a
        lone rank's death would be its exit, not a wedge)."""
        title = f"VLLM::Worker_TP{self.world - 1}"
        if self.world > 1:
            kill_pid(rank_pid(title))
            return f"SIGKILL rank {self.world - 1}"
        kill_pid(rank_pid(title), signal.SIGSTOP)
        return "SIGSTOP rank 0"

    def ctl(self, *args: str) -> float:
        t0 = time.time()
        subprocess.run([*SPARKCTL, "--config", str(self.cfg), *args], env=sparkd_env(), timeout=120,
                       capture_output=True)
        return time.time() - t0

    def keep(self) -> None:
        for src in (self.state / "status.json", self.d / self.name / "logs" / "vllm.log"):
            if src.exists():
                shutil.copy(src, self.d / f"{self.name}-{src.name}")
        incidents = self.state / "incidents"
        if incidents.is_dir():
            shutil.copytree(incidents, self.d / f"{self.name}-incidents", dirs_exist_ok=True)

    def end(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.keep()


def rank_pid(title: str) -> int:
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [""])[0].startswith(title):
            return p.pid
    raise RuntimeError(f"no {title}")


def daemon(run: Run) -> None:
    import httpx

    d = run.out / "daemon"
    d.mkdir(exist_ok=True)
    # One GPU: the daemon's step probe names the SIGSTOPped rank (the canary's timeout and busy grace are far off).
    # Two: the SIGKILLed rank's record goes with it, the survivor waits in its all-reduce, and the canary names it.
    one = len(run.handles) < 2
    blind = "canary_timeout_s = 30\nbusy_grace_s = 60" if one else "canary_timeout_s = 2\nbusy_grace_s = 4"
    a = Daemon(run, d, "hung", f"interval_s = 1\ncanary_interval_s = 2\n{blind}", 8021)
    try:
        s = a.wait(lambda s: s.get("state") == "ready", 240)
        run.note("daemon.hung.ready", {"gpu": s.get("gpu"), "memory_check": [r for r in a.events("preflight")
                                                                              if r.get("check") in ("memory", "gpu")]})
        (d / "metrics-ready.txt").write_text(httpx.get(f"http://127.0.0.1:{a.port + 1000}/metrics").text)
        watch = ProbeWatch(a.probe_dir, "gpu-host", run.out / "probe-fixture",
                           f"{run.summary.get('info', {}).get('devices', ['?'])[0]}, {a.world} NCCL rank(s) "
                           "(tests/gpu/nccl_rank.py) under fake_vllm.py and sparkd run; read when the rules named it")
        watch.start()
        time.sleep(5)  # healthy steps: the probe's yardstick
        t_kill = time.time()
        watch.fault()
        run.event(f"daemon hung: {a.fault()}")
        s = a.wait(lambda s: s.get("state") in ("stopping", "backoff", "preflight") or s.get("launches", 1) > 1, 120)
        t_verdict = time.time()
        failure = a.wait(lambda s: s.get("last_failure") is not None, 30)["last_failure"]
        run.note("daemon.hung.failure", {"class": failure["class"], "message": failure["message"],
                                         "evidence": (failure.get("evidence") or "")[:600],
                                         "after_fault_s": round(t_verdict - t_kill, 2)})
        run.note("daemon.hung.probe", watch.stop(timeout=30.0))
        s = a.wait(lambda s: (s.get("last_stop") or {}).get("released") is not None, 120)
        stopped = a.events("stopped", "gpu_release", "transition")
        run.note("daemon.hung.stop", {"verdict_after_kill_s": round(t_verdict - t_kill, 2),
                                      "last_stop": s.get("last_stop"), "events": stopped[-6:]})
        s = a.wait(lambda s: s.get("state") == "ready" and s.get("launches", 0) >= 2, 240)
        run.note("daemon.hung.restarted", {"launches": s.get("launches"), "preflight": [
            r for r in a.events("preflight") if r.get("check") in ("memory", "gpu", "stale_processes")][-3:]})
        t0 = time.time()
        a.ctl("stop")
        s = a.wait(lambda s: s.get("state") == "stopped", 120)
        run.note("daemon.hung.operator_stop_healthy", {"seconds": round(time.time() - t0, 2),
                                                        "last_stop": s.get("last_stop")})
    finally:
        a.end()
    b = Daemon(run, d, "drain", "interval_s = 1\ncanary_interval_s = 2\ncanary_timeout_s = 2\nbusy_grace_s = 600", 8031)
    try:
        b.wait(lambda s: s.get("state") == "ready", 240)
        run.event(f"daemon drain: {b.fault()}, then sparkctl stop")
        time.sleep(2)
        t0 = time.time()
        b.ctl("stop")
        s = b.wait(lambda s: s.get("state") == "stopped" and s.get("last_stop"), 120)
        run.note("daemon.drain.stop", {"seconds": round(time.time() - t0, 2), "last_stop": s.get("last_stop")})
    finally:
        b.end()


PHASE_FUNCTIONS: dict[str, Callable[[Run], None]] = {"info": info, "preflight": preflight, "survivor": survivor,
                                                      "daemon": daemon}
