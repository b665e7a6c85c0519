"""The webhooks (``[notify]``, :mod:`sparkd.notify`) as a view of the node's state, and where its runbook is served.

- Built only while ``[notify]`` has targets: a daemon without any never imports :mod:`sparkd.notify`
  (``tests/unit/test_daemon_imports.py``). A reload (``ConfigReplaced``) builds the notifier again from the new
  section; a target that goes on keeps what it had not delivered yet (:meth:`Notifier.take_over`); a notifier made
  by a reload that brought the first targets says "watching" at once.
- :meth:`Webhooks.on_state` hands each change of the lifecycle to the notifier (a :class:`Snapshot` of the machine
  before and after); :meth:`Webhooks.guard` the memory guard's decisions (the guard hooks' ``on_decision``). Both
  only append to the notifier's queues: they never wait and never raise.
- :meth:`Webhooks.run`, one task of the daemon's task group, runs the notifier in force (a dead endpoint costs its
  own queue, nothing else) and the next one after a reload.
- :attr:`Webhooks.base`: where this node serves its runbook (``http://host:9479``, None without a TCP port), which
  the status carries so that ``sparkctl status`` links the current failure's section; notifications link there too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.config import Config
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.guard.policy import Decision
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.runbook import RUNBOOK_PATH
from sparkd.supervisor.states import State

if TYPE_CHECKING:
    from sparkd.notify.sender import Notifier, Transport


def served_base(cfg: Config) -> str | None:
    """``http://host:port`` of sparkd's TCP port as another machine reaches it (the listen address; for a wildcard,
    ``[node] address``, else this host's name), or None when there is no TCP port."""
    if not cfg.api.port:
        return None
    host = cfg.listen
    with contextlib.suppress(ValueError):  # a host name is no wildcard
        if ipaddress.ip_address(host).is_unspecified:
            host = cfg.node.address or socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if cfg.api.tls else 'http'}://{host}:{cfg.api.port}"


class Webhooks:
    def __init__(self, config: Callable[[], Config], clock: Clock, log: Logger, *, base: str | None,
                 transport: Transport | None = None) -> None:
        """``config``: the loop's (read at start and on each reload); ``base``: :func:`served_base` of the config
        sparkd started with (its TCP port changes only with a restart); ``transport``: a test's endpoint."""
        self.clock = clock
        self.log = log
        self.base = base
        self.transport = transport
        self.notifier: Notifier | None = None
        self.listeners: list[Callable[[], None]] = []
        self._scope: anyio.CancelScope | None = None
        self._next = anyio.Event()  # a notifier replaced the one the task runs
        self._build(config())

    def tell_changes(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each delivery and each target that starts or stops failing."""
        self.listeners.append(listener)

    # ---- in: never waits, never raises
    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if isinstance(posted, v.ConfigReplaced):
            self._reloaded(after)
        notifier = self.notifier
        if notifier is None or (after.machine is before.machine and after.instance is before.instance):
            return
        notifier.on_state(self._snapshot(before), self._snapshot(after))

    def guard(self, decision: Decision) -> None:
        """The memory guard's decision (``GuardHooks.on_decision``), told when someone needs to hear it."""
        if self.notifier is not None:
            self.notifier.guard(decision.action.value, decision.reason, dry_run=decision.dry_run)

    def status(self) -> dict[str, Any] | None:
        """Each target by name and shape, its URL masked, its state; None without targets."""
        return self.notifier.status() if self.notifier is not None else None

    # ---- out: the task
    async def run(self) -> None:
        """Run the notifier in force until cancelled (the daemon's task group ends it), the next after a reload."""
        while True:
            notifier, self._next = self.notifier, anyio.Event()
            with anyio.CancelScope() as self._scope:
                if notifier is not None:
                    await notifier.run()  # returns at once when no target could be used
                await self._next.wait()

    # ---- building
    def _reloaded(self, state: NodeState) -> None:
        was = self.notifier
        try:
            self._build(state.config)
        except Exception as exc:  # a bug here must not reach the loop: the notifier in force goes on
            self.log.error("notify_rebuild_failed", error=repr(exc))
            return
        if was is None and self.notifier is not None and state.state is not State.adopting:
            self.notifier.on_state(None, self._snapshot(state))  # new targets hear that sparkd watches

    def _build(self, cfg: Config) -> None:
        was = self.notifier
        if not cfg.notify.targets:
            self.notifier = None
        else:
            from sparkd.notify.sender import Notifier  # a daemon without targets never loads the notifier

            made = Notifier(cfg.notify, cfg.node.name, clock=self.clock, log=self.log,
                            runbook_base=f"{self.base}{RUNBOOK_PATH}" if self.base else None,
                            transport=self.transport, on_change=self._changed)
            if was is not None and made.same_as(was):
                was.cfg = made.cfg  # an equal section: the one in force from now on
                return
            if was is not None:
                made.take_over(was)
            self.notifier = made
        if was is not self.notifier:
            if self._scope is not None:
                self._scope.cancel()
            self._next.set()

    def _snapshot(self, state: NodeState) -> Any:
        from sparkd.notify.events import snapshot  # loaded with the notifier

        instance = state.instance
        return snapshot(state.config.node.name, state.machine, pid=instance.pid if instance is not None else None)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()
