"""Install the real vLLM (``VLLM_VERSION``) into a cached virtualenv for ``make test-vllm``; print its path.

The virtualenv lives in ``$SPARKD_VLLM_VENV`` (default ``~/.cache/sparkd/vllm-<version>``) and is made once: a
stamp file records the version it holds, so later runs return at once. The wheel pulls CUDA torch (~9 GB); on a
machine without a GPU only vLLM's command line is used, with its CPU platform forced (tests/vllm/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

VLLM_VERSION = "0.24.0"


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "sparkd" / f"vllm-{VLLM_VERSION}"
    return Path(os.environ.get("SPARKD_VLLM_VENV") or default)


def stamp(venv: Path) -> Path:
    return venv / ".sparkd-vllm-installed"


def ensure(venv: Path) -> Path:
    if stamp(venv).exists() and stamp(venv).read_text().strip() == VLLM_VERSION:
        return venv
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "--quiet", f"vllm=={VLLM_VERSION}"], check=True)
    stamp(venv).write_text(VLLM_VERSION + "\n")
    print(f"installed vllm {VLLM_VERSION} into {venv} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return venv


if __name__ == "__main__":
    print(ensure(venv_dir()))
