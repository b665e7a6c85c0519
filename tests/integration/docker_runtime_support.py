"""What the docker-exec and docker-run runtime tests share: test programs, launch specs, a log follower."""

from __future__ import annotations

import anyio
import pytest

from sparkd.launch import LaunchSpec
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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def py(venv_python: str, program: str, config_hash: str = "h-py") -> LaunchSpec:
    return LaunchSpec(argv=(venv_python, "-u", "-c", program), env={"SPARKD_TEST": "1"}, config_hash=config_hash)


def sh(script: str) -> LaunchSpec:
    return LaunchSpec(argv=("bash", "-c", script), config_hash="h-sh")


class Follower:
    """Collects an instance's log lines in the background."""

    def __init__(self, runtime: Runtime, instance: Instance) -> None:
        self.runtime, self.instance = runtime, instance
        self.lines: list[str] = []
        self.done = anyio.Event()
        self.ended = anyio.Event()

    async def run(self) -> None:
        async for line in self.runtime.follow_logs(self.instance, self.done):
            self.lines.append(line)
        self.ended.set()

    async def wait_for(self, text: str) -> None:
        with anyio.fail_after(TIMEOUT):
            while text not in self.lines:
                await anyio.sleep(0.05)
