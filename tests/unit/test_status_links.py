"""`sparkctl status` names the runbook section of the last failure (on the node's own port when the status says
where it is) and shows a failing webhook, its URL masked; `sparkd explain` names the section too."""

from __future__ import annotations

from typing import Any

from sparkd.cli.explain import render as explain_render
from sparkd.commands.status import render
from sparkd.commands.statusdoc import Status
from sparkd.supervisor.failures import Failure, FailureClass


def status(**extra: Any) -> Status:
    base: dict[str, Any] = {
        "version": "1", "node": "spark-1", "role": "single", "runtime": "process", "state": "backoff",
        "since": 1_800_000_000.0, "pid": None, "restarts": 2,
        "last_failure": {"class": "oom", "message": "vLLM ran out of memory.", "at": 1_800_000_000.0,
                         "exit_code": 1, "signal": None, "evidence": None}}
    return Status(**{**base, **extra})  # type: ignore[typeddict-item]


def test_the_last_failure_names_its_runbook_section() -> None:
    assert "  runbook: /runbook#oom on sparkd's HTTP port (:9479 by default)" in render(status()).splitlines()
    shown = render(status(runbook="http://10.0.0.1:9479")).splitlines()
    assert "  runbook: http://10.0.0.1:9479/runbook#oom" in shown
    assert not any("runbook" in line for line in render(status(last_failure=None)).splitlines())


def test_a_failing_webhook_is_shown_masked_and_a_healthy_one_in_one_line() -> None:
    failing = {"name": "slack-1", "shape": "slack", "url": "https://hooks.slack.com/(secret)", "state": "failing",
               "failures": 4, "failing_since": 1_800_000_000.0, "last_error": "HTTP 404", "next_try_in_s": 16.0,
               "queued": 3, "dropped": 0, "sent": 1, "held_back": 0}
    ok = {**failing, "name": "ntfy-2", "state": "ok", "failures": 0, "sent": 5, "held_back": 2}
    lines = render(status(notify={"targets": [failing, ok], "problems": []})).splitlines()
    (line,) = [x for x in lines if x.startswith("  notify")]
    assert line.startswith("  notify slack-1 (https://hooks.slack.com/(secret)) FAILING since ")
    assert line.endswith("4 tries: HTTP 404; next try in 16 s; 3 waiting, 0 dropped")
    lines = render(status(notify={"targets": [ok], "problems": ["notify target json-3: HOOK is not set"]})).splitlines()
    assert [x for x in lines if x.startswith("  notify")] == ["  notify: notify target json-3: HOOK is not set"]
    lines = render(status(notify={"targets": [ok, ok], "problems": []})).splitlines()
    assert "  notify: 2 targets ok, 10 sent, 4 held back by the rate limit" in lines


def test_explain_names_the_section_of_its_class() -> None:
    failure = Failure.of(FailureClass.nccl, "NCCL failed.")
    assert explain_render(failure, as_json=True).endswith('"runbook": "/runbook#nccl"}')
    assert "runbook:  /runbook#nccl on sparkd's HTTP port (http://<node>:9479/runbook#nccl)" in \
        explain_render(failure, as_json=False)
