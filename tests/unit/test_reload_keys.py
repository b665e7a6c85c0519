"""A reload leaves no part of the daemon on the old config: every key a reload reports "applied now" is the one in
use afterwards, read by the part that uses it."""

from __future__ import annotations

import collections
import enum
import functools
import json
import types
import typing
import weakref
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from loop_harness import running
from pydantic import BaseModel

from sparkd.commands import reload as reload_command
from sparkd.config import Config, ConfigError, config_from_mapping, load_config
from sparkd.daemon.loop.nodestate import limits_from
from sparkd.launch.diff import _flat, needs_restart
from sparkd.launch.lint import errors, lint
from sparkd.runtime.base import ExecResult
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime

pytestmark = pytest.mark.anyio

HEAD_TOML = """
runtime = "process"
[node]
name = "spark0"
role = "head"
rank = 0
address = "127.0.0.1"
[launch]
executable = "/usr/bin/true"
model = "/models/m"
port = 18999
tensor_parallel_size = 2
[cluster]
master_addr = "127.0.0.1"
nnodes = 2
peers = ["127.0.0.1:1"]
[fabric]
bandwidth = true
bandwidth_s = {seconds}
[paths]
state_dir = "{tmp}/state"
run_dir = "{tmp}/run"
instances_dir = "{tmp}/instances"
[api]
socket_group = ""
port = 18998
token_file = "{tmp}/token"
[guard]
enabled = false
[recorder]
enabled = false
settle_s = 0
reboot_after_falls = 0
[health]
canary = false
"""


class Peers:
    """The head's peer link as the bandwidth run uses it: every request kept, answered by an idle server."""

    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.peers = ["127.0.0.1:1"]

    async def call(self, peer: str, command: Any, request: Any, **kw: Any) -> dict[str, Any]:
        self.asked.append(request)
        return {"exit_code": 0, "gbps": None}


async def test_a_reloaded_fabric_bandwidth_s_is_the_heads_next_bandwidth_run(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkd.cluster import bandwidth as bandwidth_module

    monkeypatch.setattr(bandwidth_module, "CLIENT_DELAY_S", 0.0)
    path = tmp_path / "sparkd.toml"
    path.write_text(HEAD_TOML.format(tmp=tmp_path, seconds=2))
    (tmp_path / "token").write_text("a-token-of-the-group-long-enough-to-sign\n")
    async with running(load_config(path), FakeRuntime(), FakeClock()) as node:
        node.daemon.reloader.path = path
        path.write_text(HEAD_TOML.format(tmp=tmp_path, seconds=7))
        reply = await reload_command.execute(node.daemon.control, reload_command.Request())
        assert reply.ok, reply.error
        assert reply.result["settings"] == ["fabric.bandwidth_s: 2 → 7"]  # reported as applied now
        ran: list[list[str]] = []

        async def run(argv: list[str], timeout_s: float) -> ExecResult:
            ran.append(list(argv))
            return ExecResult(0, "")

        fabric = node.daemon.checks.fabric_check
        assert fabric is not None and fabric.bandwidth is not None
        peers = Peers()
        monkeypatch.setattr(fabric.bandwidth, "client", peers)
        monkeypatch.setattr(fabric.bandwidth, "run", run)
        await fabric.bandwidth.measure("127.0.0.1:1", "127.0.0.2")
    assert [r.seconds for r in peers.asked] == [7]  # the worker's server runs as long as the config says now
    assert ran[0][:3] == ["ib_write_bw", "-D", "7"]  # and so does the head's client


# ---- every key: the new value is the config in force, and no part of the daemon keeps another -------------------

SINGLE: dict[str, Any] = {  # every part that reads the config runs: the guard (floors far below this host's) and
    "runtime": "process",     # the flight recorder too
    "node": {"name": "scripted", "role": "single"},
    "launch": {"executable": "/usr/bin/true", "model": "/models/m", "port": 18999},
    "api": {"socket_group": "", "port": 0},
    "guard": {"enabled": True, "warn_below": "96 MiB", "refuse_start_below": "96 MiB", "stop_below": "64 MiB",
              "kill_below": "32 MiB", "free_below": "32 MiB", "free_gate_below": "32 MiB", "kernel_log": False},
    "recorder": {"enabled": True, "settle_s": 0, "reboot_after_falls": 0},
    "health": {"canary": False},
}
SKIPPED = {  # keys whose other values this single node's config cannot take on its own, and why
    "launch.api_key_file": "names a file the daemon reads as a secret",
    "launch.script": "names a script on the host that must exist",
    "launch.profile": "a profile is applied when the file is read: its keys are the ones compared",
    "api.token_file": "needs a token file",
    "api.tls_ca": "needs a certificate", "api.tls_cert": "needs a certificate", "api.tls_key": "needs a key",
    "launch.headless": "a single node serves", "launch.node_rank": "a single node is rank 0",
    "node.rank": "a single node is rank 0", "node.role": "another role needs its group",
    "recorder.hardware_watchdog": "needs a watchdog device",
    "runtime": "another runtime needs its container",
}
VALUES: dict[str, Any] = {  # a valid other value where the generic candidates find none
    "api.listen": "127.0.0.1",
    "container.devices": ["/dev/null"],
    "container.memory_swap": -1,
    "container.mounts": [{"source": "/tmp", "target": "/data"}],
    "container.security_opt": ["no-new-privileges"],
    "guard.psi_trigger": "some 100000 1000000",
    "launch.compilation_config": {"level": 3},
    "launch.default_chat_template_kwargs": {"enable_thinking": False},
    "launch.override_generation_config": {"temperature": 0.5},
    "launch.speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
    "preflight.asserts": [{"path": "/etc/hostname", "pattern": "x", "count": 1}],
    "preflight.skip": ["host"],
}


def base_mapping(tmp: Path) -> dict[str, Any]:
    paths = {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"), "instances_dir": str(tmp / "instances")}
    return {**SINGLE, "paths": paths}


def set_key(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    *parents, name = key.split(".")
    here = out
    for part in parents:
        here = here.setdefault(part, {})
    here[name] = value
    return out


def value_at(cfg: Config, key: str) -> Any:
    here: Any = cfg.model_dump(mode="json")
    for part in key.split("."):
        here = here.get(part) if isinstance(here, dict) else None
    return here


def candidates(value: Any, annotation: Any) -> list[Any]:
    """Other values a key may take, the likeliest valid first."""
    found: list[Any] = []
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            found += [m.value for m in arg if m.value != value]
        found += [a for a in typing.get_args(arg) if isinstance(a, str) and a != value]  # Literal[...]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [*found, value + 1, value * 2, value - 1, 1, 2, 4096]
    if isinstance(value, float):
        return [*found, value * 2 + 0.5, value + 1.0, value / 2, 1.0, 30.0]
    if isinstance(value, str):
        return [*found, value + "x", "x", "/tmp"]
    if isinstance(value, list):  # a band of two numbers, a list of tables ([acceptance] prompts, [notify] targets)
        return [[], ["x"], [1], [1000, 2000], [1.5, 2.5], [{"name": "p", "prompt": "hi"}],
                [{"url": "http://127.0.0.1:9/hook"}]]
    if isinstance(value, dict):
        return [{}, {"X_TEST": "1"}]
    return [*found, 1, 2.0, "x", True, [], {}, 4096, "/tmp"]


def annotation_of(key: str) -> Any:
    model: Any = Config
    field = None
    for part in key.split("."):
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        field = fields[part]
        model = field.annotation
    return field.annotation if field is not None else None


def reloadable_keys(tmp: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every key of the config and a mapping where only it differs (validated as a reload would validate it)."""
    base = base_mapping(tmp)
    cfg = config_from_mapping(base, source="test")
    out = []
    for key, value in sorted(_flat(cfg.model_dump(mode="json")).items()):
        if key in SKIPPED:
            continue
        for candidate in [VALUES[key]] if key in VALUES else candidates(value, annotation_of(key)):
            data = set_key(base, key, candidate)
            try:
                changed = config_from_mapping(data, source="test")
            except ConfigError:
                continue
            if errors(lint(changed)) or value_at(changed, key) == value:
                continue
            out.append((key, data))
            break
        else:
            out.append((key, {}))  # no other value found: reported below
    return out


def configs_reachable(root: object) -> list[tuple[str, object]]:
    """Every config (or config section) object reachable from ``root`` through sparkd's objects, with its path.
    Caches keyed by a config's identity (``_made``: a weak reference and what was derived) are not followed: they
    recompute before they serve another config (checked apart)."""
    seen: set[int] = set()
    found: list[tuple[str, object]] = []
    stack: list[tuple[str, object]] = [("daemon", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, str | bytes | int | float | bool | Path | enum.Enum | type | None):
            continue
        seen.add(id(obj))
        if isinstance(obj, BaseModel) and type(obj).__module__.startswith("sparkd.config"):
            found.append((path, obj))
            continue
        if isinstance(obj, weakref.ref):
            continue
        # a copy first, taken in one step: a thread of the daemon's (the recorder's writer) may change a collection
        # between two steps of a Python loop over it (a CI run: "deque mutated during iteration")
        if isinstance(obj, dict):
            stack += [(f"{path}[{k!r}]", v) for k, v in tuple(obj.items())]
        elif isinstance(obj, list | tuple | set | frozenset | collections.deque):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(tuple(obj))]
        elif isinstance(obj, types.MethodType):
            stack.append((f"{path}.__self__", obj.__self__))
        elif isinstance(obj, functools.partial):
            stack += [(f"{path}.func", obj.func), (f"{path}.args", obj.args)]
        elif isinstance(obj, types.FunctionType):
            stack += [(f"{path}<closure>", c.cell_contents) for c in obj.__closure__ or () if _filled(c)]
        elif type(obj).__module__.startswith("sparkd"):
            attrs = dict(getattr(obj, "__dict__", {}))
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    attrs[name] = getattr(obj, name)
            stack += [(f"{path}.{k}", v) for k, v in attrs.items() if k != "_made"]
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def sections_of(cfg: Config) -> set[int]:
    ids = {id(cfg)}
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            ids.add(id(value))
    return ids


def identity_caches(root: object) -> list[tuple[Any, Any]]:
    """The parts that derive something from a config and keep it (``_made``), each with how it is read when it
    acts: it must derive afresh from the config in force."""
    d: Any = root
    return [(d.redaction, d.redaction), (d.watching.settings, d.watching.settings),
            (d.metrics.collector, lambda: d.metrics.collector.f)]


async def test_every_reloadable_key_is_in_force_after_a_reload_and_nothing_keeps_the_old_config(
        tmp_path: Path) -> None:
    keys = reloadable_keys(tmp_path)
    unchanged = [key for key, data in keys if not data]
    assert unchanged == [], f"no other valid value found for {unchanged}: add one to candidates()"
    path = tmp_path / "sparkd.toml"
    base = base_mapping(tmp_path)
    path.write_text(tomli_w.dumps(base))
    problems: list[str] = []
    async with running(load_config(path), FakeRuntime(), FakeClock()) as node:
        node.daemon.reloader.path = path
        await node.until_state("ready")
        for key, data in keys:
            old = value_at(node.daemon.cfg, key)
            path.write_text(tomli_w.dumps(data))
            reply = await reload_command.execute(node.daemon.control, reload_command.Request())
            problems += check_reload(node.daemon, key, old, value_at(load_config(path), key), reply)
            path.write_text(tomli_w.dumps(base))
            await reload_command.execute(node.daemon.control, reload_command.Request())
    assert problems == []


def check_reload(daemon: Any, key: str, old: Any, new: Any, reply: Any) -> list[str]:
    if not reply.ok:
        return [f"{key}: the reload was refused: {reply.error}"]
    cfg = daemon.sup.config()
    in_force = value_at(cfg, key)
    fixed = needs_restart(key)
    reported = reply.result["at_daemon_restart" if fixed else "settings"] + reply.result["launch"]
    out = []
    if not any(line.startswith(f"{key}:") for line in reported) and not key.startswith("launch."):
        out.append(f"{key}: not reported as {'kept until sparkd restarts' if fixed else 'applied now'}")
    if in_force != (old if fixed else new):
        out.append(f"{key}: the config in force holds {in_force!r}, not {old if fixed else new!r}")
    current = sections_of(cfg)
    disk = daemon.reloader._disk  # the file as last read from disk: the status compares it, nothing acts on it
    on_disk = sections_of(disk[1]) if disk is not None and isinstance(disk[1], Config) else set()
    for where, found in configs_reachable(daemon):
        if id(found) not in current | on_disk:
            out.append(f"{key}: {where} keeps a config that is not the one in force")
    for cache, read in identity_caches(daemon):
        read()
        if cache._made[0]() is not cfg:
            out.append(f"{key}: {type(cache).__name__} serves what it made from a config not in force")
    if daemon.sup.current.limits != limits_from(cfg):
        out.append(f"{key}: the loop's limits are not the config's")
    return out


# ---- keys a part derives from when it acts: the new value's effect is seen -------------------------------------

class CountingProbes(FakeProbes):
    def __init__(self, runtime: FakeRuntime) -> None:
        super().__init__(runtime)
        self.canaries = 0

    async def canary(self) -> Any:
        self.canaries += 1
        return await super().canary()


async def test_a_canary_turned_on_by_a_reload_runs_for_the_instance_already_watched(tmp_path: Path) -> None:
    path = tmp_path / "sparkd.toml"
    base = base_mapping(tmp_path)
    path.write_text(tomli_w.dumps(set_key(base, "health.canary_interval_s", 10)))
    runtime, probes = FakeRuntime(), None

    def make() -> CountingProbes:
        nonlocal probes
        probes = CountingProbes(runtime)
        return probes

    async with running(load_config(path), runtime, FakeClock(), probes=make) as node:
        node.daemon.reloader.path = path
        await node.until_state("ready")
        await node.until(lambda: node.clock.t > 1100)  # 100 s with the canary off
        assert probes is not None and probes.canaries == 0
        path.write_text(tomli_w.dumps(set_key(set_key(base, "health.canary_interval_s", 10), "health.canary", True)))
        assert (await reload_command.execute(node.daemon.control, reload_command.Request())).ok
        await node.until(lambda: probes.canaries >= 3)
        assert len(runtime.launches) == 1  # the same instance, watched since before the reload


async def test_vllm_log_lines_follow_a_reloaded_probe_requests(tmp_path: Path) -> None:
    ours = 'INFO:     127.0.0.1:58102 - "GET /health?probe=sparkd HTTP/1.1" 200 OK'
    path = tmp_path / "sparkd.toml"
    base = base_mapping(tmp_path)
    path.write_text(tomli_w.dumps(base))
    runtime = FakeRuntime()
    async with running(load_config(path), runtime, FakeClock()) as node:
        node.daemon.reloader.path = path
        await node.until_state("ready")
        runtime.say(ours, "first")
        await node.until(lambda: "first" in node.daemon.vllm_log.tail)
        path.write_text(tomli_w.dumps(set_key(base, "log.probe_requests", True)))
        assert (await reload_command.execute(node.daemon.control, reload_command.Request())).ok
        runtime.say(ours, "second")
        await node.until(lambda: "second" in node.daemon.vllm_log.tail)
        assert [line for line in node.daemon.vllm_log.tail if line in (ours, "first", "second")] == [
            "first", ours, "second"]
