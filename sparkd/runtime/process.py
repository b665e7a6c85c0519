"""vLLM (or the stand-in) as a process on the host: bare-metal installs, the demo and the tests.

The rendered launch script runs under bash in its own session; its output is appended to a file that
sparkd follows, so the instance survives a daemon restart and is adopted by the next daemon.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import psutil

from sparkd.config import Config
from sparkd.host.safefile import fresh_file, replace_file
from sparkd.host.waits import Flag
from sparkd.launch.render import LaunchSpec, render_script
from sparkd.runtime import proctree
from sparkd.runtime.base import EXEC_TIMEOUT_S, ExecResult, ExitInfo, Instance, LaunchError, Runtime
from sparkd.runtime.launch_target import missing_host_target
from sparkd.runtime.logfile import follow_file
from sparkd.runtime.probedir import prepare
from sparkd.state.files import read_regular

VLLM_OOM_SCORE_ADJ = 500


def write_atomic(path: Path, text: str, mode: int = 0o640) -> None:
    """``path`` replaced through a temp file of a random name, never through a link or a FIFO (sparkd.host.safefile)."""
    replace_file(path, text.encode("utf-8"), mode)


class ProcessRuntime(Runtime):
    name = "process"

    def __init__(self, work_dir: Path, *, raw_log_limit: int = 8 * 1024 * 1024) -> None:
        self.work_dir = work_dir
        self.script_path = work_dir / "launch.sh"
        self.raw_log = work_dir / "vllm.out"
        self.raw_log_limit = raw_log_limit
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._exits: dict[int, ExitInfo] = {}

    @classmethod
    def from_config(cls, cfg: Config, *, rehearse: bool = False) -> ProcessRuntime:
        return cls(cfg.paths.state_dir / "run")

    async def launch(self, spec: LaunchSpec) -> Instance:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        prepare(spec.probe_dir)
        write_atomic(self.script_path, render_script(spec), 0o750)
        with os.fdopen(fresh_file(self.raw_log), "ab") as out:
            try:
                # vLLM, not sparkd, must be the kernel's first choice under memory pressure: raise its
                # oom_score_adj above sparkd's (the unit sets -900); raising needs no privilege.
                child = subprocess.Popen(
                    ["bash", "-c", f"echo {VLLM_OOM_SCORE_ADJ} > /proc/self/oom_score_adj 2>/dev/null; "
                     'exec bash "$0"', str(self.script_path)], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                    env={**os.environ, **spec.secret_env},  # never in the script: only the process has them
                )
            except OSError as exc:  # no bash: nothing else would run either
                raise LaunchError(f"cannot start bash for {self.script_path}: {exc}", 127) from exc
        self._children[child.pid] = child
        return Instance(
            runtime=self.name, pid=child.pid, create_time=proctree.create_time(child.pid),
            config_hash=spec.config_hash, log_path=str(self.raw_log),
        )

    # ---- where vLLM runs: this host

    where = "on this host"
    shares_host_network = True
    shares_host_ipc = True

    async def exec(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout_s: float = EXEC_TIMEOUT_S) -> ExecResult:
        """The command on the host with sparkd's environment plus ``env``; killed past ``timeout_s`` (124).
        A missing executable is exit 127, as a shell says."""
        result = None
        try:
            with anyio.move_on_after(timeout_s):
                result = await anyio.run_process(list(cmd), check=False, env={**os.environ, **(env or {})},
                                                 stdin=subprocess.DEVNULL)
        except FileNotFoundError as exc:
            return ExecResult(127, "", f"{cmd[0]}: {exc.strerror}")
        except PermissionError as exc:
            return ExecResult(126, "", f"{cmd[0]}: {exc.strerror}")
        if result is None:
            return ExecResult(124, "", f"timed out after {timeout_s:g} s")
        return ExecResult(result.returncode, result.stdout.decode("utf-8", errors="replace"),
                          result.stderr.decode("utf-8", errors="replace"))

    async def read_file(self, path: str) -> str | None:
        """The host file read directly (no process started); None when it is not a regular file."""
        target = Path(path)
        if not target.is_file():
            return None
        try:
            data = await anyio.to_thread.run_sync(read_regular, target)
        except OSError:
            return None
        return data.decode("utf-8", errors="replace")

    async def missing_target(self, spec: LaunchSpec) -> str | None:
        return missing_host_target(spec.argv, spec.env)

    async def inspect(self, instance: Instance) -> dict[str, Any] | None:
        """The instance's main process as the kernel shows it (argv, state, memory, tree), while it runs."""
        proc = proctree.same_process(instance.pid, instance.create_time)
        if proc is None:
            return None
        try:
            with proc.oneshot():
                return {
                    "Pid": proc.pid, "Cmdline": proc.cmdline(), "Status": proc.status(),
                    "CreateTime": proc.create_time(), "Cwd": proc.cwd(), "RssBytes": proc.memory_info().rss,
                    "TreePids": sorted(proctree.tree_pids(proc.pid)),
                }
        except psutil.Error:
            return None

    async def find(self, record: dict[str, Any] | None) -> Instance | None:
        if not record or record.get("runtime") != self.name:
            return None
        instance = Instance.from_record(record)
        if proctree.same_process(instance.pid, instance.create_time) is None:
            return None
        return instance

    async def wait(self, instance: Instance) -> ExitInfo:
        if instance.pid in self._exits:
            return self._exits[instance.pid]
        await proctree.wait_exit(instance.pid)
        child = self._children.pop(instance.pid, None)
        if child is None:
            info = ExitInfo(exit_code=None)  # adopted: another process reaps it
        else:
            code = child.poll()  # the pidfd fired: it has exited, reaping it needs no thread
            info = ExitInfo.from_returncode(code if code is not None else await anyio.to_thread.run_sync(child.wait))
        self._exits[instance.pid] = info
        return info

    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        killed = await proctree.terminate_tree(instance.pid, grace_s)
        return replace(await self.wait(instance), killed=tuple(killed))

    async def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
        path = Path(instance.log_path or self.raw_log)
        async for line in follow_file(path, done, truncate_over=self.raw_log_limit):
            yield line


RUNTIME = ProcessRuntime  # what sparkd.runtime.runtime_class finds for this kind
