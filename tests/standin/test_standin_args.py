"""The stand-in's argv and knob parsing, and its fixed texts (in-process, no processes started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd_standin import procs, sizing
from sparkd_standin.__main__ import main
from sparkd_standin.args import human_readable_int, parse_command, parse_serve_args
from sparkd_standin.dialect import dialect
from sparkd_standin.flags import ACCEPTED
from sparkd_standin.knobs import KnobError, Knobs, load_knobs

UNRECOGNIZED = "vllm: error: unrecognized arguments: "


@pytest.mark.parametrize(
    ("text", "value"),
    [("1000000", 1_000_000), ("200k", 200_000), ("1M", 1 << 20), ("1m", 1_000_000), ("32K", 32768), ("auto", -1)],
)
def test_max_model_len_accepts_human_readable_numbers(text: str, value: int) -> None:
    """--max-model-len takes plain, decimal-suffixed and binary-suffixed numbers like vLLM."""
    config, _ = parse_serve_args(["m", "--max-model-len", text], env={})
    assert config.max_model_len == value
    assert human_readable_int(text) == value


def test_underscore_spellings_and_equals_are_accepted() -> None:
    """--tensor_parallel_size=2 is --tensor-parallel-size 2, as FlexibleArgumentParser rewrites it."""
    config, _ = parse_serve_args(["m", "--tensor_parallel_size=2", "--gpu_memory_utilization", "0.8"], env={})
    assert config.tensor_parallel_size == 2
    assert config.gpu_memory_utilization == 0.8


def test_json_flags_arrive_as_dicts_and_dotted_keys_merge() -> None:
    """JSON flags are parsed with json.loads; dotted keys of one flag merge into one JSON value appended last,
    which overrides an explicit value of the same flag (FlexibleArgumentParser); -O3 is the optimisation level."""
    argv = [
        "m",
        "--compilation-config",
        '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
        "--speculative-config.method",
        "mtp",
        "--speculative_config.num_speculative_tokens=2",
    ]
    config, _ = parse_serve_args(argv, env={})
    assert config.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert config.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    assert config.non_default["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    overridden, _ = parse_serve_args([*argv[:3], "--compilation-config.max_capture_size", "64"], env={})
    assert overridden.compilation_config == {"max_capture_size": 64}
    for spelling in (["-O3"], ["-O", "3"], ["-O=3"]):
        assert parse_serve_args(["m", *spelling], env={})[0].non_default["optimization_level"] == "3"


def test_model_positional_or_flag_and_served_names_default() -> None:
    """The model comes from the positional or --model; the served name defaults to the model."""
    config, _ = parse_serve_args(["--port", "9000", "org/model"], env={})
    assert (config.model, config.served_model_names, config.port) == ("org/model", ("org/model",), 9000)
    config, _ = parse_serve_args(["--model", "/models/x", "--served-model-name", "a", "b"], env={})
    assert (config.model, config.served_model_names) == ("/models/x", ("a", "b"))


def test_headless_rank_flags_and_defaults() -> None:
    """Multi-node flags parse, with vLLM's defaults for the master address and port."""
    config, _ = parse_serve_args(["m", "-tp", "2", "--nnodes", "2", "--node-rank", "1", "--headless"], env={})
    assert (config.world_size, config.local_world_size, config.node_rank, config.headless) == (2, 1, 1, True)
    assert (config.master_addr, config.master_port) == ("127.0.0.1", 29501)


def test_unknown_flag_is_the_top_level_parsers_error(capsys: pytest.CaptureFixture[str]) -> None:
    """As in vLLM, an unknown flag is reported by the `vllm` parser (the subparser passes it up), exit 2."""
    assert main(["serve", "m", "--foo", "--enforce-eager"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm [-h] [-v]")
    assert "{chat,complete,serve,launch,bench,collect-env,run-batch} ..." in err
    assert err.splitlines()[-1] == UNRECOGNIZED + "--foo"


@pytest.mark.parametrize(
    ("version", "flag", "accepted"),
    [
        ("0.13.0", "--disable-log-requests", True),
        ("0.21.0", "--disable-log-requests", False),
        ("0.13.0", "--swap-space", True),
        ("0.24.0", "--swap-space", False),
        ("0.21.0", "--jit-monitor-verbose", False),
        ("0.24.0", "--jit-monitor-verbose", True),
    ],
)
def test_each_release_accepts_its_own_flags(
    capsys: pytest.CaptureFixture[str], version: str, flag: str, accepted: bool
) -> None:
    """Flags a release removed are unrecognized there (the field: `--disable-log-requests` after 0.21)."""
    argv = ["serve", "m", flag, *(["4"] if flag == "--swap-space" else [])]
    if accepted:
        assert parse_command(argv, version[:4], version).subcommand == "serve"
    else:
        with pytest.raises(SystemExit) as exit_:
            parse_command(argv, version[:4], version)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == UNRECOGNIZED + " ".join(argv[2:])
    assert (flag in ACCEPTED[version[:4]]) is accepted


def test_accepted_flags_are_one_table_per_release() -> None:
    """``flags.ACCEPTED`` (what make test-vllm compares with real vLLM) holds each release's option strings."""
    assert set(ACCEPTED) == {"0.13", "0.21", "0.24", "0.32"}
    assert "--calculate-kv-scales" in ACCEPTED["0.24"] and "--calculate-kv-scales" not in ACCEPTED["0.32"]
    for flags in ACCEPTED.values():
        assert {"--tensor-parallel-size", "-tp", "--nnodes", "--headless", "--compilation-config", "-cc"} <= flags
        assert "-O" not in flags  # -O3 is rewritten to --optimization-level before parsing
    assert "-ep" in ACCEPTED["0.21"] and "-ep" not in ACCEPTED["0.13"]


def test_bare_vllm_prints_help_and_other_subcommands_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0 and capsys.readouterr().out.startswith("usage: vllm [-h] [-v]")
    assert main(["chat"]) == 2 and "only `vllm serve` is" in capsys.readouterr().err


def test_invalid_json_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A JSON flag with broken JSON (quotes lost in a shell) is a usage error naming the flag."""
    assert main(["serve", "m", "--compilation-config", "{cudagraph_mode:FULL}"]) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: argument --compilation-config/-cc: Value {cudagraph_mode:FULL} cannot be" in err


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown subcommand is vllm's top-level usage error."""
    assert main(["srve", "m"]) == 2
    assert "vllm: error: argument subparser: invalid choice: 'srve' (choose from 'chat'" in capsys.readouterr().err


def test_knobs_come_from_env_and_flags_override() -> None:
    """SPARKD_STANDIN_* sets a knob; --standin-* wins over it."""
    env = {"SPARKD_STANDIN_DIE_AFTER": "5", "SPARKD_STANDIN_DIE_MODE": "engine", "SPARKD_STANDIN_SHARDS": "7"}
    _, flags = parse_serve_args(["m", "--standin-die-mode", "worker", "--standin-fail-free-memory"], env={})
    knobs = load_knobs(env, flags)
    assert knobs == Knobs(die_after=5.0, die_mode="worker", shards=7, fail_free_memory=True)
    assert "standin_die_mode" not in parse_serve_args(["m", "--standin-die-mode", "kill"], env={})[0].non_default


def test_bad_knob_value_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    """A knob value that does not parse names the variable and what it takes."""
    with pytest.raises(KnobError, match=r"SPARKD_STANDIN_DIE_MODE: 'explode' \(one of exit, engine, kill, worker\)"):
        load_knobs({"SPARKD_STANDIN_DIE_MODE": "explode"})
    with pytest.raises(KnobError,
                       match=r"SPARKD_STANDIN_VLLM_VERSION: '0.17.0' \(a 0.13.x, 0.21.x, 0.24.x, 0.32.x version\)"):
        load_knobs({"SPARKD_STANDIN_VLLM_VERSION": "0.17.0"})
    with pytest.raises(KnobError, match="SPARKD_STANDIN_CRASH"):
        load_knobs({"SPARKD_STANDIN_CRASH": "segfault"})
    assert main(["serve", "m", "--standin-die-mode", "explode"]) == 2
    assert "--standin-die-mode" in capsys.readouterr().err


def test_free_memory_refusal_text_matches_each_release() -> None:
    """The 0.9 refusal is character for character vLLM's (0.21+ names the device)."""
    tail = (
        "(101.3/121.69 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    assert sizing.free_memory_refusal(0.9, dialect("0.13.0")) == "Free memory on device " + tail
    assert sizing.free_memory_refusal(0.9, dialect("0.21.0")) == "Free memory on device cuda:0 " + tail


def test_unknown_flag_from_the_command_line_exits_2() -> None:
    """The real entry point exits 2 with the argparse message on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "sparkd_standin", "serve", "m", "--bogus-flag", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == UNRECOGNIZED + "--bogus-flag 1"


def test_argv_file_records_argv_even_when_rejected(tmp_path: Path) -> None:
    """SPARKD_STANDIN_ARGV_FILE receives json.dumps(sys.argv) first, so a rejected argv is still visible."""
    target = tmp_path / "argv.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sparkd_standin", "serve", "m", "--compilation-config", '{"a": [1, 2]}', "--nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SPARKD_STANDIN_ARGV_FILE": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert json.loads(target.read_text())[1:] == ["serve", "m", "--compilation-config", '{"a": [1, 2]}', "--nope"]


@pytest.mark.parametrize(("method", "unlinked_at_once"), [(None, True), ("fork", True), ("spawn", False)])
def test_executor_lock_follows_the_start_method(
    monkeypatch: pytest.MonkeyPatch, method: str | None, unlinked_at_once: bool
) -> None:
    """vLLM's shared_worker_lock is a fork-context lock by default (its /dev/shm/sem.mp-* is unlinked at once),
    a spawn-context one (the file stays while held) under VLLM_WORKER_MULTIPROC_METHOD=spawn."""
    if method is None:
        monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    else:
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", method)
    assert (procs.lock_context().get_start_method() == "fork") is unlinked_at_once
