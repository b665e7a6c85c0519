"""The optional bandwidth run (``[fabric] bandwidth``): perftest's ``ib_write_bw`` between the head and each
worker, where vLLM runs (the image must have perftest), for ``[fabric] bandwidth_s`` seconds.

The worker's sparkd starts the server (``POST /v1/rank/bandwidth``, answered when the server exits); the head
starts the client a moment later against the worker's fabric address. Cost: ``bandwidth_s`` plus about 3 s of
setup per worker, run one worker after another so the figures do not share the head's link. No perftest in
the image is a note, not a failure.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.cluster.peers import PeerClient, PeerRefused, PeerUnreachable
from sparkd.commands.groupcheck import RANK_BANDWIDTH, BandwidthRequest
from sparkd.config import Config
from sparkd.runtime.base import ExecResult, TargetUnavailable

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

CLIENT_DELAY_S = 1.0
SETUP_S = 10.0
_ROW = re.compile(r"^\s*\d+\s+\d+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s*$")

Exec = Callable[[Sequence[str], float], Awaitable[ExecResult]]


def parse_gbps(output: str) -> float | None:
    """BW average (Gb/s) from ``ib_write_bw --report_gbits`` output: ``#bytes #iterations peak average rate``."""
    for line in output.splitlines():
        m = _ROW.match(line)
        if m:
            return float(m.group(1))
    return None


def argv(seconds: int, port: int, device: str | None, gid_index: int | None, server: str | None = None) -> list[str]:
    """``ib_write_bw`` for ``seconds`` on ``port``; the client names the server's address."""
    out = ["ib_write_bw", "-D", str(seconds), "-p", str(port), "--report_gbits", "-F"]
    if device:
        hca, _, number = device.partition(" port ")
        out += ["-d", hca] + (["-i", number] if number else [])
    if gid_index is not None:
        out += ["-x", str(gid_index)]
    return out + ([server] if server else [])


async def serve(run: Exec, seconds: int, port: int, device: str | None, gid_index: int | None) -> dict[str, Any]:
    """The worker's side: one ``ib_write_bw`` server run, bounded; what it said."""
    try:
        result = await run(argv(seconds, port, device, gid_index), seconds + SETUP_S)
    except TargetUnavailable as exc:
        return {"exit_code": None, "note": str(exc)}
    return {"exit_code": result.exit_code, "gbps": parse_gbps(result.stdout),
            "note": (result.stderr or result.stdout).strip()[-300:] if result.exit_code else ""}


class Bandwidth:
    """The head's side: for one worker, the server there and the client here, side by side."""

    def __init__(self, config: Callable[[], Config], client: PeerClient, run: Exec, log: Logger) -> None:
        self.config = config  # the config in force, read at every run
        self.client = client
        self.run = run
        self.log = log

    @property
    def cfg(self) -> Config:
        """The config in force (a reload is read from the next use on)."""
        return self.config()

    async def measure(self, peer: str, address: str, device: str | None = None,
                      gid_index: int | None = None) -> tuple[float | None, str]:
        """(Gb/s or None, a note saying what happened)."""
        seconds, port = self.cfg.fabric.bandwidth_s, self.cfg.fabric.bandwidth_port
        server: dict[str, Any] = {}

        async def remote() -> None:
            try:
                answer = await self.client.call(peer, RANK_BANDWIDTH, BandwidthRequest(seconds, port),
                                                timeout_s=seconds + SETUP_S + 5, retries=0)
                server.update(answer)
            except (PeerUnreachable, PeerRefused) as exc:
                server["note"] = str(exc)

        result: ExecResult | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(remote)
            await anyio.sleep(CLIENT_DELAY_S)
            try:
                result = await self.run(argv(seconds, port, device, gid_index, address), seconds + SETUP_S)
            except TargetUnavailable as exc:
                server.setdefault("note", str(exc))
        gbps = parse_gbps(result.stdout) if result is not None and result.exit_code == 0 else None
        if result is not None and result.exit_code == 127:
            note = "ib_write_bw is not installed where vLLM runs on the head"
        elif server.get("exit_code") == 127:
            note = f"ib_write_bw is not installed where vLLM runs on {peer}"
        elif gbps is None:
            note = f"no figure: {server.get('note') or (result.stderr.strip()[-200:] if result else '')}"
        else:
            note = f"{gbps:.1f} Gb/s over {seconds} s (ib_write_bw)"
        self.log.info("fabric_bandwidth", peer=peer, gbps=gbps, note=note)
        return gbps, note
