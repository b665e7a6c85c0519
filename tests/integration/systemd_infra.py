"""The suite's systemd image and container (tests/infra/systemd_image.py), loaded once by its path: tests/infra
holds the scripts `make` runs, not a package on the tests' import path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "infra" / "systemd_image.py"
NAME = "sparkd_tests_infra_systemd_image"


def systemd_infra() -> Any:
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, SCRIPT)
        assert spec is not None and spec.loader is not None
        sys.modules[NAME] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[NAME])
    return sys.modules[NAME]
