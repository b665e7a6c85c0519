"""The one interface every way of running vLLM implements, and the records it trades in.

A runtime owns *where vLLM runs*: it launches the rendered launch there, finds an instance it launched earlier
(adoption), waits for its exit (event-driven, never a slow poll), stops it (SIGTERM to the tree, grace, SIGKILL)
and yields its log lines. It also answers preflight's questions about that place, so no check needs to know
which runtime is configured:

- ``where``: the place in words ("on this host", "in container vllm_ds4", "in image X"), for sentences;
- ``exec(cmd)`` / ``read_file(path)``: run a command or read a file there (raise ``TargetUnavailable`` when
  there is nothing to run it in yet);
- ``missing_target(spec)``: why the launch target cannot run there; ``pending_preparation()``: what a launch
  would first create or start (a dry run reports it instead of doing it);
- ``shares_host_network`` / ``shares_host_ipc``: whether vLLM's ports and /dev/shm are the host's;
- ``inspect``, ``image_identity``, ``drift``, ``recreate``: what the engine knows.

The supervisor decides; runtimes only act.
"""

from __future__ import annotations

import abc
import signal as signals
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd.config import Config
from sparkd.host.waits import Flag
from sparkd.launch.render import LaunchSpec
from sparkd.runtime.proctree import Expected, ProcessIdentity, same_identity
from sparkd.supervisor.instance import Instance  # the record a runtime trades in; the core folds it

EXEC_TIMEOUT_S = 60.0
MISSING_FILE = 3  # exit status of READ_SCRIPT when the file is not there
# Print a file; exit 3 when it is not a regular file.
READ_SCRIPT = '[ -f "$1" ] || exit 3\nexec cat -- "$1"\n'


class LaunchError(Exception):
    """The launch could not even start. ``exit_code`` mirrors what a shell would have said (127, 126).
    ``unavailable``: the engine vLLM runs under does not answer — a wait, not a failure of the launch."""

    def __init__(self, message: str, exit_code: int = 127, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.unavailable = unavailable


# How the Docker SDK (and requests under it) say that nothing answers on the engine's socket.
_ENGINE_DOWN = ("Error while fetching server API version", "Connection aborted", "Connection refused",
                "Failed to establish a new connection")


def engine_unreachable(exc: BaseException | None) -> bool:
    """The container engine does not answer (down, restarting, its socket gone), somewhere in ``exc``'s causes."""
    depth = 0
    while exc is not None and depth < 10:
        if type(exc).__name__ in ("ConnectionError", "ConnectionRefusedError") or \
                any(mark in str(exc) for mark in _ENGINE_DOWN):
            return True
        exc, depth = exc.__cause__ or exc.__context__, depth + 1
    return False


class TargetUnavailable(Exception):
    """There is nothing to run a command in where vLLM runs (no container yet, a stopped one, no engine)."""


@dataclass(frozen=True)
class ExitInfo:
    """How an instance ended. ``exit_code`` is None when it cannot be known (an adopted non-child)."""

    exit_code: int | None
    signal: int | None = None
    killed: tuple[int, ...] = ()  # the PIDs sparkd's own stop had to SIGKILL after the grace

    def describe(self) -> str:
        how = self._how()
        return how + (f" (sparkd SIGKILLed PID {', '.join(map(str, self.killed))} after the grace)"
                      if self.killed else "")

    def _how(self) -> str:
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


@dataclass(frozen=True)
class ExecResult:
    """What a command run where vLLM runs said: its exit status, stdout and stderr (decoded, lossy)."""

    exit_code: int
    stdout: str
    stderr: str = ""


@dataclass(frozen=True)
class ImageIdentity:
    """The image vLLM runs from, as the engine knows it: the pair compares ranks by one of these fields."""

    id: str
    repo_digests: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)  # the image's ENV: every process in it starts with it

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "repo_digests": list(self.repo_digests), "labels": dict(self.labels)}


@dataclass(frozen=True)
class Difference:
    """One setting in which the place vLLM runs differs from the config. ``key`` is the config key; for a
    list, ``configured`` holds what the config has and the place lacks, ``actual`` what it has beyond it."""

    key: str
    configured: Any
    actual: Any

    def __str__(self) -> str:
        return f"{self.key}: the config says {self.configured!r}, the container has {self.actual!r}"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "configured": self.configured, "actual": self.actual}


class Runtime(abc.ABC):
    """How vLLM runs on this node."""

    name: str

    @classmethod
    @abc.abstractmethod
    def from_config(cls, cfg: Config, *, rehearse: bool = False) -> Runtime:
        """The runtime for ``cfg`` (``rehearse``: the vLLM stand-in runs in vLLM's place)."""

    def follow(self, config: Callable[[], Config]) -> None:  # noqa: B027 (most runtimes keep nothing of the config)
        """Read the config in force from ``config`` (the daemon's loop; a reload is read from the next use on)."""

    # ---- the lifecycle

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
    def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
        """The instance's output lines from its start; once ``done`` is set (it exited), drain and end."""

    def proven(self, record: dict[str, Any], expected: Expected | None) -> bool:
        """Is the process a record names provably this node's launch (its launch marker, or else running what
        the config launches), never only a PID and a start time a record can forge? A record naming no host
        process (a container that already ended) has nothing to prove."""
        pid = int(record.get("pid") or 0)
        if pid <= 1:
            return True
        identity = record.get("identity")
        known = ProcessIdentity.from_record(identity) if identity else ProcessIdentity(
            pid=pid, create_time=float(record.get("create_time") or 0.0))
        return same_identity(known, expected) is not None

    async def container_pid(self) -> int:
        """The host PID of the launch's container's init while it runs, else 0 (no container: 0)."""
        return 0

    def pids(self, instance: Instance) -> set[int]:
        """Host PIDs of the instance's process tree (the memory guard and stale sweep must spare them)."""
        from sparkd.runtime.proctree import tree_pids

        return tree_pids(instance.pid)

    # ---- where vLLM runs

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """The place vLLM runs, for sentences: ``on this host``, ``in container vllm_ds4``."""

    @property
    @abc.abstractmethod
    def shares_host_network(self) -> bool:
        """vLLM's ports are bound on the host's network (a port check on the host means something)."""

    @property
    @abc.abstractmethod
    def shares_host_ipc(self) -> bool:
        """vLLM's /dev/shm is the host's."""

    @abc.abstractmethod
    async def exec(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout_s: float = EXEC_TIMEOUT_S) -> ExecResult:
        """Run ``cmd`` where vLLM runs (``env`` added to its environment). Raises TargetUnavailable."""

    async def read_file(self, path: str) -> str | None:
        """The text of ``path`` where vLLM runs; None when it is not a regular file there.

        Raises TargetUnavailable, or OSError naming the path when it exists but cannot be read."""
        result = await self.exec(["sh", "-c", READ_SCRIPT, "sparkd-read", path])
        if result.exit_code == MISSING_FILE:
            return None
        if result.exit_code != 0:
            raise OSError(f"{path} cannot be read {self.where} (exit {result.exit_code}: "
                          f"{result.stderr.strip()[:200]})")
        return result.stdout

    @abc.abstractmethod
    async def missing_target(self, spec: LaunchSpec) -> str | None:
        """Why the launch target cannot run where it will run (a sentence naming the path), or None.

        May prepare the place (create or start a container) to look; see ``pending_preparation``."""

    async def pending_preparation(self) -> str | None:
        """What a launch would first create or start where vLLM runs (a dry run reports this instead of
        checking the target), or None when that place is ready as it is. The host always is."""
        return None

    # ---- what the engine knows

    async def engine_answers(self) -> bool:
        """Does the engine vLLM runs under take a new connection now? A Docker engine that is stopping closes
        its socket first, then stops its containers, and meanwhile still answers on connections already open
        with errors of its own: only a new connection tells that it is going away. The host always answers."""
        return True

    async def inspect(self, instance: Instance) -> dict[str, Any] | None:
        """What the engine (or the kernel) says about the instance, for incident folders; None once gone."""
        return None

    async def image_identity(self) -> ImageIdentity | None:
        """Id, repo digests and labels of the image vLLM runs from, read now; None when vLLM runs from no image
        (on the host) or the image is not there (the launch reports that)."""
        return None

    async def drift(self) -> list[Difference]:
        """How an existing place vLLM runs (an adopted container) differs from the config, key by key.
        Empty when there is nothing sparkd did not just create from the config."""
        return []

    async def recreate(self) -> str:
        """Replace the place vLLM runs with one made from the config (``sparkctl recreate``); the instance must
        be stopped first. Returns what was done, as a sentence. Raises LaunchError."""
        return f"nothing to recreate: vLLM runs {self.where}"
