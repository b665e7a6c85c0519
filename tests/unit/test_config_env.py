"""SPARKD_* environment overrides (case of free keys kept, the variable named in every error) and the bad
inputs that used to end in a traceback (reliability review, scenario 7): each is one clear line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.config import Config, ConfigError, config_from_mapping, load_config
from sparkd.config.env import OverrideError, apply_overrides, parse_overrides, variable_for

REPO = Path(__file__).resolve().parents[2]
BASE = {"runtime": "process", "launch": {"model": "/m", "env": {"NCCL_SOCKET_IFNAME": "bond0"}}}


def problems(data: dict, env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, env=env)
    return info.value.problems


def check_config(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_a_free_key_keeps_its_case_and_replaces_the_files_value() -> None:
    cfg = config_from_mapping(BASE, env={"SPARKD_LAUNCH__ENV__NCCL_SOCKET_IFNAME": "eth0"})
    assert cfg.launch.env == {"NCCL_SOCKET_IFNAME": "eth0"}


def test_section_and_key_names_match_in_any_case() -> None:
    cfg = config_from_mapping(BASE, env={"SPARKD_launch__Port": "8123", "SPARKD_SUPERVISOR__LEAVE_RUNNING": "true",
                                         "SPARKD_CONTAINER__LABELS__Team": "ml"})
    assert (cfg.launch.port, cfg.supervisor.leave_running, cfg.container.labels) == (8123, True, {"Team": "ml"})


def test_tables_merge_key_by_key_and_longer_paths_win() -> None:
    env = {"SPARKD_LAUNCH__ENV": '{"A": "1", "NCCL_SOCKET_IFNAME": "ib0"}', "SPARKD_LAUNCH__ENV__A": "2",
           "SPARKD_LAUNCH__EXTRA_ARGS": '["--foo", "1"]', "SPARKD_LAUNCH__COMPILATION_CONFIG__level": "3",
           "SPARKD_LAUNCH__COMPILATION_CONFIG__cudagraph_mode": "PIECEWISE"}
    cfg = config_from_mapping(BASE, env=env)
    assert cfg.launch.env == {"NCCL_SOCKET_IFNAME": "ib0", "A": "2"}
    assert cfg.launch.extra_args == ["--foo", "1"]
    # Keys of a JSON flag table are free keys too: written as vLLM spells them; values parse as JSON.
    assert cfg.launch.compilation_config == {"level": 3, "cudagraph_mode": "PIECEWISE"}


def test_variables_that_name_no_key_are_not_overrides() -> None:
    cfg = config_from_mapping(BASE, env={"SPARKD_STANDIN_STARTUP_SECONDS": "3", "SPARKD_DEB_PYTHON": "/x",
                                         "OTHER": "1"})
    assert cfg == config_from_mapping(BASE, env={})


def test_the_file_data_is_not_changed_by_applying_overrides() -> None:
    data = {"launch": {"env": {"A": "1"}}}
    merged = apply_overrides(data, parse_overrides({"SPARKD_LAUNCH__ENV__B": "2"}, Config))
    assert data == {"launch": {"env": {"A": "1"}}} and merged["launch"]["env"] == {"A": "1", "B": "2"}


def test_variable_for_picks_the_most_specific_override() -> None:
    overrides = parse_overrides({"SPARKD_LAUNCH": '{"port": 1}', "SPARKD_LAUNCH__PORT": "2"}, Config)
    assert variable_for(("launch", "port"), overrides) == "SPARKD_LAUNCH__PORT"
    assert variable_for(("launch", "model"), overrides) == "SPARKD_LAUNCH"
    assert variable_for(("health", "interval_s"), overrides) is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SPARKD_LAUNCH__PORT": "abc"}, "SPARKD_LAUNCH__PORT (launch.port): Input should be a valid integer"),
        ({"SPARKD_LAUNCH__EXTRA_ARGS": "--foo"}, "SPARKD_LAUNCH__EXTRA_ARGS: launch.extra_args takes JSON"),
        ({"SPARKD_LAUNCH__EXTRA_ARGS": '{"a": 1}'}, "SPARKD_LAUNCH__EXTRA_ARGS: launch.extra_args takes a JSON list"),
        ({"SPARKD_LAUNCH__ENV": "notjson"}, "SPARKD_LAUNCH__ENV: launch.env takes JSON"),
        ({"SPARKD_LAUNCH": "{"}, "SPARKD_LAUNCH: launch takes JSON"),
        ({"SPARKD_LAUNCH": "[1]"}, "SPARKD_LAUNCH: launch takes a JSON object"),
        ({"SPARKD_LAUNCH__PROT": "1"}, "SPARKD_LAUNCH__PROT: launch has no key 'prot' (did you mean 'port'?)"),
        ({"SPARKD_LANCH__PORT": "1"}, "SPARKD_LANCH__PORT: the config has no key 'lanch' (did you mean 'launch'?)"),
        ({"SPARKD_LAUNCH__PORT__X": "1"}, "SPARKD_LAUNCH__PORT__X: launch.port is a single value"),
        ({"SPARKD_LAUNCH__EXTRA_ARGS__0": "x"}, "SPARKD_LAUNCH__EXTRA_ARGS__0: launch.extra_args is a list"),
        ({"SPARKD_LAUNCH____PORT": "1"}, "SPARKD_LAUNCH____PORT: an empty part"),
        ({"SPARKD_LAUNCH__ENV": "[" * 100000}, "SPARKD_LAUNCH__ENV: the JSON is nested too deeply"),
        ({"SPARKD_RESTART__BACKOFF_INITIAL_S": "inf"},
         "SPARKD_RESTART__BACKOFF_INITIAL_S (restart.backoff_initial_s): Input should be a finite number"),
        ({"SPARKD_API__LISTEN": "not-an-ip"}, "SPARKD_API__LISTEN (api.listen): 'not-an-ip' is not an IP address"),
    ],
)
def test_a_bad_override_names_its_variable(env: dict[str, str], expected: str) -> None:
    found = problems(BASE, env)
    assert any(p.startswith(expected) for p in found), found


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(OverrideError) as info:
        parse_overrides({"SPARKD_LAUNCH__EXTRA_ARGS": "--foo", "SPARKD_LAUNCH__ENV": "x"}, Config)
    assert len(info.value.problems) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = " + "[" * 20000 + "]" * 20000, "TOML nested too deeply"),
        ("[launch]\nmodel = '/m'\ncompilation_config = " + "{a = " * 40 + "1" + "}" * 40,
         "launch.compilation_config.a.a."),
        ('runtime = "process"\n[launch]\nmodel = "/m"\nprofile = "latency"\nenv = 5\n', "launch.env: Input should be"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\n[api]\nlisten = "not-an-ip"\n',
         "api.listen: 'not-an-ip' is not an IP address"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\n[restart]\nbackoff_initial_s = inf\n',
         "restart.backoff_initial_s: Input should be a finite number"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\n[health]\ninterval_s = inf\n',
         "health.interval_s: Input should be a finite number"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\n[health]\ntimeout_s = nan\n',
         "health.timeout_s: Input should be a finite number"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\nhost = "999.1.1.1"\n',
         "launch.host: '999.1.1.1' is neither an IP address nor a host name"),
        ('runtime = "process"\n[launch]\nmodel = "/m"\nhost = "-bad-.example"\n', "launch.host:"),
        ("", "the file is empty"),
        ('runtime = "process"\n[lanch]\nmodel = "/m"\n', "lanch: unknown key (did you mean 'launch'?)"),
    ],
    ids=["deep-toml", "deep-table", "profile-env-5", "listen", "backoff-inf", "interval-inf", "timeout-nan",
         "host-999", "host-label", "empty", "typo-section-first"],
)
def test_bad_files_are_one_clear_line_and_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.problems[0].startswith(expected), info.value.problems
    result = check_config(path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SPARKD_LAUNCH__PORT": "abc"}, "SPARKD_LAUNCH__PORT (launch.port):"),
        ({"SPARKD_LAUNCH__EXTRA_ARGS": "--foo"}, "SPARKD_LAUNCH__EXTRA_ARGS:"),
        ({"SPARKD_LAUNCH__ENV": "notjson"}, "SPARKD_LAUNCH__ENV:"),
        ({"SPARKD_LAUNCH": "{"}, "SPARKD_LAUNCH:"),
    ],
)
def test_a_bad_override_through_the_cli_blames_the_variable(tmp_path: Path, env: dict[str, str],
                                                             expected: str) -> None:
    path = tmp_path / "good.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "/m"\n')
    result = check_config(path, env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "invalid config from the environment" in result.stderr and expected in result.stderr, result.stderr
    assert str(path) not in result.stderr


def test_good_hosts_and_listen_addresses_pass() -> None:
    for host in ("0.0.0.0", "127.0.0.1", "::", "spark1", "spark1.lan", "node-2.example.org."):
        assert config_from_mapping({**BASE, "launch": {"model": "/m", "host": host}}, env={}).launch.host == host
    for listen in ("0.0.0.0", "127.0.0.1", "::1", "10.0.0.1"):
        assert config_from_mapping({**BASE, "api": {"listen": listen}}, env={}).api.listen == listen


def test_false_turns_off_a_key_that_is_on_by_default() -> None:
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "/m", "subcommand": False},
                               "container": {"gpus": False}, "preflight": {"overcommit_memory": False},
                               "guard": {"psi_trigger": False, "psi_full_avg10_escalate": False}}, env={})
    assert (cfg.launch.subcommand, cfg.container.gpus, cfg.preflight.overcommit_memory, cfg.guard.psi_trigger,
            cfg.guard.psi_full_avg10_escalate) == (None, None, None, None, None)
    # A key that is off (None) by default keeps false as a value: --no-enable-prefix-caching.
    assert config_from_mapping({"runtime": "process", "launch": {"model": "/m", "enable_prefix_caching": False}},
                               env={}).launch.enable_prefix_caching is False
