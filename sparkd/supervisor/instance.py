"""One launched vLLM as the node's state holds it: enough to find it again after sparkd restarts and to prove it
is the same one. A runtime makes it (``sparkd.runtime.base``); the launch and the adoption post it
(``Launched``, ``Adopted``) and the loop folds it into the node's state. Pure data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

DRAIN_KEY = "drain_s"  # in ``extra``: the --shutdown-timeout vLLM was launched with


@dataclass(frozen=True)
class Instance:
    """One launched vLLM: enough to find it again after sparkd restarts and to prove it is the same one."""

    runtime: str
    pid: int  # host PID of the launch's main process
    create_time: float  # psutil create_time of that PID: a reused PID has another
    config_hash: str
    container_id: str | None = None
    exec_id: str | None = None
    log_path: str | None = None  # where the runtime's log source reads from
    extra: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] | None = None  # proctree.ProcessIdentity at launch: the proof it is still ours

    @property
    def drain_s(self) -> int | None:
        """The drain vLLM was launched with (``--shutdown-timeout``; 0: none); None: not known (a record written before
        sparkd kept it). A stop's grace comes from it, not from the config now."""
        value = self.extra.get(DRAIN_KEY)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    def with_drain(self, drain_s: int) -> Instance:
        return replace(self, extra={**self.extra, DRAIN_KEY: drain_s})

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Instance:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
