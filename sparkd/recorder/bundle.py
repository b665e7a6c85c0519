"""``sparkctl bundle``: one ``tar.gz`` an operator can attach to a bug report, with no secret inside.

What goes in (each a file under ``sparkd-bundle/``; ``MANIFEST.txt`` says what each is, and what could not be
had and why): the config as loaded, secrets masked (``config.json``) and the file as written, masked
(``sparkd.toml``); the status (``status.json``: from the daemon, else the file it last wrote); the incidents
(``incidents/``, every text file of each folder); the flight recorder's last hour (``recorder.json``); versions
(``versions.json``: sparkd, Python, the kernel, the NVIDIA driver, vLLM from its startup log, NCCL from the image's
environment); ``nvidia-smi -q`` where the tool exists; the kernel log's tail; the unit's journal tail; vLLM's log
tail. Every text passes through one redactor first: the known secrets (the API key, the peer token, any
environment value whose name says token, key, secret or password) and secret-shaped values (``--api-key X``,
``Bearer X``). Commands run with a timeout; none is required.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkd import __version__
from sparkd.config import Config
from sparkd.config.notify import masked_url
from sparkd.config.secretrule import is_secret_name
from sparkd.launch.redact import MASK, Redactor, read_secret
from sparkd.launch.render import secret_values

__all__ = ["Bundle", "bundle_redactor", "collect", "write_bundle"]

ROOT = "sparkd-bundle"
TAIL_LINES = 500
COMMAND_TIMEOUT_S = 30.0
MAX_FILE = 4 << 20
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def bundle_redactor(cfg: Config) -> Redactor:
    """The daemon's secrets (sparkd.config.secretrule: the API key, api_key_file's too, secret_env), and every
    environment value of the launch or the container whose name says secret (a wider net than the rule: a bug
    report travels)."""
    envs = {**cfg.container.env, **cfg.launch.env}
    named = [value for name, value in envs.items() if _secret_name(name, cfg)]
    return Redactor([*secret_values(cfg), read_secret(cfg.api.token_file), *named], names=cfg.launch.secret_env)


def _secret_name(name: str, cfg: Config) -> bool:
    return bool(_SECRET_NAME.search(name)) or is_secret_name(name, cfg.launch.secret_env)


def _masked_config(cfg: Config, redact: Redactor) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    for section in ("launch", "container"):
        env = data.get(section, {}).get("env") or {}
        for name in env:
            if _secret_name(name, cfg):
                env[name] = MASK
    if data["launch"].get("api_key"):
        data["launch"]["api_key"] = MASK
    for target in data.get("notify", {}).get("targets") or []:
        if target.get("url"):
            target["url"] = masked_url(target["url"])
    masked: dict[str, Any] = redact.mapping(data)
    return masked


@dataclass
class Bundle:
    files: dict[str, bytes] = field(default_factory=dict)
    manifest: list[str] = field(default_factory=list)

    def add(self, name: str, text: str, what: str) -> None:
        data = text.encode("utf-8", "replace")
        if len(data) > MAX_FILE:
            data = data[-MAX_FILE:]
            what += f" (its last {MAX_FILE >> 20} MiB)"
        self.files[name] = data
        self.manifest.append(f"{name}: {what}")

    def missing(self, name: str, why: str) -> None:
        self.manifest.append(f"{name}: not included: {why}")


def _run(argv: list[str]) -> tuple[str | None, str]:
    """A command's output, or None and why not."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} is not installed"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`{' '.join(argv)}` failed: {exc}"
    if done.returncode != 0 and not done.stdout.strip():
        return None, f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[:200]}"
    return done.stdout, "ok"


def _tail(path: Path, lines: int = TAIL_LINES) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - MAX_FILE))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return "\n".join(data.splitlines()[-lines:]) + "\n"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _versions(cfg: Config, vllm_log: str | None) -> dict[str, Any]:
    driver = _read(Path("/proc/driver/nvidia/version")) or _read(Path("/sys/module/nvidia/version"))
    # "vLLM API server version 0.13.0", or the logo of later releases: "█ version 0.21.0"
    found = re.search(r"\bversion (\d+\.\d+\.\d+\S*)", vllm_log or "")
    nccl = None
    if cfg.runtime.in_container and cfg.container.image:
        out, _ = _run(["docker", "image", "inspect", "--format", "{{json .Config.Env}}", cfg.container.image])
        match = re.search(r"NCCL_VERSION=([^\"]+)", out or "")
        nccl = match.group(1) if match else None
    return {"sparkd": __version__, "python": platform.python_version(), "kernel": platform.release(),
            "nvidia_driver": driver.strip().splitlines()[0] if driver else None,
            "vllm": found.group(1) if found else None, "nccl": nccl,
            "image": cfg.container.image if cfg.runtime.in_container else None}


def _incidents(bundle: Bundle, root: Path, redact: Redactor) -> None:
    if not root.is_dir():
        bundle.missing("incidents/", f"{root} does not exist (no failure so far)")
        return
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())[-20:]:
        for item in sorted(folder.iterdir()):
            if item.is_file() and not item.is_symlink():
                text = _read(item)
                if text is not None:
                    bundle.add(f"incidents/{folder.name}/{item.name}", redact(text), "an incident's evidence")


def collect(cfg: Config, *, status: dict[str, Any] | None, recorder: dict[str, Any] | None,
            config_text: str | None, run: Callable[[list[str]], tuple[str | None, str]] = _run) -> Bundle:
    """Everything the bundle holds, redacted (``status`` and ``recorder``: what the daemon answered, or None)."""
    redact = bundle_redactor(cfg)
    b = Bundle()
    b.add("config.json", json.dumps(_masked_config(cfg, redact), indent=2), "the config as loaded, secrets masked")
    if config_text is not None:
        b.add("sparkd.toml", redact(config_text), "the config file as written, secrets masked")
    if status is None:
        status = json.loads(_read(cfg.paths.state_dir / "status.json") or "null")
        where = "the status sparkd last wrote (it does not answer)"
    else:
        where = "sparkd's status"
    if status is not None:
        b.add("status.json", json.dumps(redact.mapping(status), indent=2), where)
    else:
        b.missing("status.json", "sparkd does not answer and has written no status")
    _incidents(b, cfg.paths.incidents, redact)
    if recorder is not None:
        b.add("recorder.json", json.dumps(redact.mapping(recorder), indent=1), "the flight recorder's last hour")
    else:
        b.missing("recorder.json", "the flight recorder's ring could not be read")
    vllm_log = _tail(cfg.paths.logs / "vllm.log")
    if vllm_log is not None:
        b.add("vllm.log", redact(vllm_log), f"the last {TAIL_LINES} lines of vLLM's output")
    else:
        b.missing("vllm.log", f"{cfg.paths.logs / 'vllm.log'} cannot be read")
    b.add("versions.json", json.dumps(_versions(cfg, vllm_log), indent=2), "versions")
    for name, argv, what in (
        ("nvidia-smi.txt", ["nvidia-smi", "-q"], "nvidia-smi -q"),
        ("kernel.log", ["dmesg", "--ctime"], f"the kernel log's last {TAIL_LINES} lines"),
        ("journal.log", ["journalctl", "-u", "sparkd", "-n", str(TAIL_LINES), "--no-pager"],
         f"the unit's journal, its last {TAIL_LINES} lines"),
    ):
        out, why = run(argv)
        if out is None:
            b.missing(name, why)
        else:
            b.add(name, redact("\n".join(out.splitlines()[-TAIL_LINES:]) + "\n"), what)
    return b


def write_bundle(bundle: Bundle, path: Path) -> int:
    """Write the tar.gz (mode 0600, never through a link, never over a file); its size."""
    made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest = "\n".join([f"sparkd {__version__} bug-report bundle, made {made}", "", *bundle.manifest]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in [("MANIFEST.txt", manifest.encode()), *bundle.files.items()]:
            info = tarfile.TarInfo(f"{ROOT}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    return path.stat().st_size
