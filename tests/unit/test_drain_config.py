"""``[stop] drain_s`` (issue 36): rendered as vLLM's ``--shutdown-timeout`` (exact, argv and script alike), every
grace that must outlast it derived from it in one place (sparkd.supervisor.graces), and the lint that refuses what
would contradict or cut it: a user's own flag, a script that disagrees, a container or unit stop timeout too short."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from sparkd.config import ConfigError, config_from_mapping
from sparkd.host.unit import timespan_s, unit_stop
from sparkd.launch.lint import Level, lint
from sparkd.launch.render import render, render_script
from sparkd.launch.stoplint import UnitStop, unit_rules
from sparkd.supervisor.graces import (
    StopKind,
    container_stop_timeout_s,
    drained_grace_s,
    launched_drain_s,
    plan_stop,
    stop_wait_s,
    unit_stop_timeout_s,
)


def cfg(**tables: Any) -> Any:
    data: dict[str, Any] = {"runtime": "process", "launch": {"model": "m"}}
    for name, table in tables.items():
        data[name] = {**data.get(name, {}), **table} if isinstance(table, dict) else table
    return config_from_mapping(data, env={})


def found(config: Any, level: Level = Level.error) -> set[tuple[str, str]]:
    return {(f.rule, f.key) for f in lint(config) if f.level is level}


# ---- the config and the flag


def test_the_default_drains_120_s_and_the_flag_is_rendered_exactly_in_argv_and_script() -> None:
    config = cfg()
    assert config.stop.drain_s == 120
    spec = render(config)
    at = spec.argv.index("--shutdown-timeout")
    assert spec.argv[at + 1] == "120" and spec.drain_s == 120
    script_words = shlex.split(render_script(spec).split("exec ", 1)[1].replace("\\\n", " "))
    assert script_words == list(spec.argv), "the script execs the argv word for word"


def test_zero_renders_nothing_so_a_vllm_without_the_flag_still_launches() -> None:
    spec = render(cfg(stop={"drain_s": 0}))
    assert not any(word.startswith("--shutdown-timeout") for word in spec.argv) and spec.drain_s == 0


@pytest.mark.parametrize("value", [-1, 1.5, "2 min", 86401])
def test_a_bad_drain_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        cfg(stop={"drain_s": value})
    assert any(p.startswith("stop.drain_s:") for p in err.value.problems), err.value.problems


def test_the_drain_is_part_of_the_launch_hash() -> None:
    assert cfg().launch_hash() != cfg(stop={"drain_s": 30}).launch_hash(), "vLLM reads it when it starts"


def test_the_drain_comes_from_the_environment_too() -> None:
    config = config_from_mapping({"launch": {"model": "m"}, "runtime": "process"}, env={"SPARKD_STOP__DRAIN_S": "45"})
    assert config.stop.drain_s == 45 and "45" in render(config).argv


# ---- the graces, derived in one place


def test_every_grace_that_must_outlast_the_drain_is_derived_from_it() -> None:
    config = cfg(stop={"drain_s": 100}, supervisor={"stop_grace_s": 20, "gpu_release_timeout_s": 10})
    assert drained_grace_s(config) == 120.0
    assert container_stop_timeout_s(config) == 120
    assert unit_stop_timeout_s(config) == 120.0 + 10 + 30
    assert stop_wait_s(config) == 150.0
    assert drained_grace_s(config, 5) == 25.0, "the launch's own drain, not the config's"
    assert container_stop_timeout_s(cfg(runtime="docker-run", container={"image": "i", "stop_timeout_s": 999})) == 999


@pytest.mark.parametrize(("argv", "drain"), [
    (["vllm", "serve", "m", "--shutdown-timeout", "120"], 120),
    (["vllm", "serve", "m", "--shutdown-timeout=30", "--shutdown-timeout", "7"], 7),
    (["vllm", "serve", "m"], 0),
    (["vllm", "serve", "m", "--shutdown-timeout", "${T}"], 0),
    (["vllm", "serve", "m", "--shutdown-timeout"], 0),
])
def test_the_launched_drain_is_read_from_the_argv_as_vllm_reads_it(argv: list[str], drain: int) -> None:
    assert launched_drain_s(argv) == drain


CFG = cfg(supervisor={"stop_grace_s": 90, "hung_stop_grace_s": 5})


@pytest.mark.parametrize(("why", "kind", "grace", "drain", "cut"), [
    ({}, StopKind.drain, 210.0, 120.0, False),
    ({"now": True}, StopKind.now, 90.0, 0.0, True),
    ({"guard_grace_s": 30.0}, StopKind.guard, 30.0, 0.0, True),
    ({"guard_grace_s": 0.0}, StopKind.guard, 0.0, 0.0, True),
    ({"wedged": True}, StopKind.hung, 5.0, 0.0, False),
    ({"wedged": True, "now": True}, StopKind.hung, 5.0, 0.0, False),
    ({"guard_grace_s": 30.0, "wedged": True}, StopKind.guard, 30.0, 0.0, True),
    ({"failed": True}, StopKind.failure, 90.0, 0.0, False),
    ({"serving": False}, StopKind.loading, 90.0, 0.0, False),
    ({"launched_drain": 0}, StopKind.drain, 90.0, 0.0, False),
    ({"launched_drain": 0, "now": True}, StopKind.now, 90.0, 0.0, False),
    ({"launched_drain": 15}, StopKind.drain, 105.0, 15.0, False),
])
def test_the_plan_of_a_stop_follows_why_it_stops(why: dict[str, Any], kind: StopKind, grace: float, drain: float,
                                                 cut: bool) -> None:
    plan = plan_stop(CFG, **{"launched_drain": 120, **why})
    assert (plan.kind, plan.grace_s, plan.drain_s, plan.cut) == (kind, grace, drain, cut), plan
    assert plan.source


# ---- the lint


def test_a_users_own_shutdown_timeout_is_refused() -> None:
    assert ("shutdown-timeout-in-extra-args", "launch.extra_args[1]") in found(
        cfg(launch={"model": "m", "extra_args": ["--dtype", "--shutdown-timeout=5"]}))
    assert ("shutdown-timeout-in-extra-args", "launch.extra_args[0]") in found(
        cfg(launch={"model": "m", "extra_args": ["--shutdown-timeout", "120"]}))
    assert not {r for r, _ in found(cfg())} & {"shutdown-timeout-in-extra-args"}


def script_cfg(tmp_path: Path, serve: str, drain: int = 120, extra: tuple[str, ...] = ()) -> Any:
    script = tmp_path / "serve.sh"
    script.write_text(f"#!/bin/bash\nexec vllm serve /m {serve}\n")
    return cfg(launch={"model": "m", "script": str(script), "extra_args": list(extra)}, stop={"drain_s": drain})


def test_a_script_is_held_to_the_drain(tmp_path: Path) -> None:
    assert ("script-drain-differs", "launch.script") in found(script_cfg(tmp_path, "--shutdown-timeout 30"))
    assert ("script-drain-differs", "launch.script") in found(script_cfg(tmp_path, '--shutdown-timeout 60 "$@"',
                                                                          extra=("--shutdown-timeout", "5")))
    assert ("script-drain-differs", "launch.script") in found(script_cfg(tmp_path, "--shutdown-timeout 30", drain=0))
    assert found(script_cfg(tmp_path, "--shutdown-timeout 120")) == set()
    assert ("script-without-drain", "launch.script") in found(script_cfg(tmp_path, "--port 8000"), Level.warning)
    assert found(script_cfg(tmp_path, "--port 8000", drain=0), Level.warning) == set()
    assert found(script_cfg(tmp_path, '--shutdown-timeout "${DRAIN}"')) == set(), "an expansion is no literal"


def test_a_docker_run_stop_timeout_shorter_than_the_drained_grace_is_refused() -> None:
    short = cfg(runtime="docker-run", container={"image": "i", "stop_timeout_s": 60})
    assert ("container-stop-timeout-short", "container.stop_timeout_s") in found(short)
    message = next(f.message for f in lint(short) if f.rule == "container-stop-timeout-short")
    assert "210" in message and "stop.drain_s 120" in message, message
    assert not found(cfg(runtime="docker-run", container={"image": "i", "stop_timeout_s": 210}))
    assert not found(cfg(runtime="docker-run", container={"image": "i"}))


def test_a_unit_that_would_kill_the_drain_is_refused() -> None:
    config = cfg()  # needs 120 + 90 + 30 + 30 = 270 s
    short = list(unit_rules(config, UnitStop("sparkd.service", 180.0, "from /etc/systemd/system/sparkd.service.d/x")))
    assert [(f.rule, f.level) for f in short] == [("unit-stop-timeout-short", Level.error)]
    assert "270" in short[0].message and "sparkd.service.d/x" in short[0].message
    assert not list(unit_rules(config, UnitStop("sparkd.service", 300.0, "from the unit")))
    assert not list(unit_rules(config, UnitStop("sparkd.service", None, "from the unit"))), "infinity"
    assert not list(unit_rules(config, None))


@pytest.mark.parametrize(("text", "seconds"), [("5min", 300.0), ("1min 30s", 90.0), ("1h 2min 3.5s", 3723.5),
                                               ("300", 300.0), ("500ms", 0.5), ("infinity", None)])
def test_systemd_time_spans(text: str, seconds: float | None) -> None:
    assert timespan_s(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 fortnights"])
def test_a_bad_time_span_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        timespan_s(text)


def show(exec_start: str, timeout: str = "3min", load: str = "loaded") -> Any:
    text = (f"LoadState={load}\nTimeoutStopUSec={timeout}\nExecStart={{ path=/usr/bin/sparkd ; argv[]={exec_start} "
            "; ignore_errors=no ; start_time=[n/a] }\nFragmentPath=/lib/systemd/system/sparkd.service\n"
            "DropInPaths=/etc/systemd/system/sparkd.service.d/override.conf\n")
    return lambda words: text


def test_the_unit_is_judged_only_where_it_runs_this_config(tmp_path: Path) -> None:
    path = tmp_path / "sparkd.toml"
    unit = unit_stop(path, run=show(f"/usr/bin/sparkd run --config {path}"))
    assert unit == UnitStop("sparkd.service", 180.0, "from /etc/systemd/system/sparkd.service.d/override.conf")
    assert unit_stop(path, run=show("/usr/bin/sparkd run --config /etc/sparkd/other.toml")) is None
    assert unit_stop(path, run=show(f"/usr/bin/sparkd run --config {path}", load="not-found")) is None
    assert unit_stop(path, run=lambda words: None) is None, "no systemd here"
    assert unit_stop(Path("/etc/sparkd/sparkd.toml"), run=show("/usr/bin/sparkd run")) is not None, "the default"
