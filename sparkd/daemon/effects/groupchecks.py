"""The group's two proofs before a start, on this node: the fabric (the head measures it; a worker answers) and
the weights (every node keeps its manifest; the head compares). The commands reach them as ``control.checks``
(:class:`sparkd.commands.base.Checks`); the node runs :meth:`GroupChecks.fabric` and :meth:`GroupChecks.weights`
on a head's start; status and metrics read :meth:`GroupChecks.status`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.commands.statusdoc import Checks
from sparkd.config import Config, Role
from sparkd.host.logs import Logger
from sparkd.launch.render import effective_env
from sparkd.runtime.base import ExecResult, ImageIdentity, Runtime
from sparkd.supervisor.failures import Failure

if TYPE_CHECKING:
    from sparkd.cluster.fabric_check import FabricCheck
    from sparkd.cluster.peers import PeerClient
    from sparkd.cluster.weights import Parity
    from sparkd.preflight.weights_local import LocalWeights


class GroupChecks:
    def __init__(self, config: Callable[[], Config], runtime: Runtime, client: PeerClient | None, *, log: Logger,
                 image: Callable[[], ImageIdentity | None], spawn: Callable[..., Any] | None = None,
                 sys_root: Path = Path("/sys")) -> None:
        self.config = config  # the loop's: every proof reads the config in force
        cfg = config()
        self.runtime = runtime
        self.log = log
        self.image = image
        self.sys_root = sys_root
        self.spawn = spawn
        self._local: LocalWeights | None = None  # made when first asked: a single node at rest never loads it
        self.head = client is not None and cfg.node.role is Role.head
        self.fabric_check: FabricCheck | None = None
        self.parity: Parity | None = None
        if client is not None and self.head:  # the group's proofs: a single node never loads them
            from sparkd.cluster.bandwidth import Bandwidth
            from sparkd.cluster.fabric_check import FabricCheck
            from sparkd.cluster.weights import Parity

            bandwidth = Bandwidth(config, client, self._exec, log)
            self.fabric_check = FabricCheck(config, client, env=self.env, log=log, sys_root=sys_root,
                                            bandwidth=bandwidth)
            self.parity = Parity(config, client, self._manifest, log)

    @property
    def cfg(self) -> Config:
        return self.config()

    @property
    def local(self) -> LocalWeights:
        """This node's model directory: its manifest and the hash cache behind it."""
        if self._local is None:
            from sparkd.preflight.weights_local import LocalWeights

            self._local = LocalWeights(self.config, log=self.log, spawn=self.spawn)
        return self._local

    async def _manifest(self, **kw: Any) -> Any:
        return await self.local.manifest(**kw)

    def env(self) -> dict[str, str]:
        image = self.image()
        return {k: s.value for k, s in effective_env(self.cfg, image.env if image else None).items()}

    async def _exec(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        return await self.runtime.exec(argv, timeout_s=timeout_s)

    # ---- a head's start
    async def fabric(self) -> Failure | None:
        return await self.fabric_check.run() if self.fabric_check is not None else None

    async def weights(self) -> Failure | None:
        return await self.parity.run() if self.parity is not None else None

    # ---- what the head asks of a worker (sparkd.commands.groupcheck)
    async def fabric_answer(self, address: str | None, size: int, master: tuple[str, int] | None,
                            timeout_s: float) -> dict[str, Any]:
        from sparkd.cluster.fabric_probe import answer

        return await answer(self.cfg, self.sys_root, self.env(), address=address, size=size, master=master,
                            timeout_s=timeout_s)

    async def bandwidth_server(self, seconds: int, port: int) -> dict[str, Any]:
        from sparkd.cluster.bandwidth import serve
        from sparkd.cluster.fabric_probe import local_end

        end = await anyio.to_thread.run_sync(local_end, self.cfg, self.sys_root, self.env())
        gid = end.gid
        return await serve(self._exec, seconds, port, gid.port if gid else None, gid.index if gid else None)

    async def manifest(self, *, full: bool) -> dict[str, Any]:
        return {"node": self.cfg.node.name, "manifest": (await self.local.manifest(full=full)).to_json()}

    async def weights_view(self, *, full: bool) -> dict[str, Any]:
        if self.parity is not None:
            failure = await self.parity.run(full=full)
            report = dict(self.parity.report or {})
            report.update(scope="group", failure=failure.sentence if failure else None)
            if not self.cfg.weights.parity:
                report.update(ok=None, skipped="[weights] parity = false")
            return report
        m = await self.local.manifest(full=full)
        if m.skipped:
            return {"scope": "node", "ok": None, "skipped": m.skipped}
        return {"scope": "node", "ok": m.problem is None, "nodes": {self.cfg.node.name: {
            "root": m.root, "files": len(m.files), "hashed": len(m.hashed), "pending": len(m.pending),
            "duration_s": round(m.duration_s, 3), "problem": m.problem}}, "manifest": m.to_json()}

    # ---- status and metrics
    def status(self) -> Checks:
        last = self._local.last if self._local is not None else None
        return {
            "fabric": list(self.fabric_check.report.values()) if self.fabric_check is not None else None,
            "weights": {"group": self.parity.report if self.parity is not None else None,
                        "local": None if last is None else {
                            "root": last.root, "files": len(last.files), "hashed": len(last.hashed),
                            "pending": len(last.pending), "duration_s": round(last.duration_s, 3),
                            "problem": last.problem, "low_priority": last.low_priority}},
        }
