"""What the runtime tests share: test programs standing in for vLLM, launch specs, a log follower, and the places
a runtime under test runs in (a tmp dir on the host, or a fresh container name and node of the test image)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio

from sparkd.config import Config, config_from_mapping
from sparkd.host.waits import Flag
from sparkd.launch.render import LaunchSpec
from sparkd.runtime import RuntimeKind, runtime_class
from sparkd.runtime.base import Instance, Runtime

TIMEOUT = 60.0
HANDLES_TERM = (
    "import signal, sys, time\n"
    "def bye(*_):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(7)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)
IGNORES_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)
# A tree that ignores SIGTERM: the program and a child of its own (vLLM's engine core and workers).
IGNORES_TERM_TREE = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child ready\", flush=True); time.sleep(600)'])\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


def py(python: str, program: str, config_hash: str = "h-py") -> LaunchSpec:
    return LaunchSpec(argv=(python, "-u", "-c", program), env={"SPARKD_TEST": "1"}, config_hash=config_hash)


def sh(script: str) -> LaunchSpec:
    return LaunchSpec(argv=("bash", "-c", script), config_hash="h-sh")


class Follower:
    """Collects an instance's log lines in the background."""

    def __init__(self, runtime: Runtime, instance: Instance) -> None:
        self.runtime, self.instance = runtime, instance
        self.lines: list[str] = []
        self.done = Flag()
        self.ended = anyio.Event()

    async def run(self) -> None:
        async for line in self.runtime.follow_logs(self.instance, self.done):
            self.lines.append(line)
        self.ended.set()

    async def wait_for(self, text: str) -> None:
        with anyio.fail_after(TIMEOUT):
            while text not in self.lines:
                await anyio.sleep(0.05)


async def run_to_end(runtime: Runtime, instance: Instance) -> tuple[int | None, list[str]]:
    """Wait for the instance's exit while following its log; (exit code, lines)."""
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.wait(instance)
            follower.done.set()
            await follower.ended.wait()
    return info.exit_code, follower.lines


class DockerPlace:
    """One test's container name, node name, configs and runtimes of one Docker runtime kind; ``remove`` takes
    away every container of this test (by the session and node labels, never anything else)."""

    def __init__(self, kind: RuntimeKind, client: Any, image: str, mounts: dict[str, dict[str, str]],
                 labels: dict[str, str], session: str, shared_dir: Path) -> None:
        self.kind, self.client, self.image, self.labels, self.session = kind, client, image, labels, session
        self.mounts = [{"source": src, "target": m["bind"], "read_only": m["mode"] == "ro"}
                       for src, m in mounts.items()]
        self.mounts.append({"source": str(shared_dir), "target": str(shared_dir), "read_only": False})
        self.shared_dir = shared_dir
        tag = uuid.uuid4().hex[:8]
        self.name = f"sparkd-{kind.value}-{session}-{tag}"
        self.node = f"node-{tag}"

    def config(self, *, image: str | None = None, mounts: list[dict[str, Any]] | None = None,
               gpus: str | None = None, sections: dict[str, Any] | None = None, **container: Any) -> Config:
        """A config of this place; ``container`` keys override the defaults, ``sections`` add other sections."""
        data = {
            "node": {"name": self.node, **(sections or {}).get("node", {})},
            "runtime": self.kind.value,
            "container": {
                "name": self.name, "image": image or self.image,
                "mounts": self.mounts if mounts is None else mounts,
                "gpus": gpus, "host_network": True, "host_ipc": False,
                "env": {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
                "compile_cache_dir": str(self.shared_dir / "caches"),  # docker-run's, never the host's /var/cache
                **container,
            },
            "launch": {"model": "m"},
            # sparkd's own folders in this test's (the step probe's directory is <run_dir>/probe, made on launch)
            "paths": {"run_dir": str(self.shared_dir / "sparkd-run"), **(sections or {}).get("paths", {})},
            **{k: v for k, v in (sections or {}).items() if k not in ("node", "paths")},
        }
        return config_from_mapping(data, env={})

    def runtime(self, cfg: Config | None = None, *, rehearse: bool = False) -> Any:
        cls: Any = runtime_class(self.kind)
        return cls(cfg or self.config(), rehearse=rehearse, labels=self.labels)

    def container(self) -> Any:
        return self.client.containers.get(self.name)

    def ours(self) -> list[Any]:
        """Every container of this test (launches and check containers), by the session and node labels."""
        return self.client.containers.list(all=True, filters={"label": [
            f"sparkd.test.session={self.session}", f"sparkd.node={self.node}"]})

    def remove(self) -> None:
        for container in self.ours():
            container.remove(force=True, v=True)
