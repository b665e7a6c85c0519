"""The one small interface every way of running vLLM implements.

A runtime launches the rendered launch, finds an instance it launched earlier (adoption), waits for its exit
(event-driven, never a slow poll), stops it (SIGTERM to the tree, grace, SIGKILL) and yields its log lines.
The supervisor decides; runtimes only act.
"""

from __future__ import annotations

import abc
import signal as signals
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from sparkd.launch import LaunchSpec


class LaunchError(Exception):
    """The launch could not even start. ``exit_code`` mirrors what a shell would have said (127, 126)."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Instance:
    """One launched vLLM: enough to find it again after sparkd restarts and to prove it is the same one."""

    runtime: str
    pid: int  # host PID of the launch's main process
    create_time: float  # psutil create_time of that PID: a reused PID has another
    config_hash: str
    container_id: str | None = None
    exec_id: str | None = None
    log_path: str | None = None  # where the runtime's log source reads from
    extra: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Instance:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class ExitInfo:
    """How an instance ended. ``exit_code`` is None when it cannot be known (an adopted non-child)."""

    exit_code: int | None
    signal: int | None = None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signals.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        if self.exit_code is None:
            return "exited (status unknown: not our child)"
        return f"exited with status {self.exit_code}"

    @classmethod
    def from_returncode(cls, code: int) -> ExitInfo:
        # Popen's negative returncode means "killed by signal"; a shell reports it as 128+N.
        if code < 0:
            return cls(exit_code=None, signal=-code)
        if code > 128 and code - 128 in {s.value for s in signals.Signals}:
            return cls(exit_code=code, signal=code - 128)
        return cls(exit_code=code)


class Runtime(abc.ABC):
    """How vLLM runs on this node."""

    name: str

    @abc.abstractmethod
    async def launch(self, spec: LaunchSpec) -> Instance:
        """Start the launch; return once the main process exists. Raises LaunchError."""

    @abc.abstractmethod
    async def find(self, record: dict[str, Any] | None) -> Instance | None:
        """The running instance this node launched (from the state record or labels), or None."""

    @abc.abstractmethod
    async def wait(self, instance: Instance) -> ExitInfo:
        """Block until the instance's main process has exited."""

    @abc.abstractmethod
    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        """SIGTERM the instance's process tree, SIGKILL what is left after ``grace_s``, reap it."""

    @abc.abstractmethod
    def follow_logs(self, instance: Instance, done: anyio.Event) -> AsyncIterator[str]:
        """The instance's output lines from its start; once ``done`` is set (it exited), drain and end."""

    async def inspect(self, instance: Instance) -> dict[str, Any] | None:
        """The container's inspect data for incident folders (docker runtimes); None otherwise."""
        return None

    async def configured_image_id(self) -> str | None:
        """The id of the image vLLM runs from (docker runtimes), for comparing the ranks of a pair."""
        return None

    async def missing_target(self, spec: LaunchSpec) -> str | None:
        """Why the launch target cannot run where it will run (a sentence naming the path), or None."""
        return None

    def pids(self, instance: Instance) -> set[int]:
        """Host PIDs of the instance's process tree (the memory guard and stale sweep must spare them)."""
        from sparkd.runtime.proctree import tree_pids

        return tree_pids(instance.pid)
