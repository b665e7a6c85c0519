"""The notifier's queue, rate limit, retries and status on the fake clock, with a transport of the test's own (the
real HTTP endpoint is tests/integration/test_notify_webhooks.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from sparkd.config import config_from_mapping
from sparkd.config.notify import NotifyConfig, NotifyTarget, Severity
from sparkd.notify.events import Event, EventKind, Snapshot
from sparkd.notify.sender import Notifier
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock

SECRET = "https://hooks.example.com/services/T000/B000/XXXXSECRETXXXX"


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def text(self) -> str:
        return json.dumps(self.lines, default=str)


class Endpoint:
    """A transport that records what it was sent and fails while ``down``."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.down = False
        self.tries = 0
        self.clock = clock
        self.tried_at: list[float] = []

    async def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
        self.tries += 1
        if self.clock is not None:
            self.tried_at.append(self.clock.now())
        if self.down:
            raise ConnectionRefusedError(f"[Errno 111] Connect call failed to {url}")
        self.got.append((url, json.loads(body)))
        return 200


def cfg(**notify: Any) -> NotifyConfig:
    return NotifyConfig(**{"targets": [NotifyTarget(url=SECRET)], **notify})


def event(n: int, severity: Severity = Severity.warning) -> Event:
    return Event(EventKind.failure, severity, "spark-1", f"failure {n}", f"text {n}", "oom", "oom")


async def drained(clock: FakeClock, notifier: Notifier, done: Any, limit_s: float = 3600) -> float:
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        spent = await clock.run_until(done, limit_s=limit_s)
        tg.cancel_scope.cancel()
    return spent


@pytest.mark.anyio
async def test_events_reach_the_target_in_order_and_below_min_severity_stay_home() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    notifier = Notifier(cfg(), "spark-1", clock=clock, log=Log(), transport=endpoint,
                        runbook_base="http://10.0.0.1:9479/runbook")
    notifier.post(event(1))
    notifier.post(event(2, Severity.info))  # under [notify] min_severity = warning
    notifier.post(event(3, Severity.critical))
    await drained(clock, notifier, lambda: len(endpoint.got) == 2)
    assert [body["title"] for _, body in endpoint.got] == ["failure 1", "failure 3"]
    assert endpoint.got[0][1]["runbook"] == "http://10.0.0.1:9479/runbook#oom"
    (target,) = notifier.status()["targets"]
    assert target["state"] == "ok" and target["sent"] == 2 and target["url"] == "https://hooks.example.com/(secret)"


@pytest.mark.anyio
@pytest.mark.parametrize("watching", [True, False])
async def test_watching_is_sent_whatever_the_min_severity_unless_switched_off(watching: bool) -> None:
    clock, endpoint = FakeClock(), Endpoint()
    notifier = Notifier(cfg(min_severity="critical", watching=watching), "n", clock=clock, log=Log(),
                        transport=endpoint)
    notifier.on_state(None, Snapshot("n", State.ready))
    notifier.post(event(8))
    notifier.post(event(9, Severity.critical))
    await drained(clock, notifier, lambda: any(body["title"] == "failure 9" for _, body in endpoint.got))
    assert [body["kind"] for _, body in endpoint.got] == (["watching", "failure"] if watching else ["failure"])


@pytest.mark.anyio
async def test_a_dead_target_is_retried_with_backoff_shown_failing_and_never_named_in_clear() -> None:
    clock = FakeClock()
    endpoint, log = Endpoint(clock), Log()
    endpoint.down = True
    notifier = Notifier(cfg(retry_max_s=60), "spark-1", clock=clock, log=log, transport=endpoint)
    notifier.post(event(1))
    notifier.post(event(2))
    started = clock.now()
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        await clock.run_until(lambda: endpoint.tries >= 7)
        status = notifier.status()["targets"][0]
        assert status["state"] == "failing" and status["failures"] == 7 and status["queued"] == 2
        assert status["last_error"].startswith("ConnectionRefusedError") and SECRET not in status["last_error"]
        assert status["next_try_in_s"] == 60.0
        endpoint.down = False
        await clock.run_until(lambda: len(endpoint.got) == 2)
        tg.cancel_scope.cancel()
    # 2, 4, 8, 16, 32 s apart, then the cap
    assert [round(t - started) for t in endpoint.tried_at[:7]] == [0, 2, 6, 14, 30, 62, 122]
    assert [body["title"] for _, body in endpoint.got] == ["failure 1", "failure 2"]
    assert notifier.status()["targets"][0]["state"] == "ok"
    events = [name for _, name, _ in log.lines]
    assert events.count("notify_target_failing") == 1 and "notify_target_back" in events
    assert "SECRET" not in log.text() and "T000/B000" not in log.text()


@pytest.mark.anyio
async def test_the_queue_is_bounded_and_drops_the_oldest() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    endpoint.down = True
    notifier = Notifier(cfg(queue=3), "n", clock=clock, log=Log(), transport=endpoint)
    for n in range(10):
        notifier.post(event(n))
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        await clock.run_until(lambda: endpoint.tries >= 1)
        for n in range(10, 13):
            notifier.post(event(n))  # the first (in flight) stays; the queue keeps the newest 3
        endpoint.down = False
        await clock.run_until(lambda: len(endpoint.got) == 4)
        tg.cancel_scope.cancel()
    status = notifier.status()["targets"][0]
    assert status["dropped"] == 9 and [body["title"] for _, body in endpoint.got] == [
        "failure 7", "failure 10", "failure 11", "failure 12"]


@pytest.mark.anyio
async def test_past_the_burst_events_are_held_back_and_sent_as_one_summary() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    notifier = Notifier(cfg(burst=2, per_hour=60), "spark-1", clock=clock, log=Log(), transport=endpoint)
    for n in range(6):
        notifier.post(event(n, Severity.critical if n == 4 else Severity.warning))
    spent = await drained(clock, notifier, lambda: len(endpoint.got) == 3)
    titles = [body["title"] for _, body in endpoint.got]
    assert titles == ["failure 0", "failure 1", "4 notifications from spark-1 held back"]
    summary = endpoint.got[2][1]
    assert summary["kind"] == "held_back" and summary["severity"] == "critical" and summary["held_back"] == {
        "failure oom": 4}
    assert 59 <= spent <= 61  # the next token, a minute later
    assert notifier.status()["targets"][0]["held_back"] == 4


@pytest.mark.anyio
async def test_post_never_raises_into_its_caller() -> None:
    log = Log()
    notifier = Notifier(cfg(), "n", clock=FakeClock(), log=log, transport=Endpoint())
    notifier.channels[0].queue = None  # type: ignore[assignment]  # a bug inside the notifier
    notifier.post(event(1))
    notifier.on_state(Snapshot("n", State.ready), Snapshot("n", State.stopping, Failure.of(FailureClass.oom, "x")))
    assert [name for _, name, _ in log.lines] == ["notify_post_failed", "notify_post_failed"]


def test_a_target_whose_url_cannot_be_read_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    missing, loose = tmp_path / "missing", tmp_path / "loose"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    config = cfg(targets=[NotifyTarget(url_env="SPARKD_TEST_HOOK"), NotifyTarget(url_file=missing),
                          NotifyTarget(url_file=loose), NotifyTarget(shape="ntfy", url_env="OK_HOOK")])
    log = Log()
    notifier = Notifier(config, "n", clock=FakeClock(), log=log, environ={"OK_HOOK": "http://127.0.0.1:1/topic"})
    assert [c.name for c in notifier.channels] == ["ntfy-4"]
    problems = notifier.status()["problems"]
    assert problems[0] == ("notify target json-1: notify.targets[0].url_env: SPARKD_TEST_HOOK is not set in "
                           "sparkd's environment")
    assert "does not exist" in problems[1] and "chmod 600" in problems[2] and SECRET not in json.dumps(problems)


def test_the_config_takes_one_url_source_and_never_echoes_a_bad_url() -> None:
    base = {"launch": {"model": "m"}, "runtime": "process"}
    good = config_from_mapping({**base, "notify": {"targets": [{"shape": "slack", "url_env": "HOOK"}]}}, env={})
    assert good.notify.targets[0].shape == "slack" and good.notify.min_severity is Severity.warning
    for target, said in (({}, "exactly one of url, url_file, url_env (none given)"),
                         ({"url": SECRET, "url_env": "X"}, "(url, url_env given)"),
                         ({"url": "ftp://x/SECRETPATH"}, "must start with http:// or https://"),
                         ({"url": "https://u:SECRETPASS@x/"}, "user:password@ is not supported"),
                         ({"shape": "teams", "url_env": "X"}, "notify.targets.0.shape")):
        with pytest.raises(Exception) as caught:
            config_from_mapping({**base, "notify": {"targets": [target]}}, env={})
        assert said in str(caught.value)
        assert "SECRETPATH" not in str(caught.value) and "SECRETPASS" not in str(caught.value)


def test_the_readmes_notify_example_is_a_valid_config() -> None:
    import re
    import tomllib

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if "[notify]" in b]
    config = config_from_mapping({"runtime": "process", "launch": {"model": "m"}, **tomllib.loads(block)}, env={})
    assert [t.shape for t in config.notify.targets] == ["ntfy", "slack"]


def test_the_daemons_redactor_masks_every_webhook_url(tmp_path: Path) -> None:
    from sparkd.launch.redact import redactor_for

    hook_file = tmp_path / "hook"
    hook_file.write_text("https://ntfy.example/SECRETTOPIC\n")
    hook_file.chmod(0o600)
    config = config_from_mapping({"runtime": "process", "launch": {"model": "m"}, "notify": {"targets": [
        {"url": SECRET}, {"shape": "ntfy", "url_file": str(hook_file)}]}}, env={})
    redact = redactor_for(config)
    line = redact(f"reload: notify.targets: [{SECRET}] → [https://ntfy.example/SECRETTOPIC]")
    assert "SECRET" not in line and line.count("(secret)") == 2


@pytest.mark.anyio
async def test_the_recovery_names_the_failure_that_began_the_outage() -> None:
    """A guard's kill, then the guard's start gate making sparkd wait: the recovery is the kill's."""
    clock, endpoint = FakeClock(), Endpoint()
    notifier = Notifier(cfg(min_severity="info"), "spark-1", clock=clock, log=Log(), transport=endpoint)
    killed = Failure.of(FailureClass.killed_by_guard, "sparkd's memory guard killed vLLM")
    gate = Failure.of(FailureClass.host_unavailable, "The memory guard refuses a start")
    steps = [(State.ready, None, None), (State.stopping, killed, None), (State.backoff, killed, "killed_by_guard"),
             (State.preflight, gate, "killed_by_guard"), (State.backoff, gate, "host_unavailable"),
             (State.starting, gate, "host_unavailable"), (State.ready, gate, "host_unavailable")]
    for (was, failed, why), (now, failing, reason) in itertools.pairwise(steps):
        notifier.on_state(Snapshot("spark-1", was, failed, restart_reason=why),
                          Snapshot("spark-1", now, failing, restart_reason=reason))
    await drained(clock, notifier, lambda: len(endpoint.got) == 3)
    said = [(body["kind"], body["class"]) for _, body in endpoint.got]
    assert said == [("failure", "killed_by_guard"), ("failure", "host_unavailable"), ("recovered", "killed_by_guard")]
    assert notifier.cause is None  # serving again: the next outage names its own
