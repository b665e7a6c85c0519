"""A secret flag in `[launch] extra_args` is a lint error saying how to pass it instead (security review 2, #19:
`--hf-token` and `--api-key` values were in every user's /proc/PID/cmdline, the journal and status.json)."""

from __future__ import annotations

from sparkd.config import config_from_mapping
from sparkd.launch.lint import Level, lint


def findings(extra_args: list[str]) -> list[str]:
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "/m", "extra_args": extra_args}}, env={})
    return [f.message for f in lint(cfg, read_script=lambda _: None)
            if f.rule == "secret-in-argv" and f.level is Level.error and f.key == "launch.extra_args"]


def test_secret_flags_with_a_value_are_refused_with_the_way_to_pass_them() -> None:
    found = findings(["--hf-token", "hf_X", "--api-key=sk-1", "--wandb-token", "w", "--port", "8000"])
    assert len(found) == 3
    assert found[0].startswith("--hf-token puts a secret on vLLM's command line, which every user of the host can "
                               "read (/proc/PID/cmdline)") and "set HF_TOKEN in [launch.env]" in found[0]
    assert "set [launch] api_key_file" in found[1] and "--api-key puts" in found[1]
    assert "[launch] secret_env" in found[2]


def test_flags_that_only_look_alike_pass() -> None:
    assert findings(["--tokenizer", "/m", "--max-num-batched-tokens", "8192", "--ssl-keyfile", "/k.pem",
                     "--disable-log-requests", "--api-key"]) == []  # a bare flag carries nothing
