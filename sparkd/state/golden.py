"""The acceptance gate's golden answers: one state file per model, ``<state_dir>/acceptance/golden-<digest>.json``
(the digest of the launch's model, path or hub id), crash-only as every state file (:mod:`sparkd.state.files`):
written to a temp file and renamed, validated on read, a bad one set aside and treated as absent (the next pass
records a new golden and says so).

A golden holds its model, the identity it was recorded under (image, weights, launch), the request's shape, every
answer (token ids, text, top log-probabilities), the capacity vLLM logged, and when it was recorded
(:class:`sparkd.supervisor.acceptance.answers.Golden`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sparkd.host.logs import Logger
from sparkd.state.files import StateFile, WriteResult
from sparkd.state.schema import Field, Schema
from sparkd.supervisor.acceptance.answers import Golden

__all__ = ["GOLDEN", "GoldenStore", "golden_path"]

GOLDEN = Schema("acceptance golden", {
    "model": Field((str,), True),
    "identity": Field((dict,), True),
    "shape": Field((dict,), True),
    "answers": Field((dict,), True),
    "capacity": Field((dict, type(None))),
    "recorded_at": Field((int, float), True),
})


def golden_path(state_dir: Path, model: str) -> Path:
    digest = hashlib.sha256(model.encode()).hexdigest()[:16]
    return state_dir / "acceptance" / f"golden-{digest}.json"


def _parse(data: dict[str, Any]) -> Golden:
    return Golden.from_json(data)


def _dump(golden: Golden) -> dict[str, Any]:
    return golden.to_json()


class GoldenStore:
    """The golden of each model under one state directory."""

    def __init__(self, state_dir: Path, log: Logger | None = None) -> None:
        self.state_dir, self.log = state_dir, log

    def _file(self, model: str) -> StateFile[Golden]:
        return StateFile(golden_path(self.state_dir, model), GOLDEN, parse=_parse, dump=_dump, log=self.log)

    def read(self, model: str) -> Golden | None:
        """The model's golden; None when there is none yet (or a bad one was set aside)."""
        golden = self._file(model).read()
        return golden if golden is not None and golden.model == model else None

    def write(self, golden: Golden) -> WriteResult:
        """Keep ``golden`` for its model. Never raises (a failed write is a ``WriteResult`` naming the path)."""
        path = golden_path(self.state_dir, golden.model)
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            return WriteResult(False, f"cannot write {path}: {exc.strerror or exc}")
        return self._file(golden.model).write(golden)
