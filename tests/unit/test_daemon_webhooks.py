"""The webhooks wired into the daemon (issue 40), on the real loop over the fakes with an endpoint of the test's own
(the real HTTP endpoint and a real daemon: tests/integration/test_notify_daemon.py): the daemon says it watches, each
failure, the recovery and the breaker from its own state changes, the guard's decisions through its hooks, shows each
target in its status (and status.json) with the URL masked, builds the notifier again on a reload (only where
targets exist), keeps each start's time at ready and reports the builds its preflight read with its image."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from loop_harness import config, running

from sparkd.config import config_from_mapping
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.views.webhooks import served_base
from sparkd.guard.policy import Action, Decision, Level
from sparkd.runtime.base import ImageIdentity
from sparkd.state.files import write_json
from sparkd.supervisor import vocabulary as v
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio

SECRET = "https://hooks.example.com/services/T000/B000/XXXXSECRETXXXX"


class Endpoint:
    """The webhooks' transport: records each event it was sent, refuses while ``down``."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.down = False

    async def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
        if self.down:
            raise ConnectionRefusedError("refused")
        self.got.append(json.loads(body))
        return 200

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.got]


def published(tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "state" / "status.json").read_text())  # type: ignore[no-any-return]


def notify(**more: Any) -> dict[str, Any]:
    return {"min_severity": "info", "burst": 20, "targets": [{"name": "ops", "url": SECRET}], **more}


async def test_the_daemon_tells_that_it_watches_each_failure_the_recovery_and_the_breaker(tmp_path: Path) -> None:
    endpoint, runtime, clock = Endpoint(), FakeRuntime(), FakeClock()
    async with running(config(tmp_path, notify=notify()), runtime, clock, webhooks=endpoint) as node:
        await node.until(lambda: endpoint.kinds() == ["watching"])
        await node.crash_into("backoff")
        await node.until_state("ready")
        await node.until(lambda: endpoint.kinds()[-1] == "recovered")
        await node.crash_into("backoff")
        await node.crash_into("failed")
        await node.until(lambda: endpoint.kinds()[-1] == "breaker_open")
        status = node.status()
        # a delivery shows in status.json without a change of state: the last (the breaker's) came after the last one
        await node.until(lambda: published(tmp_path)["notify"]["targets"][0]["sent"] == 7)
    assert endpoint.kinds() == ["watching", "failure", "recovered", "failure", "recovered", "failure", "breaker_open"]
    assert endpoint.got[0]["text"].startswith("sparkd started watching vLLM on scripted: vLLM is being started")
    failure = endpoint.got[1]
    assert (failure["class"], failure["severity"], failure["node"]) == ("unknown", "warning", "scripted")
    assert failure["text"] == status["last_failure"]["message"] and failure["runbook"] is None  # no TCP port
    (target,) = status["notify"]["targets"]
    assert (target["name"], target["url"], target["state"], target["sent"]) == (
        "ops", "https://hooks.example.com/(secret)", "ok", 7)
    assert status["runbook"] is None and SECRET not in json.dumps(status)


async def test_the_guards_decisions_reach_the_webhook_through_its_hooks(tmp_path: Path) -> None:
    endpoint, runtime, clock = Endpoint(), FakeRuntime(), FakeClock()
    async with running(config(tmp_path, notify=notify()), runtime, clock, webhooks=endpoint) as node:
        await node.until_state("ready")
        hooks = node.daemon.guard_hooks
        hooks.on_decision(Decision(Action.ok, Level.ok, True, "MemAvailable 90 GiB", 0, 0.0))  # nobody needs it
        hooks.on_decision(Decision(Action.stop, Level.stop, False, "MemAvailable 1.2 GiB is under 1.5 GiB", 0, 0.0))
        await node.until(lambda: "guard" in endpoint.kinds())
    guard = [e for e in endpoint.got if e["kind"] == "guard"]
    assert [(e["severity"], e["text"], e["class"]) for e in guard] == [
        ("critical", "MemAvailable 1.2 GiB is under 1.5 GiB", "killed_by_guard")]
    assert guard[0]["title"] == "The memory guard on scripted stopped vLLM"


async def test_a_reload_builds_the_notifier_from_the_new_section_and_only_where_targets_exist(
        tmp_path: Path) -> None:
    endpoint, runtime, clock = Endpoint(), FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock, webhooks=endpoint) as node:
        await node.until_state("ready")
        webhooks = node.daemon.webhooks
        assert webhooks.notifier is None and node.status()["notify"] is None
        await node.daemon.sup.submit(v.ConfigReplaced(config(tmp_path, notify=notify())))
        await node.until(lambda: endpoint.kinds() == ["watching"])  # the first targets hear that sparkd watches
        first = webhooks.notifier
        same = config(tmp_path, notify=notify())
        await node.daemon.sup.submit(v.ConfigReplaced(same))
        assert webhooks.notifier is first and first is not None and first.cfg is same.notify  # nothing to rebuild
        endpoint.down = True
        runtime.crash()
        await node.until(lambda: first.status()["targets"][0]["state"] == "failing")
        await node.daemon.sup.submit(v.ConfigReplaced(config(tmp_path, notify=notify(retry_max_s=5))))
        second = webhooks.notifier
        assert second is not None and second is not first
        assert second.status()["targets"][0]["state"] == "failing"  # the target goes on: its queue and its tries
        endpoint.down = False
        await node.until(lambda: "failure" in endpoint.kinds())
        await node.until_state("ready")
        await node.daemon.sup.submit(v.ConfigReplaced(config(tmp_path)))
        assert webhooks.notifier is None and node.status()["notify"] is None
        runtime.crash()  # nobody to tell: nothing is sent, nothing fails
        await node.until_state("backoff")
    assert endpoint.kinds().count("failure") == 1


async def test_a_start_is_kept_with_its_engine_time_once_ready(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    kept = tmp_path / "state" / "start-times.json"
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until(lambda: runtime.current is not None)
        for line, seconds in (("Starting to load model /models/m...", 40), ("Model loading took 1.0 GiB memory "
                              "and 40.0 seconds", 25), ("Available KV cache memory: 3.00 GiB", 5)):
            runtime.say(line)
            await node.until(lambda: True)
            clock.advance(seconds)
        runtime.serve()
        await node.until_state("ready")
        await node.until(kept.exists)
        hash_running = node.status()["config"].get("hash_running") or node.daemon.sup.node().instance.config_hash
    (start,) = json.loads(kept.read_text())["starts"]
    assert start["seconds"] == pytest.approx(70, abs=1) and start["launch_hash"] == hash_running


def test_the_image_facts_carry_the_builds_the_last_preflight_read_for_that_image(tmp_path: Path) -> None:
    builds = {"vllm": "0.32.0", "torch": "2.9.1", "cuda": "13.0", "nccl": "2.28.9", "nccl_sha256": "a" * 64}
    facts = ContainerFacts(FakeRuntime(), tmp_path)
    assert facts.image_json() is None  # no image, no builds read
    exe = "exe:/usr/bin/vllm 1 2"
    write_json(tmp_path / "builds.json", {"entries": {exe: builds}, "last": exe})
    assert facts.image_json() == {"builds": {**builds, "identity": exe}}  # on the host
    facts.saw_image(ImageIdentity(id="sha256:1"))
    assert facts.image_json() == {"id": "sha256:1", "repo_digests": [], "labels": {}}  # read for another image
    write_json(tmp_path / "builds.json", {"entries": {"sha256:1": {**builds, "nccl": "2.30.4"}}, "last": "sha256:1"})
    assert facts.image_json()["builds"]["nccl"] == "2.30.4"  # type: ignore[index]


@pytest.mark.parametrize(("api", "node", "base"), [
    ({"port": 0}, {}, None),
    ({"port": 9479, "listen": "10.0.0.1"}, {}, "http://10.0.0.1:9479"),
    ({"port": 9479}, {"address": "10.0.0.2"}, "http://10.0.0.2:9479"),
    ({"port": 9480, "listen": "0.0.0.0"}, {"address": "10.0.0.2"}, "http://10.0.0.2:9480"),
    ({"port": 9479, "listen": "fd00::1"}, {}, "http://[fd00::1]:9479"),
    ({"port": 9479, "listen": "::"}, {"name": "n"}, "http://HOST:9479"),
])
def test_the_runbook_base_is_the_tcp_port_as_another_machine_reaches_it(api: dict[str, Any], node: dict[str, Any],
                                                                         base: str | None) -> None:
    import socket

    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "/m"}, "api": api, "node": node}, env={})
    assert served_base(cfg) == (base.replace("HOST", socket.gethostname()) if base else None)
