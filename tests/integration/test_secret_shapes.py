"""Security review 2, #20: secrets sparkd was never told about, in the shapes vLLM and its wrappers print them,
are masked by shape in vllm.log, `sparkctl logs` and an incident (`--hf-token X`, a quoted `export K='…'`, a URL's
password and `GITHUB_PAT=` went through)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from daemon_harness import STANDIN, Fleet

UNTOLD = ("hf_REAL3", "sk-REAL13", "REAL9pw", "ghp_REAL12", "proxyREAL15")


def wrapper(folder: Path) -> Path:
    """vLLM as a wrapper might run it: it echoes its setup, secrets and all, then serves (the stand-in)."""
    path = folder / "vllm-wrapper"
    path.write_text("#!/bin/bash\n"
                    "echo \"+ vllm serve /m --hf-token hf_REAL3 --port 8000\"\n"
                    "echo \"+ export OPENAI_API_KEY='sk-REAL13'\"\n"
                    "echo \"Looking in indexes: https://builder:REAL9pw@pypi.example/simple\"\n"
                    "echo \"env: GITHUB_PAT=ghp_REAL12 PROXY_AUTH=proxyREAL15 PATH=/usr/bin\"\n"
                    f"exec {STANDIN} \"$@\"\n")
    path.chmod(0o750)
    return path


def test_secret_shapes_sparkd_was_not_told_are_masked_wherever_vllms_output_goes(sparkd: Fleet,
                                                                                tmp_path: Path) -> None:
    daemon = sparkd(launch={"executable": str(wrapper(tmp_path))})
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    os.kill(pid, signal.SIGKILL)  # an incident, with vLLM's last lines
    daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("pid") not in (None, pid), 60, "restarted")
    logs = daemon.ctl("logs", "--lines", "200")
    assert logs.returncode == 0, logs.stderr
    texts = {"sparkctl logs": logs.stdout, "vllm.log": (daemon.state_dir / "logs" / "vllm.log").read_text(),
             "the daemon's log": daemon.log()}
    for path in (daemon.state_dir / "incidents").rglob("*"):
        if path.is_file():
            texts[str(path)] = path.read_text(errors="replace")
    assert "--hf-token (secret) --port 8000" in texts["vllm.log"] and "PATH=/usr/bin" in texts["vllm.log"]
    assert "export OPENAI_API_KEY='(secret)'" in texts["sparkctl logs"]
    assert "https://builder:(secret)@pypi.example" in texts["vllm.log"] and daemon.incidents()
    assert [f"{s} in {where}" for where, text in texts.items() for s in UNTOLD if s in text] == []
