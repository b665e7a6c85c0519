"""Typed config: shipped files load, environment overrides, and every error names its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.config import ConfigError, Role, RuntimeKind, config_from_mapping, load_config
from sparkd.config.profiles import load_profile, profile_names

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "config/sparkd.toml", *sorted((REPO / "config/examples").glob("*.toml"))]
MINIMAL = {"runtime": "process", "launch": {"model": "/models/m"}}


def sparkd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def problems(data: dict, **kw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, env={}, **kw)
    return info.value.problems


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_pass_check_config(path: Path) -> None:
    result = sparkd("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


@pytest.mark.parametrize("profile", profile_names())
def test_every_profile_applies_to_the_head_example(profile: str) -> None:
    result = sparkd("check-config", "--config", str(REPO / "config/examples/head.toml"), "--profile", profile)
    assert result.returncode == 0, result.stderr
    cfg = load_config(REPO / "config/examples/head.toml", env={}, profile=profile)
    for key, value in load_profile(profile).items():
        if key != "env" and key not in ("gpu_memory_utilization",):
            assert getattr(cfg.launch, key) == value, key


def test_shipped_profiles_carry_the_field_numbers() -> None:
    assert set(profile_names()) == {"latency", "throughput", "balanced", "1m-context"}
    assert load_profile("latency")["max_model_len"] == 200000
    assert load_profile("throughput")["max_num_seqs"] == 16
    assert load_profile("balanced")["max_model_len"] == 131072
    assert load_profile("1m-context")["max_model_len"] == 1048576


def test_config_values_win_over_the_profile() -> None:
    cfg = config_from_mapping(
        {**MINIMAL, "launch": {"model": "m", "profile": "throughput", "max_num_seqs": 3, "env": {"A": "1"}}}, env={}
    )
    assert cfg.launch.max_num_seqs == 3
    assert cfg.launch.max_model_len == 65536
    assert cfg.launch.env == {"A": "1"}
    one_m = config_from_mapping(
        {**MINIMAL, "launch": {"model": "m", "profile": "1m-context", "env": {"A": "1"}}}, env={}
    )
    assert one_m.launch.env == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "A": "1"}


def test_unknown_profile_names_the_known_ones() -> None:
    (problem,) = problems({**MINIMAL, "launch": {"model": "m", "profile": "fastest"}})
    assert problem.startswith("launch.profile: unknown profile 'fastest'") and "balanced" in problem


def test_environment_overrides_the_file() -> None:
    env = {
        "SPARKD_LAUNCH__PORT": "8123",
        "SPARKD_NODE__ROLE": "head",
        "SPARKD_RUNTIME": "process",
        "SPARKD_LAUNCH__COMPILATION_CONFIG": '{"cudagraph_mode": "PIECEWISE"}',
        "UNRELATED": "x",
    }
    cfg = config_from_mapping(
        {"runtime": "docker-exec", "container": {"image": "i"}, "launch": {"model": "m", "port": 9000}}, env=env
    )
    assert cfg.launch.port == 8123
    assert cfg.node.role is Role.head
    assert cfg.runtime is RuntimeKind.process
    assert cfg.launch.compilation_config == {"cudagraph_mode": "PIECEWISE"}
    assert cfg.container.image == "i"  # untouched keys survive the merge


def test_environment_override_reaches_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "m"\n')
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "render", "--json", "--config", str(path)],
        capture_output=True,
        text=True,
        env={"SPARKD_LAUNCH__PORT": "8123", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert '"8123"' in result.stdout


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"runtime": "process", "launch": {"model": "m", "max_num_seqs": 0}},
            "launch.max_num_seqs: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            {"runtime": "process", "launch": {"model": "m", "max_num_seq": 4}},
            "launch.max_num_seq: unknown key (did you mean 'max_num_seqs'?)",
        ),
        ({"runtime": "process", "launch": {}}, "launch.model: required"),
        (
            {"runtime": "process", "launch": {"model": "m", "gpu_memory_utilization": 1.5}},
            "launch.gpu_memory_utilization: Input should be less than or equal to 1",
        ),
        ({"runtime": "process", "launch": {"model": "m", "port": "http"}}, "launch.port:"),
        ({"runtime": "docker-exec", "launch": {"model": "m"}}, "container.image: required"),
        ({"runtime": "kubernetes", "launch": {"model": "m"}}, "runtime: Input should be"),
        ({"runtime": "process", "launch": {"model": "m", "env": {"BAD-NAME": "1"}}}, "launch.env:"),
        ({"runtime": "process", "container": {"shm_size": "lots"}, "launch": {"model": "m"}}, "container.shm_size:"),
    ],
)
def test_errors_name_the_key(data: dict, expected: str) -> None:
    assert any(p.startswith(expected) for p in problems(data)), problems(data)


def test_json_flag_as_a_string_is_refused_with_the_reason() -> None:
    (problem,) = problems({**MINIMAL, "launch": {"model": "m", "compilation_config": '{"a": 1}'}})
    assert problem.startswith("launch.compilation_config: write this JSON flag as a TOML table")


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[launch]\nmodel = "m"\nport = = 8000\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "line 3" in info.value.problems[0]
    result = sparkd("check-config", "--config", str(path))
    assert result.returncode == 2
    assert "line 3" in result.stderr and "Traceback" not in result.stderr


def test_check_config_exit_2_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "m"\nmax_num_seqs = -1\n')
    result = sparkd("check-config", "--config", str(path))
    assert result.returncode == 2
    assert "launch.max_num_seqs:" in result.stderr and "Traceback" not in result.stderr


def test_missing_file_is_a_clean_error(tmp_path: Path) -> None:
    result = sparkd("check-config", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert "file not found" in result.stderr and "Traceback" not in result.stderr


def test_derived_multinode_facts_follow_node_and_cluster() -> None:
    cfg = config_from_mapping(
        {
            "runtime": "process",
            "node": {"role": "worker", "rank": 1},
            "cluster": {"master_addr": "10.0.0.1"},
            "launch": {"model": "m"},
        },
        env={},
    )
    assert (cfg.nnodes, cfg.node_rank, cfg.headless, cfg.master_addr, cfg.master_port) == (
        2,
        1,
        True,
        "10.0.0.1",
        29501,
    )
    other = config_from_mapping({**MINIMAL, "launch": {"model": "m", "port": 9}}, env={})
    assert other.launch_hash() != config_from_mapping(MINIMAL, env={}).launch_hash()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_no_shipped_config_opens_the_tcp_port_on_every_network(path: Path) -> None:
    """Security review §2: the packaged config listened on 0.0.0.0; the port belongs on the fabric address."""
    cfg = load_config(path, env={})
    assert cfg.listen not in ("0.0.0.0", "::"), f"{path.name}: [api] listen {cfg.listen}"
    if cfg.cluster.peers:
        assert cfg.listen == cfg.node.address
