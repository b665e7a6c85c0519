"""Secrets stay secret (reliability.md 5d): the API key reaches vLLM through its environment only, and the
redactor masks the key and the peer token in every text sparkd logs, keeps or shows."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkd.config import config_from_mapping
from sparkd.launch import render, render_script
from sparkd.redact import MASK, Redactor, redactor_for

KEY = "sk-SECRET-rel5"
TOKEN = "peer-token-0123456789"


def config(tmp_path: Path, **launch: object) -> object:
    token = tmp_path / "peer.token"
    token.write_text(TOKEN + "\n")
    return config_from_mapping({
        "runtime": "process", "node": {"role": "single"},
        "launch": {"model": "/models/m", "api_key": KEY, **launch},
        "api": {"token_file": str(token)},
    }, env={})


def test_the_api_key_is_in_the_launchs_environment_only(tmp_path: Path) -> None:
    spec = render(config(tmp_path))  # type: ignore[arg-type]
    assert KEY not in " ".join(spec.argv) and "--api-key" not in spec.argv
    assert KEY not in render_script(spec) and KEY not in json.dumps(spec.to_json()) and KEY not in repr(spec)
    assert spec.secret_env == {"VLLM_API_KEY": KEY} and spec.environment()["VLLM_API_KEY"] == KEY
    assert "VLLM_API_KEY" not in spec.env


def test_the_script_gets_the_key_from_its_environment_and_refuses_to_run_without_it(tmp_path: Path) -> None:
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\necho \"argv: $*\"; echo \"key: ${VLLM_API_KEY:-none}\"\n")
    program.chmod(0o755)
    spec = render(config(tmp_path, executable=str(program)))  # type: ignore[arg-type]
    script = tmp_path / "launch.sh"
    script.write_text(render_script(spec))
    ran = subprocess.run(["bash", str(script)], env={**os.environ, **spec.environment()}, capture_output=True,
                         text=True, timeout=30)
    assert ran.returncode == 0 and f"key: {KEY}" in ran.stdout and KEY not in ran.stdout.split("key:")[0]
    bare = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    refused = subprocess.run(["bash", str(script)], env=bare, capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "argv:" not in refused.stdout
    assert "VLLM_API_KEY: is not set: sparkd passes it in the environment" in refused.stderr


def test_a_key_set_in_launch_env_is_kept_out_of_the_script_too(tmp_path: Path) -> None:
    spec = render(config(tmp_path, api_key=None, env={"VLLM_API_KEY": "sk-from-env-table", "OTHER": "1"}))  # type: ignore[arg-type]
    assert spec.secret_env == {"VLLM_API_KEY": "sk-from-env-table"} and spec.env["OTHER"] == "1"
    assert "sk-from-env-table" not in render_script(spec)


@pytest.mark.parametrize(("text", "shown"), [
    (f"---- sparkd: launch vllm serve /m --api-key {KEY} --port 8000",
     f"---- sparkd: launch vllm serve /m --api-key {MASK} --port 8000"),
    ("launched argv=['vllm', '--api-key', 'sk-not-told', '--port']",
     f"launched argv=['vllm', '--api-key', '{MASK}', '--port']"),
    ("--api-key=sk-not-told x", f"--api-key={MASK} x"),
    ("INFO [utils.py:253] non-default args: {'model': '/m', 'api_key': ['sk-not-told'], 'port': 8}",
     f"INFO [utils.py:253] non-default args: {{'model': '/m', 'api_key': ['{MASK}'], 'port': 8}}"),
    ('{"Authorization": "Bearer abc-not-told"}', f'{{"Authorization": "Bearer {MASK}"}}'),
    ("VLLM_API_KEY=sk-not-told vllm serve", f"VLLM_API_KEY={MASK} vllm serve"),
    (f"the token {TOKEN} leaked", f"the token {MASK} leaked"),
    (f"key inside a word x{KEY}y", f"key inside a word x{MASK}y"),
    ("INFO 01-01 Loading weights took 1.2 s", "INFO 01-01 Loading weights took 1.2 s"),
    ("a bearer of good news", "a bearer of good news"),
])
def test_redaction(text: str, shown: str) -> None:
    assert Redactor([KEY, TOKEN, None, "", "ab"])(text) == shown


def test_argv_and_records_are_redacted() -> None:
    redact = Redactor([KEY])
    assert redact.argv(["vllm", "serve", "--api-key", "short", "--x", KEY]) == \
        ["vllm", "serve", "--api-key", MASK, "--x", MASK]
    record = {"message": f"failed with --api-key {KEY}", "tail": [KEY, 3], "n": 1}
    assert redact.mapping(record) == {"message": f"failed with --api-key {MASK}", "tail": [MASK, 3], "n": 1}


def test_the_daemons_redactor_knows_the_key_and_the_peer_token(tmp_path: Path) -> None:
    redact = redactor_for(config(tmp_path))  # type: ignore[arg-type]
    assert redact(f"{KEY} and {TOKEN}") == f"{MASK} and {MASK}"
