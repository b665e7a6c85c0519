"""A neighbour beside the soak's pair for the whole run (issue 23): another sparkd instance serving the stand-in,
and a stand-in tree started by hand with a live API server, both titled with the head's own prefix — exactly what
the pair's preflights, stop sweeps and memory guard look at — in the same PID namespace, as the same user. No
neighbour PID may change, and the neighbour instance never restarts: checked at every sample.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from daemon_harness import STANDIN, Sparkd, alive, base_config, kill_tree, tree
from freeport import free_port

Members = set[tuple[int, float]]  # (PID, create time)


def members(pid: int | None) -> Members:
    if not pid:
        return set()
    out = set()
    for proc in alive(tree(pid)):
        with contextlib.suppress(psutil.Error):
            out.add((proc.pid, proc.create_time()))
    return out


def changes(before: dict[str, Members], now: dict[str, Members], status: dict[str, Any]) -> list[tuple[str, str]]:
    """Pure: what changed about the neighbours since ``before``, as (sentence, detail) violations."""
    out = []
    for name, was in before.items():
        gone = was - now.get(name, set())
        if gone:
            out.append((f"a neighbour's process changed: {name} lost {len(gone)} of its {len(was)} processes",
                        f"gone: {sorted(pid for pid, _ in gone)}"))
    if status.get("restarts") or status.get("launches", 1) != 1 or status.get("state") != "ready":
        out.append(("the neighbour instance did not stay ready with one launch and no restart",
                    f"state {status.get('state')}, launches {status.get('launches')}, restarts "
                    f"{status.get('restarts')}, last failure {status.get('last_failure')}"))
    return out


class Neighbour:
    def __init__(self, tmp: Path, prefix: str, instances_dir: Path) -> None:
        folder = tmp / "neighbour"
        folder.mkdir(parents=True, exist_ok=True)
        # Its own guard off: the soak's leak fault lowers the machine's headroom on purpose, and what is under
        # test is that the pair never touches the neighbour, not how the neighbour guards itself.
        cfg = base_config(folder, free_port(), paths={"instances_dir": str(instances_dir)}, guard={"enabled": False})
        cfg["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"] = prefix
        self.daemon = Sparkd(folder, cfg)
        self.prefix = prefix
        self.port = free_port()
        self.hand: subprocess.Popen[bytes] | None = None
        self.before: dict[str, Members] = {}

    def start(self) -> Neighbour:
        env = {**os.environ, "SPARKD_STANDIN_STARTUP_SECONDS": "0.5", "VLLM_PROCESS_NAME_PREFIX": self.prefix}
        self.hand = subprocess.Popen([str(STANDIN), "serve", "/models/neighbour", "--port", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.daemon.start()
        self.daemon.wait_state("ready", timeout=120)
        deadline = time.monotonic() + 60
        while not all(self._titled(pid) for pid in (self.hand.pid, self.daemon.status().get("pid"))):
            assert time.monotonic() < deadline, "the neighbour's engines never took their titles"
            time.sleep(0.1)
        self.before = self.now()
        return self

    def _titled(self, pid: int | None) -> bool:
        for proc in alive(tree(pid)) if pid else []:
            with contextlib.suppress(psutil.Error):
                if proc.cmdline()[0].startswith(self.prefix + "::"):
                    return True
        return False

    def now(self) -> dict[str, Members]:
        return {"the neighbour instance's vLLM": members(self.daemon.status().get("pid")),
                "the hand-started vLLM": members(self.hand.pid if self.hand else None)}

    def pids(self) -> set[int]:
        """The neighbours' processes now (the soak's own invariants leave them out of the nodes' counts)."""
        roots = [self.daemon.status().get("pid"), self.hand.pid if self.hand else None]
        return {p.pid for root in roots if root for p in tree(int(root))}

    def changed(self) -> list[tuple[str, str]]:
        if not self.before:
            return []
        return changes(self.before, self.now(), self.daemon.status())

    def close(self) -> None:
        family: Iterable[psutil.Process] = []
        if self.hand is not None:
            family = alive(tree(self.hand.pid))
        self.daemon.end()
        kill_tree(list(family))
        if self.hand is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.hand.wait(10)
