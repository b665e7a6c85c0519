"""``make test-vllm``: the real vLLM (tests/vllm/ensure_vllm.py installs it into a cached virtualenv), opt-in.

Collected only with ``SPARKD_TEST_VLLM=1`` (the Makefile target sets it): the default suite never downloads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest
from modload import load

HERE = Path(__file__).resolve().parent

if os.environ.get("SPARKD_TEST_VLLM", "").strip() not in ("1", "true", "yes"):
    collect_ignore_glob = ["test_*.py"]


def _ensure_module() -> ModuleType:
    return load(HERE / "ensure_vllm.py", "sparkd_tests_ensure_vllm")


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The virtualenv holding the real vLLM (installed on first use; minutes, ~9 GB)."""
    ensure = _ensure_module()
    return Path(ensure.ensure(ensure.venv_dir()))
