"""The daemon's signals, once the boot is done: SIGHUP reloads the config; SIGTERM or SIGINT stops vLLM and ends
the daemon (a second one ends vLLM at once instead of waiting out the grace; with ``[supervisor] leave_running``
sparkd exits and leaves vLLM to the next daemon). What each does goes through the loop's queue or its effects."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from sparkd.daemon.boot.reload import Reloader
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.host.logs import Logger
from sparkd.supervisor.instance import Instance


class Stopping(Protocol):
    """Who tells systemd sparkd is stopping."""

    def stopping(self) -> Any: ...


class SignalHandler:
    def __init__(self, sup: Supervisor, reloader: Reloader, hurry: Callable[[Instance | None], Awaitable[None]],
                 notifier: Stopping, log: Logger) -> None:
        self.sup = sup
        self.reloader = reloader
        self.hurry = hurry  # a second SIGTERM: end the instance now
        self.notifier = notifier
        self.log = log
        self.seen = 0  # SIGTERM and SIGINT so far

    async def run(self, scope: anyio.CancelScope) -> None:
        """Handle signals until cancelled; ``scope``: the daemon's, cancelled to leave vLLM running."""
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                await self.sup.booted.wait()
                await self.handle(signum, scope)

    async def handle(self, signum: int, scope: anyio.CancelScope) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            self.log.info("signal", signal=name, action="reload")
            await self.reloader.reload()
            return
        self.seen += 1
        leave = self.sup.config().supervisor.leave_running
        self.log.info("signal", signal=name, leave_running=leave, forced=self.seen > 1)
        self.notifier.stopping()
        if leave:
            scope.cancel()
        elif self.seen == 1:
            self.sup.shutdown()
        else:
            await self.hurry(self.sup.instance())
