"""The stand-in, like vLLM's API server (``args.api_key or envs.VLLM_API_KEY``), takes its API key from the
environment sparkd renders: /v1 is guarded, and the key is in no command line and no output."""

from __future__ import annotations

from pathlib import Path

import psutil
from freeport import free_port
from standin_helpers import Standins, http, standins

from sparkd.config import config_from_mapping
from sparkd.launch.render import render

KEY = "sk-SECRET-rel5"


def config(tmp_path: Path, **launch: object) -> object:
    return config_from_mapping({
        "runtime": "process", "node": {"role": "single"},
        "launch": {"model": "/models/m", "api_key": KEY, **launch},
    }, env={})


def test_vllm_takes_the_key_from_its_environment(tmp_path: Path) -> None:
    """The stand-in (like vLLM's API server: args.api_key or envs.VLLM_API_KEY) guards /v1 with the key it
    found in VLLM_API_KEY; the key is in no process's command line and not in the output."""
    port = free_port()
    spec = render(config(tmp_path, host="127.0.0.1", port=port))  # type: ignore[arg-type]
    group: Standins
    with standins() as group:
        standin = group.start(*spec.argv[2:], env=spec.environment())  # it adds "serve"
        standin.wait_ready()
        client = http("127.0.0.1", port)
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        for proc in standin.tree():
            try:
                assert KEY not in " ".join(proc.cmdline())
            except psutil.NoSuchProcess:
                continue
        assert KEY not in standin.text()


