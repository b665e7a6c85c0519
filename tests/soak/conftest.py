"""The soak builds on the integration harness (two daemons in network namespaces, the stand-in ranks) and
reuses the programs the unit and integration tests run (the /dev/shm decoy, the log flood) and, for the opt-in
dockerd restart, the test image's recipe (tests/infra/build_image.py)."""

from __future__ import annotations

import sys
from pathlib import Path

for harness in ("integration", "unit", "infra"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / harness))
