"""The notifier: events in without waiting, webhooks called beside the loop.

- :meth:`Notifier.post` (and :meth:`on_state`, :meth:`guard`, which make the events first) only appends to each
  target's bounded queue and wakes its drainer: it never awaits, never does I/O and never raises into its caller.
- :meth:`Notifier.run` is one task (the daemon's task group runs it); it drains every target in a task of its own,
  so a slow or dead endpoint holds up nothing but its own queue. A delivery has ``[notify] timeout_s``; one that
  fails is tried again with backoff (:func:`sparkd.notify.limits.retry_delay`) until it goes through, while newer
  events wait behind it, the oldest dropped (and counted) past ``[notify] queue``.
- :meth:`Notifier.status` is what status shows: each target by name and shape, its URL masked, whether it is
  failing, since when, its last error and what it has sent, held back and dropped; ``on_change`` hears each delivery
  and each target that starts or stops failing (the daemon shows it in ``status.json``).
- :meth:`Notifier.take_over`: after a reload, a target that goes on (same name, shape and URL) keeps what it had not
  delivered yet and what it went through.
- A target URL never appears in a log line or an error: every error text passes :func:`_quiet` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio

from sparkd.config.notify import NotifyConfig, NotifyUrlProblem, Severity, masked_url, target_url
from sparkd.host.clock import Clock
from sparkd.host.keepalive import KeepAliveClient
from sparkd.host.logs import Logger
from sparkd.notify.events import Event, EventKind, Snapshot, events, guard_event
from sparkd.notify.limits import HeldBack, RateLimiter, retry_delay
from sparkd.notify.shapes import payload, runbook_link
from sparkd.supervisor.states import SERVING

__all__ = ["HttpTransport", "Notifier", "Transport"]

_OUTAGE = (EventKind.failure, EventKind.breaker_open, EventKind.reboot_needed, EventKind.answers_changed)

# (url, body, headers, timeout_s) → the HTTP status; raises on a connection that fails or times out.
Transport = Callable[[str, bytes, Mapping[str, str], float], Awaitable[int]]


class HttpTransport:
    """POST over sparkd's own HTTP/1.1 client (no httpx in the daemon), one client per scheme."""

    def __init__(self) -> None:
        self._clients: dict[str, KeepAliveClient] = {}

    async def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
        scheme = urlsplit(url).scheme
        client = self._clients.get(scheme)
        if client is None:
            client = KeepAliveClient(ssl_context=ssl.create_default_context() if scheme == "https" else None)
            self._clients[scheme] = client
        with anyio.fail_after(timeout_s):
            response = await client.request("POST", url, content=body, headers=headers, connect_timeout=timeout_s)
        return response.status_code

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()


@dataclass(frozen=True)
class _Target:
    """Where a channel delivers, and how."""

    name: str
    shape: str
    url: str = field(repr=False)
    min_severity: Severity


@dataclass
class _Tally:
    """What a channel has been through."""

    sent: int = 0
    dropped: int = 0
    held_total: int = 0
    failures: int = 0  # consecutive failed tries
    failing_since: float | None = None  # wall
    last_error: str | None = None
    last_sent_at: float | None = None  # wall
    next_try_at: float | None = None  # monotonic


@dataclass
class _Channel:
    """One target: where, how, and what it has been through."""

    target: _Target
    limiter: RateLimiter
    queue: deque[Event] = field(default_factory=deque)
    held: HeldBack = field(default_factory=HeldBack)
    inflight: Event | None = None  # taken from the queue, its token spent, not yet delivered
    wake: anyio.Event = field(default_factory=anyio.Event)
    tally: _Tally = field(default_factory=_Tally)

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def shape(self) -> str:
        return self.target.shape

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def min_severity(self) -> Severity:
        return self.target.min_severity

    @property
    def masked(self) -> str:
        return masked_url(self.url)


class Notifier:
    def __init__(self, cfg: NotifyConfig, node: str, *, clock: Clock, log: Logger, runbook_base: str | None = None,
                 environ: Mapping[str, str] | None = None, transport: Transport | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self.node = node
        self.clock = clock
        self.log = log
        self.runbook_base = runbook_base
        self.transport: Transport = transport or HttpTransport()
        self.on_change = on_change
        self.channels: list[_Channel] = []
        self.problems: list[str] = []  # targets that cannot be used (their URL cannot be read), one sentence each
        self.posted = 0
        self.cause: str | None = None  # the failure class that began the outage now, for the recovery's words
        for index, target in enumerate(cfg.targets):
            name = target.name or f"{target.shape}-{index + 1}"
            try:
                url = target_url(target, index, environ)
            except NotifyUrlProblem as exc:
                self.problems.append(f"notify target {name}: {exc}")
                continue
            self.channels.append(_Channel(_Target(name, target.shape, url, target.min_severity or cfg.min_severity),
                                          RateLimiter(cfg.burst, cfg.per_hour)))
        for problem in self.problems:
            log.warning("notify_target_unusable", problem=problem)

    def same_as(self, other: Notifier) -> bool:
        """``other`` sends the same events to the same targets the same way (a reload that changed nothing here)."""
        return (self.cfg == other.cfg and self.problems == other.problems
                and [ch.target for ch in self.channels] == [ch.target for ch in other.channels])

    def take_over(self, old: Notifier) -> None:
        """What ``old`` (the notifier of the config before a reload) had not delivered yet and what it went through,
        carried to each target that goes on under the same name, shape and URL; its rate limit's tokens too."""
        before = {(ch.name, ch.shape, ch.url): ch for ch in old.channels}
        for ch in self.channels:
            was = before.get((ch.name, ch.shape, ch.url))
            if was is None:
                continue
            ch.queue, ch.held, ch.inflight, ch.tally = was.queue, was.held, was.inflight, was.tally
            while len(ch.queue) > self.cfg.queue:
                ch.queue.popleft()
                ch.tally.dropped += 1
            ch.limiter.tokens, ch.limiter.at = min(was.limiter.tokens, float(self.cfg.burst)), was.limiter.at
        self.posted += old.posted
        self.cause = old.cause

    # ---- in: never waits, never raises
    def post(self, event: Event) -> None:
        try:
            self._post(event)
        except Exception as exc:  # a notifier bug must not reach the loop that called it
            self.log.error("notify_post_failed", error=_quiet(repr(exc), self.channels))

    def on_state(self, before: Snapshot | None, after: Snapshot) -> None:
        """The ``on_state`` subscriber: every event the change means, posted."""
        try:
            found = events(before, after, cause=self.cause)
        except Exception as exc:
            self.log.error("notify_events_failed", error=repr(exc))
            return
        for event in found:
            if self.cause is None and event.kind in _OUTAGE:
                self.cause = event.failure_class
            self.post(event)
        if after.state in SERVING:
            self.cause = None

    def guard(self, action: str, reason: str, *, dry_run: bool = False) -> None:
        """The memory guard's decision (``GuardHooks.on_decision``): posted when someone needs to hear it."""
        try:
            event = guard_event(self.node, action, reason, dry_run=dry_run)
        except Exception as exc:
            self.log.error("notify_events_failed", error=repr(exc))
            return
        if event is not None:
            self.post(event)

    def _post(self, event: Event) -> None:
        if event.at is None:
            event = dataclasses.replace(event, at=self.clock.wall())
        self.posted += 1
        for ch in self.channels:
            if not self._wanted(ch, event):
                continue
            if len(ch.queue) >= self.cfg.queue:
                ch.queue.popleft()
                ch.tally.dropped += 1
            ch.queue.append(event)
            ch.wake.set()

    def _wanted(self, ch: _Channel, event: Event) -> bool:
        if event.kind is EventKind.watching and self.cfg.watching:
            return True
        return event.severity.rank >= ch.min_severity.rank

    # ---- out: the task
    async def run(self) -> None:
        """Drain every target until cancelled (the daemon's task group ends it)."""
        try:
            async with anyio.create_task_group() as tg:
                for ch in self.channels:
                    tg.start_soon(self._drain, ch)
        finally:
            closing = getattr(self.transport, "aclose", None)
            if closing is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await closing()

    async def _drain(self, ch: _Channel) -> None:
        while True:
            event = self._next(ch)
            if event is None:
                wait = self._wait_s(ch)
                if wait is None:
                    ch.wake = anyio.Event()
                    if not ch.queue and not ch.held:
                        await ch.wake.wait()
                else:
                    await self.clock.sleep(wait)
                continue
            await self._deliver(ch, event)

    def _next(self, ch: _Channel) -> Event | None:
        """The event to deliver now, its token spent; None when there is none (or no token for it)."""
        if ch.inflight is not None:
            return ch.inflight if self._due(ch) else None
        now = self.clock.now()
        while ch.queue and not ch.limiter.next_at(now) <= now:
            ch.held.add(ch.queue.popleft())  # no token: it goes into the next summary
            ch.tally.held_total += 1
        if not (ch.held or ch.queue) or not ch.limiter.take(now):
            return None
        ch.inflight = ch.held.summary(self.node, self.cfg.per_hour) if ch.held else ch.queue.popleft()
        if ch.inflight.at is None:
            ch.inflight = dataclasses.replace(ch.inflight, at=self.clock.wall())
        return ch.inflight

    def _due(self, ch: _Channel) -> bool:
        return ch.tally.next_try_at is None or self.clock.now() >= ch.tally.next_try_at

    def _wait_s(self, ch: _Channel) -> float | None:
        """How long nothing can be sent to ``ch``: until its retry, or its next token; None: until woken."""
        now = self.clock.now()
        if ch.inflight is not None and ch.tally.next_try_at is not None:
            return max(0.0, ch.tally.next_try_at - now)
        if ch.held:
            return max(0.0, ch.limiter.next_at(now) - now)
        return None

    async def _deliver(self, ch: _Channel, event: Event) -> None:
        body, headers = payload(ch.shape, event, runbook_link(self.runbook_base, event))
        error: str | None = None
        try:
            code = await self.transport(ch.url, body, headers, self.cfg.timeout_s)
            if not 200 <= code < 300:
                error = f"HTTP {code}"
        except TimeoutError:
            error = f"no answer within {self.cfg.timeout_s:g} s"
        except Exception as exc:  # a refused connection, a TLS error, a bad answer: the target fails, not sparkd
            error = _quiet(_why(exc), [ch])
        if error is None:
            self._delivered(ch, event)
        else:
            self._failed(ch, error)

    def _delivered(self, ch: _Channel, event: Event) -> None:
        if ch.tally.failures:
            self.log.info("notify_target_back", target=ch.name, url=ch.masked, after_tries=ch.tally.failures)
        ch.inflight, ch.tally.next_try_at, ch.tally.failures, ch.tally.failing_since = None, None, 0, None
        ch.tally.sent += 1
        ch.tally.last_sent_at = self.clock.wall()
        self._changed()

    def _failed(self, ch: _Channel, error: str) -> None:
        ch.tally.failures += 1
        ch.tally.last_error = error
        wait = retry_delay(ch.tally.failures, self.cfg.retry_max_s)
        ch.tally.next_try_at = self.clock.now() + wait
        if ch.tally.failing_since is None:
            ch.tally.failing_since = self.clock.wall()
            self.log.warning("notify_target_failing", target=ch.name, url=ch.masked, error=error,
                             retry_in_s=round(wait, 1))
            self._changed()
        else:
            self.log.debug("notify_retry_failed", target=ch.name, error=error, tries=ch.tally.failures,
                           retry_in_s=round(wait, 1))

    def _changed(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change()
        except Exception as exc:  # whoever listens, the drain goes on
            self.log.error("notify_on_change_failed", error=repr(exc))

    # ---- status
    def status(self) -> dict[str, Any]:
        now = self.clock.now()
        targets = []
        for ch in self.channels:
            tally = ch.tally
            state = "failing" if tally.failures else ("ok" if tally.sent else "idle")
            targets.append({
                "name": ch.name, "shape": ch.shape, "url": ch.masked, "state": state,
                "min_severity": ch.min_severity.value, "sent": tally.sent, "queued": len(ch.queue) + (
                    1 if ch.inflight is not None else 0), "held_back": tally.held_total, "dropped": tally.dropped,
                "failures": tally.failures, "failing_since": tally.failing_since, "last_error": tally.last_error,
                "last_sent_at": tally.last_sent_at,
                "next_try_in_s": None if tally.next_try_at is None else round(max(0.0, tally.next_try_at - now), 1),
            })
        return {"targets": targets, "problems": list(self.problems)}


_CLOSED = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead, anyio.ClosedResourceError)


def _why(exc: BaseException) -> str:
    """A failed delivery in words: what the connection did, with the cause anyio wraps."""
    if isinstance(exc, _CLOSED):
        return "the endpoint closed the connection without answering"
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError) and isinstance(cause, OSError) and cause.strerror:
        return f"{cause.strerror} ({type(cause).__name__})"
    return f"{type(exc).__name__}: {exc}"


def _quiet(text: str, channels: list[_Channel]) -> str:
    """``text`` with every target URL (and the path and query of each) replaced by its masked form."""
    for ch in channels:
        for secret in (ch.url, urlsplit(ch.url).path, urlsplit(ch.url).query):
            if secret and len(secret) > 1 and secret in text:
                text = text.replace(secret, ch.masked if secret == ch.url else "(secret)")
    return text
