"""``make test-vllm``: the real vLLM (tests/vllm/ensure_vllm.py installs it into a cached virtualenv), opt-in.

Collected only with ``SPARKD_TEST_VLLM=1`` (the Makefile target sets it): the default suite never downloads it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent

if os.environ.get("SPARKD_TEST_VLLM", "").strip() not in ("1", "true", "yes"):
    collect_ignore_glob = ["test_*.py"]


def _ensure_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sparkd_tests_ensure_vllm", HERE / "ensure_vllm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The virtualenv holding the real vLLM (installed on first use; minutes, ~9 GB)."""
    ensure = _ensure_module()
    return Path(ensure.ensure(ensure.venv_dir()))
