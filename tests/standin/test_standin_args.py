"""The stand-in's argv and knob parsing, and its fixed texts (in-process, no processes started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd_standin import sizing
from sparkd_standin.__main__ import main
from sparkd_standin.args import human_readable_int, parse_serve_args
from sparkd_standin.knobs import KnobError, Knobs, load_knobs


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
    """JSON flags are parsed with json.loads; --flag.key value merges into the same dict; -O3 is level 3."""
    argv = [
        "m",
        "--compilation-config",
        '{"cudagraph_mode": "FULL_DECODE_ONLY", "pass_config": {"enable_fusion": true}}',
        "--compilation-config.max_capture_size",
        "64",
        "--speculative-config",
        '{"method": "mtp", "num_speculative_tokens": 2}',
    ]
    config, _ = parse_serve_args(argv, env={})
    assert config.compilation_config == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "pass_config": {"enable_fusion": True},
        "max_capture_size": 64,
    }
    assert config.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    assert config.non_default["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert parse_serve_args(["m", "-O3"], env={})[0].compilation_config == {"level": 3}


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


def test_unknown_flag_is_argparse_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown flag prints the usage line and 'unrecognized arguments', exit 2."""
    assert main(["serve", "m", "--foo", "--enforce-eager"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "usage: vllm serve [model_tag] [options]",
        "vllm serve: error: unrecognized arguments: --foo",
    ]


def test_invalid_json_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A JSON flag with broken JSON (quotes lost in a shell) is a usage error naming the flag."""
    assert main(["serve", "m", "--compilation-config", "{cudagraph_mode:FULL}"]) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: argument --compilation-config/-O: Value {cudagraph_mode:FULL} cannot be" in err


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Only 'serve' runs; anything else is vllm's top-level usage error."""
    assert main(["srve", "m"]) == 2
    assert "vllm: error: argument subparser: invalid choice: 'srve'" in capsys.readouterr().err


def test_knobs_come_from_env_and_flags_override() -> None:
    """SPARKD_STANDIN_* sets a knob; --standin-* wins over it."""
    env = {"SPARKD_STANDIN_DIE_AFTER": "5", "SPARKD_STANDIN_DIE_MODE": "engine", "SPARKD_STANDIN_SHARDS": "7"}
    _, flags = parse_serve_args(["m", "--standin-die-mode", "worker", "--standin-fail-free-memory"], env={})
    knobs = load_knobs(env, flags)
    assert knobs == Knobs(die_after=5.0, die_mode="worker", shards=7, fail_free_memory=True)
    assert "standin_die_mode" not in parse_serve_args(["m", "--standin-die-mode", "kill"], env={})[0].non_default


def test_bad_knob_value_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    """A knob value that does not parse names the variable."""
    with pytest.raises(KnobError, match="SPARKD_STANDIN_DIE_MODE"):
        load_knobs({"SPARKD_STANDIN_DIE_MODE": "explode"})
    assert main(["serve", "m", "--standin-die-mode", "explode"]) == 2
    assert "--standin-die-mode" in capsys.readouterr().err


def test_free_memory_refusal_text_matches_vllm_013() -> None:
    """The 0.9 refusal is character for character the reference text."""
    assert sizing.free_memory_refusal(0.9) == (
        "Free memory on device (101.3/121.69 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )


def test_unknown_flag_from_the_command_line_exits_2() -> None:
    """The real entry point exits 2 with the argparse message on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "sparkd_standin", "serve", "m", "--bogus-flag", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "vllm serve: error: unrecognized arguments: --bogus-flag 1" in proc.stderr


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
