"""Benchmark: how fast ``sparkctl status`` (and a TAB completion) answers, beside ``supervisorctl status``.

    .venv/bin/python tests/bench/bench_cli.py [--runs 30] [--json out.json]

A real ``sparkd run`` supervises a ready stand-in; beside it supervisord (Debian's) supervises the same stand-in
with its control socket (``[unix_http_server]``). Then, interleaved, each command is run ``--runs`` times as an
operator runs it, a fresh process each time, timed from spawn to exit (wall clock): ``sparkctl --socket S
status`` (exit 0, ready), ``supervisorctl -c CONF status`` (exit 0, RUNNING), a TAB completion of ``sparkctl
re<TAB>`` (click's ``_SPARKCTL_COMPLETE=bash_complete``), and ``python3 -c pass`` from the same venv (the
interpreter's own start, the floor of any Python CLI); then ``sparkctl --config FILE status`` with the daemon's
own config file (its status speaks for the file: nothing validated), and the completions of values: ``sparkctl
incidents <TAB>`` (the daemon's incident ids, over the socket) and ``sparkd check-config --profile <TAB>``.
Target (issue 28): status and every completion ≤ 150 ms median.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import (
    BIN,
    bench_parser,
    end_process,
    free_port,
    log,
    median,
    percentile,
    render_toml,
    rendered_launch,
    run_bench,
    sparkd_config,
    standin_env,
    unique_prefix,
    wait_for,
    wait_healthy,
)
from peers import SparkdPeer

TARGET_MS = 150.0


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(milliseconds from spawn to exit, exit status, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return (time.perf_counter() - t0) * 1000, proc.returncode, proc.stdout


def supervisord(tmp: Path, argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    import shlex

    conf, sock = tmp / "supervisord.conf", tmp / "supervisor.sock"
    environment = ",".join(f'{k}="{v}"' for k, v in env.items())
    conf.write_text("\n".join([
        "[unix_http_server]", f"file={sock}", "chmod=0700", "",
        "[supervisord]", "nodaemon=true", f"logfile={tmp / 'supervisord.log'}", f"pidfile={tmp / 'sd.pid'}",
        f"childlogdir={tmp}", "",
        "[rpcinterface:supervisor]", "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "", "[supervisorctl]", f"serverurl=unix://{sock}", "",
        "[program:standin]", f"command={shlex.join(argv)}", f"environment={environment}", "autorestart=true",
        f"stdout_logfile={tmp / 'standin.log'}", "redirect_stderr=true", ""]))
    out = open(tmp / "supervisord.out", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(["supervisord", "-n", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    return proc, conf


def summary(values: list[float]) -> dict[str, Any]:
    return {"median_ms": median(values), "p90_ms": percentile(values, 90), "runs_ms": [round(v, 1) for v in values]}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-cli-"))
    sparkd_port, sd_port = free_port(), free_port()
    prefix = unique_prefix()
    cfg = sparkd_config(tmp / "sparkd", sparkd_port, standin_env(prefix))
    peer = SparkdPeer(tmp / "sparkd", cfg).start()
    sd: subprocess.Popen[bytes] | None = None
    try:
        peer.main_pid(timeout=120)
        wait_healthy(sparkd_port, 120)
        other = sparkd_config(tmp / "sd", sd_port, standin_env(prefix + "S"))
        (tmp / "sd").mkdir(parents=True, exist_ok=True)
        (tmp / "sd" / "sparkd.toml").write_text(render_toml(other))
        argv, env = rendered_launch(tmp / "sd" / "sparkd.toml")
        sd, conf = supervisord(tmp / "sd", argv, env)
        wait_healthy(sd_port, 120)
        socket = Path(cfg["paths"]["run_dir"]) / "sparkd.sock"
        wait_for(lambda: timed([str(BIN / "sparkctl"), "--socket", str(socket), "status"])[1] == 0, 60, "ready")
        def completing(program: str, line: str) -> dict[str, str]:
            return {**os.environ, f"_{program.upper()}_COMPLETE": "bash_complete", "COMP_WORDS": line,
                    "COMP_CWORD": str(len(line.split(" ")) - 1)}

        # one incident to complete: vLLM killed once, and ready again
        first = peer.main_pid(timeout=60)
        os.kill(first, signal.SIGKILL)
        peer.main_pid(old=first, timeout=120)
        wait_for(lambda: timed([str(BIN / "sparkctl"), "--socket", str(socket), "status"])[1] == 0, 60, "ready")
        incidents_line = f"sparkctl --socket {socket} incidents "
        commands = {
            "sparkctl_status": ([str(BIN / "sparkctl"), "--socket", str(socket), "status"], None, "ready"),
            "supervisorctl_status": (["supervisorctl", "-c", str(conf), "status"], None, "RUNNING"),
            "sparkctl_complete": ([str(BIN / "sparkctl")], completing("sparkctl", "sparkctl re"), "restart"),
            "python_start": ([sys.executable, "-c", "pass"], None, ""),
            "sparkctl_status_config": ([str(BIN / "sparkctl"), "--config", str(peer.daemon.config_path), "status"],
                                       None, "ready"),
            "sparkctl_complete_incident": ([str(BIN / "sparkctl")], completing("sparkctl", incidents_line), "plain,"),
            "sparkd_complete_profile": ([str(BIN / "sparkd")],
                                        completing("sparkd", "sparkd check-config --profile "), "throughput"),
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, (argv_, env_, expect) in commands.items():
                ms, code, out = timed(argv_, env_)
                if code != 0 or expect not in out:
                    raise RuntimeError(f"{name}: exit {code}, output {out[:200]!r}")
                times[name].append(ms)
        result = {name: summary(values) for name, values in times.items()}
        for name in ("sparkctl_status", "sparkctl_complete", "sparkctl_status_config", "sparkctl_complete_incident",
                     "sparkd_complete_profile"):
            value = result[name]["median_ms"]
            result[name]["ratio_to_supervisorctl"] = round(value / result["supervisorctl_status"]["median_ms"], 2)
            result[name]["meets_target"] = value <= TARGET_MS
        log(f"sparkctl status {result['sparkctl_status']['median_ms']:.0f} ms, supervisorctl status "
            f"{result['supervisorctl_status']['median_ms']:.0f} ms, completion "
            f"{result['sparkctl_complete']['median_ms']:.0f} ms, python -c pass "
            f"{result['python_start']['median_ms']:.0f} ms; --config status "
            f"{result['sparkctl_status_config']['median_ms']:.0f} ms, incident ids "
            f"{result['sparkctl_complete_incident']['median_ms']:.0f} ms, profile names "
            f"{result['sparkd_complete_profile']['median_ms']:.0f} ms (medians of {args.runs})")
        return {"runs": args.runs, "target_ms": TARGET_MS, "load_avg": os.getloadavg(), **result,
                "seconds": round(time.monotonic() - started, 1)}
    finally:
        if sd is not None:
            end_process(sd, timeout=30)
        peer.close()


def main() -> int:
    parser = bench_parser(__doc__, "sparkd-bench-cli.json")
    parser.add_argument("--runs", type=int, default=30, help="Calls of each command (interleaved).")
    return run_bench(parser, bench)


if __name__ == "__main__":
    sys.exit(main())
