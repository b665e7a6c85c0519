"""No planted secret anywhere sparkd shows, keeps or logs (security review §4), against a running `sparkd run`.

Secrets are planted where an operator puts them — `[launch.env]` (VLLM_API_KEY, HF_TOKEN, a `secret_env` name),
`[container.env]`, `api_key_file` — and vLLM (a wrapper around the stand-in) prints them to its output. Then each is
looked for, byte for byte, in status (sparkctl and status.json), the reload reports (a valid change and an invalid
config), render (script and JSON), the launch script, vllm.log, the daemon's own log (the journal under systemd),
every incident file and every file of `sparkctl bundle`. Only vLLM's environment holds them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from daemon_harness import BIN, STANDIN, Fleet, Sparkd, render_toml

SECRETS = {
    "VLLM_API_KEY": "sk-LAUNCHENV-APIKEY-999", "HF_TOKEN": "hf_LAUNCHENVSECRET123", "MY_PAT": "ghp_PATSECRET77",
    "HUGGING_FACE_HUB_TOKEN": "hf_CONTAINERSECRET_old", "NGC_API_KEY": "nvapi-CONTAINER-1",
}
RELOADED = {"HF_TOKEN": "hf_NEWLAUNCHSECRET456", "HUGGING_FACE_HUB_TOKEN": "hf_CONTAINERSECRET_new"}
KEY_FILE = "sk-APIKEYFILE-555"
LEAKED_IN_ERROR = "sk-LEAKED-IN-ERROR"


def wrapper(folder: Path) -> Path:
    """vLLM as an operator might wrap it: it prints its secrets, then runs (the stand-in)."""
    path = folder / "vllm-wrapper"
    path.write_text("#!/bin/bash\necho \"env: HF_TOKEN=$HF_TOKEN pat $MY_PAT key $VLLM_API_KEY\"\n"
                    f"exec {STANDIN} \"$@\"\n")
    path.chmod(0o750)
    return path


def planted(daemon: Sparkd, env: dict[str, str], container_env: dict[str, str]) -> None:
    daemon.config["launch"]["env"].update(env)
    daemon.config.setdefault("container", {})["env"] = container_env
    daemon.config_path.write_text(render_toml(daemon.config))


def everything_shown(daemon: Sparkd, outputs: list[str]) -> dict[str, str]:
    """Every text sparkd shows, keeps or logs, by where it was found."""
    texts = {f"output {i}": text for i, text in enumerate(outputs)}
    texts["status.json"] = (daemon.state_dir / "status.json").read_text()
    texts["launch.sh"] = (daemon.state_dir / "run" / "launch.sh").read_text()
    texts["vllm.log"] = (daemon.state_dir / "logs" / "vllm.log").read_text(errors="replace")
    texts["the daemon's log"] = daemon.log()
    for path in sorted((daemon.state_dir / "incidents").rglob("*")):
        if path.is_file():
            texts[str(path.relative_to(daemon.state_dir))] = path.read_text(errors="replace")
    return texts


def leaks(texts: dict[str, str], secrets: list[str]) -> list[str]:
    return [f"{secret} in {where}" for where, text in texts.items() for secret in secrets if secret in text]


def test_no_planted_secret_reaches_status_reload_render_logs_or_incidents(sparkd: Fleet, tmp_path: Path) -> None:
    key_file = tmp_path / "api.key"
    key_file.write_text(KEY_FILE + "\n")
    key_file.chmod(0o600)
    daemon = sparkd(launch={"executable": str(wrapper(tmp_path)), "api_key_file": str(key_file),
                            "secret_env": ["MY_PAT"]})
    launch_env = {k: SECRETS[k] for k in ("VLLM_API_KEY", "HF_TOKEN", "MY_PAT")}
    planted(daemon, launch_env, {k: SECRETS[k] for k in ("HUGGING_FACE_HUB_TOKEN", "NGC_API_KEY")})
    outputs: list[str] = []

    def ctl(*args: str) -> Any:
        done = daemon.ctl(*args)
        outputs.append(done.stdout + done.stderr)
        return done

    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={SECRETS['HF_TOKEN']}".encode() in environ  # vLLM has them, through its environment
    status = json.loads(ctl("--json", "status").stdout)
    for args in ([], ["--json"]):
        done = subprocess.run([str(BIN / "sparkd"), "render", "--config", str(daemon.config_path), *args],
                              capture_output=True, text=True, timeout=60)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr
    assert json.loads(outputs[-1])["secret_env"] == ["HF_TOKEN", "MY_PAT", "VLLM_API_KEY"]
    assert status["shared"]["env.VLLM_API_KEY"] == "(secret)"
    # A reload that changes the secrets, then one of an invalid config that holds one.
    planted(daemon, {**launch_env, "HF_TOKEN": RELOADED["HF_TOKEN"]},
            {"HUGGING_FACE_HUB_TOKEN": RELOADED["HUGGING_FACE_HUB_TOKEN"], "NGC_API_KEY": SECRETS["NGC_API_KEY"]})
    reloaded = ctl("reload")
    assert reloaded.returncode == 0 and "container.env.HUGGING_FACE_HUB_TOKEN: (secret " in reloaded.stdout, \
        reloaded.stdout
    ctl("--json", "reload")
    bad = dict(daemon.config)
    bad["launch"] = {**daemon.config["launch"], "api_key_file": None, "api_key": [LEAKED_IN_ERROR]}
    bad["launch"] = {k: v for k, v in bad["launch"].items() if v is not None}
    daemon.config_path.write_text(render_toml(bad))
    refused = ctl("reload")
    assert refused.returncode != 0 and "launch.api_key" in refused.stdout + refused.stderr
    ctl("--json", "status")
    # A crash: an incident with vLLM's output and the process's evidence.
    os.kill(int(daemon.status()["pid"]), signal.SIGKILL)
    daemon.wait_for(lambda s: s.get("pid") not in (None, pid) and s.get("state") == "ready", 60, "restarted")
    ctl("incidents")
    planted(daemon, {**launch_env, "HF_TOKEN": RELOADED["HF_TOKEN"]},  # back to a valid config for the bundle
            {"HUGGING_FACE_HUB_TOKEN": RELOADED["HUGGING_FACE_HUB_TOKEN"], "NGC_API_KEY": SECRETS["NGC_API_KEY"]})
    bundle = tmp_path / "bundle.tar.gz"
    made = ctl("bundle", "--config", str(daemon.config_path), "--output", str(bundle))
    assert made.returncode == 0, made.stderr
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member)
            if data is not None:
                outputs.append(data.read().decode(errors="replace"))
    texts = everything_shown(daemon, outputs)
    assert "env: HF_TOKEN=(secret) pat (secret) key (secret)" in texts["vllm.log"]  # vLLM's line, redacted
    assert any("config_reloaded" in t for t in texts.values()) and daemon.incidents()
    assert leaks(texts, [*SECRETS.values(), *RELOADED.values(), KEY_FILE, LEAKED_IN_ERROR]) == []
