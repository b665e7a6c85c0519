"""The soak builds on the integration harness (two daemons in network namespaces, the stand-in ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
