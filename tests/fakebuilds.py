"""A site-packages with the builds a launch would run (vLLM, torch built for a CUDA, the NCCL wheel), whose
``libnccl.so.2`` is a real shared library answering ``ncclGetVersion``: what the ``builds`` preflight reads
(sparkd.preflight.builds) when a launch's ``PYTHONPATH`` names it. One definition for every test folder
(tests/conftest.py puts this folder on the import path). Needs a C compiler (CI's image has gcc)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["fake_site"]


def fake_site(folder: Path, *, vllm: str = "0.34.0", torch: str = "2.9.1", cuda: str = "12.8",
              nccl: str = "2.28.9") -> Path:
    """``folder/site``, made; its NCCL library reports ``nccl`` (major.minor.patch)."""
    if shutil.which("cc") is None:
        raise AssertionError("a C compiler is needed to build the fake libnccl (CI's image has gcc)")
    site = folder / "site"
    for name, version in (("vllm", vllm), ("torch", torch), ("nvidia_nccl_cu12", nccl)):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text(f"__version__ = '{torch}'\ncuda: Optional[str] = '{cuda}'\n")
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (site / "nvidia" / "nccl" / "__init__.py").write_text("")
    major, minor, patch = (int(part) for part in nccl.split("."))
    source = folder / "nccl.c"
    source.write_text(f"int ncclGetVersion(int *version) {{ *version = {major * 10000 + minor * 100 + patch}; "
                      "return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libnccl.so.2"), str(source)], check=True)
    return site
