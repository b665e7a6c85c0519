"""Dump what sparkd shows the world, so that a change of its insides can prove it changed nothing outside:

    python tests/surface/dump.py OUT        # at the old commit, then at the new one
    diff -r OUT.old OUT.new

- ``cli/``: ``--help`` of sparkd, sparkctl and every subcommand (nested groups too);
- ``man/``: every manual page (``sparkd.cli.manpages.pages``, a fixed date and version);
- ``completion/``: click's bash, zsh and fish scripts, and the candidates a TAB gets for a few words;
- ``peer/``: every request body (method, path, JSON) a group's head sends its worker over a scripted start, a
  worker's failure, a restart and a stop, the worker's answers canned; and the worker's report of its rank's
  failure to its head;
- ``daemon/``: the status document and ``/metrics`` of a single node and of a head at each step of a scripted life
  (launch, ready, crash, backoff, ready, a reload, stop), on a fake clock, with the host's own figures
  (process_*, the daemon's PID, the temporary paths, the host's memory) replaced by placeholders.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "unit"))  # loop_harness

import anyio  # noqa: E402
import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

WRITTEN: list[Path] = []


def write(out: Path, name: str, text: str) -> None:
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    WRITTEN.append(path)


# ---- the command line ---------------------------------------------------------------------------------------


def commands(group: click.Group, path: list[str]) -> list[list[str]]:
    found = [path]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if isinstance(sub, click.Group):
            found += commands(sub, [*path, name])
        elif sub is not None:
            found.append([*path, name])
    return found


def dump_cli(out: Path) -> None:
    from sparkd.cli.manpages import pages
    from sparkd.cli.sparkctl import main as sparkctl
    from sparkd.cli.sparkd import main as sparkd

    runner = CliRunner()
    for prog, main in (("sparkd", sparkd), ("sparkctl", sparkctl)):
        for path in commands(main, []):
            if path == ["standin"]:  # it execs the stand-in, whose help is vLLM's, not sparkd's
                continue
            result = runner.invoke(main, [*path, "--help"], prog_name=prog, terminal_width=120)
            write(out, f"cli/{' '.join([prog, *path])}.txt", f"exit {result.exit_code}\n{result.output}")
        for shell in ("bash", "zsh", "fish"):
            result = runner.invoke(main, [], prog_name=prog, env={f"_{prog.upper()}_COMPLETE": f"{shell}_source"})
            write(out, f"completion/{prog}.{shell}", result.output)
        for words in ("", "re", "st", "status --", "incidents ", "postmortem --"):
            env = {f"_{prog.upper()}_COMPLETE": "bash_complete", "COMP_WORDS": f"{prog} {words}",
                   "COMP_CWORD": str(len(f"{prog} {words}".split(" ")) - 1), "SPARKD_SOCKET": "/nonexistent/sock"}
            result = runner.invoke(main, [], prog_name=prog, env=env)
            write(out, f"completion/{prog} {words.strip() or '-'}.bash_complete", result.output)
    for name, text in sorted(pages("2026-01-01", "9.9").items()):
        write(out, f"man/{name}", text)


# ---- the daemon: status, metrics, the head's requests ------------------------------------------------------


def normalise(data: Any, tmp: str) -> Any:
    """The host's own figures out of a status: what differs between two runs of the same code."""
    if isinstance(data, dict):
        doc = {k: normalise(v, tmp) for k, v in data.items()}
        for key in ("memory", "daemon_pid"):
            if key in doc:
                doc[key] = f"<{key}>"
        if isinstance(doc.get("recorder"), dict):
            doc["recorder"]["cpu_s"] = "<cpu>"
        return doc
    if isinstance(data, list | tuple):
        return [normalise(v, tmp) for v in data]
    if isinstance(data, str):
        return data.replace(tmp, "<tmp>")
    return data


HOST_METRICS = re.compile(r"^(process_|python_|sparkd_memory_(?!unreturned|baseline))"
                          r"|^# (HELP|TYPE) (process_|python_)")


def metrics_text(raw: bytes, tmp: str) -> str:
    lines = [line for line in raw.decode().splitlines()
             if not HOST_METRICS.match(line) and "_created{" not in line]  # a histogram's creation: real time
    return "\n".join(lines).replace(tmp, "<tmp>") + "\n"


class Scene:
    """Writes the status and the metrics of one daemon at the steps of a script."""

    def __init__(self, out: Path, name: str, tmp: str, status: Callable[[], Any], metrics: Callable[[], bytes]):
        self.out, self.name, self.tmp, self.status, self.metrics = out, name, tmp, status, metrics
        self.n = 0

    def shot(self, step: str) -> None:
        self.n += 1
        prefix = f"daemon/{self.name}/{self.n:02d}-{step}"
        write(self.out, f"{prefix}.status.json", json.dumps(normalise(self.status(), self.tmp), indent=1,
                                                             sort_keys=True) + "\n")
        write(self.out, f"{prefix}.metrics.txt", metrics_text(self.metrics(), self.tmp))


async def single_node(out: Path) -> None:
    import loop_harness

    from sparkd.commands import restart, stop
    from sparkd.testing import FakeClock, FakeRuntime

    with tempfile.TemporaryDirectory(prefix="surface-") as tmp:
        cfg = loop_harness.config(Path(tmp), health={"interval_s": 5, "canary": True})
        runtime, clock = FakeRuntime(), FakeClock()
        async with loop_harness.running(cfg, runtime, clock) as node:
            scene = Scene(out, "single", tmp, node.status, node.daemon.metrics.render)
            scene.shot("booted")
            await node.until_state("ready")
            scene.shot("ready")
            runtime.crash()
            await node.until_state("backoff")
            scene.shot("backoff")
            await node.until_state("ready")
            scene.shot("ready-again")
            assert (await node.command(restart)).ok
            await node.until(lambda: len(runtime.launches) == 3 and node.state == "ready")
            scene.shot("restarted")
            assert (await node.command(stop)).ok
            await node.until_state("stopped")
            await node.settled()
            scene.shot("stopped")


TOKEN = "surface-token-of-the-group\n"


def group_sections(rank: int, token: Path) -> dict[str, dict[str, Any]]:
    """Rank ``rank`` of a group of two, TP 2, whose head is 10.9.0.1."""
    return {"node": {"name": f"spark{rank}", "role": "head" if rank == 0 else "worker", "rank": rank,
                     "address": f"10.9.0.{rank + 1}"},
            "launch": {"tensor_parallel_size": 2}, "api": {"token_file": str(token)},
            "cluster": {"master_addr": "10.9.0.1", "master_port": 29501, "nnodes": 2,
                        "peers": ["10.9.0.2"] if rank == 0 else ["10.9.0.1"], "peer_poll_s": 5},
            "fabric": {"check": False}, "weights": {"parity": False}}


class CannedWorker:
    """The worker as the head's peer link sees it: every request kept, each answered as a worker would."""

    def __init__(self, shared: dict[str, Any] | None = None, role: str = "worker") -> None:
        self.sent: list[dict[str, Any]] = []
        self.state = "stopped"
        self.shared = shared
        self.role = role

    def status(self) -> dict[str, Any]:
        running = self.state in ("starting", "ready")
        return {"node": "spark1" if self.role == "worker" else "spark0", "rank": 1 if self.role == "worker" else 0,
                "role": self.role, "state": self.state, "pid": 4321 if running else None,
                "phase": "loading_weights" if running else None, "last_failure": None, "shared": self.shared,
                "image": None, "gpus_per_node": 1, "updated_at": 1_800_000_000.0}

    async def envelope(self, peer: str, method: str, path: str, *, retries: int = 2, timeout_s: float | None = None,
                       json: object = None) -> dict[str, Any]:
        self.sent.append({"peer": peer, "method": method, "path": path, "json": json, "retries": retries,
                          "timeout_s": timeout_s})
        if path.startswith("/v1/rank/stop"):
            self.state = "stopped"
            return {"ok": True, "result": {"vllm_left": [], "status": self.status()}}
        if path.startswith("/v1/rank/preflight"):
            return {"ok": True, "result": {"ok": True, "results": [], "failure": None}}
        if path.startswith("/v1/rank/start"):
            self.state = "ready"
            return {"ok": True, "result": self.status()}
        if path.startswith("/v1/status"):
            return {"ok": True, "result": self.status()}
        return {"ok": True, "result": {}}


@contextmanager
def peers_answered_by(link: CannedWorker) -> Iterator[None]:
    """Every peer request of this process goes to ``link`` (kept, answered as canned)."""
    from sparkd.cluster.peers import PeerClient

    original = PeerClient.envelope
    PeerClient.envelope = lambda self, *a, **kw: link.envelope(*a, **kw)  # type: ignore[method-assign]
    try:
        yield
    finally:
        PeerClient.envelope = original  # type: ignore[method-assign]


def group_config(tmp: str, rank: int) -> Any:
    import loop_harness

    token = Path(tmp) / "token"
    token.write_text(TOKEN)
    return loop_harness.config(Path(tmp), **group_sections(rank, token))


async def head(out: Path) -> None:
    import loop_harness

    from sparkd.cluster.shared import shared_settings
    from sparkd.commands import restart, stop
    from sparkd.testing import FakeClock, FakeRuntime

    with tempfile.TemporaryDirectory(prefix="surface-") as tmp:
        worker = CannedWorker(shared_settings(group_config(tmp, 1), TOKEN.strip()))
    with peers_answered_by(worker), tempfile.TemporaryDirectory(prefix="surface-") as tmp:
        runtime, clock = FakeRuntime(), FakeClock()
        async with loop_harness.running(group_config(tmp, 0), runtime, clock) as node:
            scene = Scene(out, "head", tmp, node.status, node.daemon.metrics.render)
            scene.shot("booted")
            await node.until_state("ready")
            scene.shot("ready")
            runtime.crash()
            await node.until_state("backoff")
            scene.shot("backoff")
            await node.until_state("ready")
            assert (await node.command(restart)).ok
            await node.until(lambda: len(runtime.launches) == 3 and node.state == "ready")
            scene.shot("restarted")
            assert (await node.command(stop)).ok
            await node.until_state("stopped")
            await node.settled()
            scene.shot("stopped")
    write(out, "peer/head-sends.json", json.dumps(worker.sent, indent=1, sort_keys=True) + "\n")


async def worker(out: Path) -> None:
    """A worker's rank started by its head, then crashing: what it tells the head."""
    import loop_harness

    from sparkd.supervisor import vocabulary as v
    from sparkd.testing import FakeClock, FakeRuntime

    head_link = CannedWorker(role="head")  # the head answers its status like any rank
    with peers_answered_by(head_link), tempfile.TemporaryDirectory(prefix="surface-") as tmp:
        runtime, clock = FakeRuntime(), FakeClock()
        async with loop_harness.running(group_config(tmp, 1), runtime, clock) as node:
            scene = Scene(out, "worker", tmp, node.status, node.daemon.metrics.render)
            scene.shot("booted")
            await node.daemon.control.submit(v.StartRequested())
            await node.until(lambda: runtime.current is not None)
            runtime.say("INFO rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 1")
            await node.until_state("ready")
            scene.shot("ready")
            runtime.crash()
            await node.until(lambda: node.state in ("backoff", "stopped", "failed"))
            await node.settled()
            scene.shot("crashed")
    write(out, "peer/worker-sends.json", json.dumps(head_link.sent, indent=1, sort_keys=True) + "\n")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NO_COLOR", "1")
    from sparkd.testing import new_event_loop

    dump_cli(out)
    for scene in (single_node, head, worker):
        anyio.run(scene, out, backend_options={"loop_factory": new_event_loop})
    print(f"{len(WRITTEN)} files under {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
