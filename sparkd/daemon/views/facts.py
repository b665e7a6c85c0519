"""What the daemon tells of itself in its status: what it cannot do right now (it reports itself degraded until
they clear), the config on disk against the one in force and the one vLLM runs from, the flight recorder's and the
memory settle's state, the group's proofs. Each read from the part that knows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sparkd.commands.statusdoc import Checks, Extras
from sparkd.daemon.boot.breaker import ConfigBreaker
from sparkd.daemon.boot.reload import Reloader, keep_fixed
from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.restartgate import StartGuard
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.logs import VllmLog


class RecorderFacts(Protocol):
    """The flight recorder as the status reads it."""

    def problems(self) -> list[str]: ...

    def status(self) -> dict[str, Any]: ...


class DaemonFacts:
    def __init__(self, node: Callable[[], NodeState], files: StateWriter, vllm_log: VllmLog,
                 recorder: RecorderFacts, gate: StartGuard, reloader: Reloader, breaker: ConfigBreaker,
                 checks: GroupChecks) -> None:
        self.node = node
        self.files = files
        self.vllm_log = vllm_log
        self.recorder = recorder
        self.gate = gate
        self.reloader = reloader
        self.breaker = breaker
        self.checks = checks

    def problems(self) -> list[str]:
        """What sparkd itself cannot do right now (it reports itself degraded until they clear)."""
        problems = sorted(self.files.problems.values()) + self.recorder.problems()
        if self.vllm_log.write_error:
            problems.append(f"vLLM's output is not being kept on disk: {self.vllm_log.write_error} "
                            f"({self.vllm_log.lost_lines} line(s) lost)")
        return problems

    def more(self) -> Extras:
        """The flight recorder's and the memory settle's status."""
        extra: Extras = {"recorder": {**self.recorder.status(), **self.gate.status()}}
        settling = self.node().settling
        if settling is not None:
            extra["phase"] = settling
        return extra

    def proofs(self) -> Checks:
        return self.checks.status()

    def config_state(self) -> dict[str, Any]:
        """The config on disk against the one in force and the one the running vLLM was launched from."""
        disk = self.reloader.on_disk()
        breaker = {"breaker": self.breaker.note} if self.breaker.note else {}
        if disk is None:
            return {"path": None, **breaker}
        path = str(self.reloader.path)
        if isinstance(disk, list):
            return {"path": path, "valid": False, "problems": disk, **breaker}
        state = self.node()
        loaded, on_disk = state.config.launch_hash(), disk.launch_hash()
        running = state.instance.config_hash if state.instance is not None else None
        return {"path": path, "valid": True, "hash_on_disk": on_disk, "hash_loaded": loaded, "hash_running": running,
                "reload_needed": disk != keep_fixed(state.config, disk) or on_disk != loaded,
                "restart_needed": running is not None and running != on_disk, **breaker}
