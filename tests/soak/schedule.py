"""The soak's fault schedule: a seeded random sequence of faults, so that a run can be replayed from its seed.

Pure: the schedule is a function of the seed and the fault table, not of timing. The runner takes faults from
the sequence one after another, each followed by its recovery, until the soak's time is up.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SECONDS = 180


@dataclass(frozen=True)
class FaultKind:
    name: str
    weight: int
    what: str  # one line for the report


# The faults today's daemon can be given (issue 16, item 6). Not yet: dockerd restart (needs the docker-exec
# pair), reload of a broken config (no reload yet), and the stall/hang/leak knobs at run time (the stand-in
# reads them at launch only).
FAULTS: tuple[FaultKind, ...] = (
    FaultKind("vllm_sigkill", 4, "SIGKILL of one rank's main vLLM process"),
    FaultKind("rank_sigstop", 2, "SIGSTOP of a whole rank (a hang only the peer's probes can see)"),
    FaultKind("link_cut", 2, "the link between the nodes cut, then restored"),
    FaultKind("daemon_sigkill", 3, "SIGKILL of one daemon, then a new one started (adoption)"),
    FaultKind("ctl_storm", 2, "restart/stop/start from several clients at once"),
    FaultKind("idle_connections", 1, "hundreds of idle TCP connections to the head's control port"),
    FaultKind("log_flood", 2, "an unthrottled flood of output in the head's raw vLLM log"),
    FaultKind("state_full", 1, "the head's state filesystem filled to the last byte for a while"),
)


@dataclass(frozen=True)
class Step:
    n: int
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


def seed_from_env(env: dict[str, str] | None = None) -> int:
    """``SOAK_SEED`` when set (to replay a run), else a fresh one."""
    env = dict(os.environ) if env is None else env
    raw = env.get("SOAK_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def seconds_from_env(env: dict[str, str] | None = None) -> float:
    env = dict(os.environ) if env is None else env
    raw = env.get("SOAK_SECONDS", "").strip()
    if not raw:
        return float(DEFAULT_SECONDS)
    value = float(raw)
    if not value > 0:
        raise ValueError(f"SOAK_SECONDS must be a positive number of seconds, not {raw!r}")
    return value


def steps(seed: int, count: int, faults: tuple[FaultKind, ...] = FAULTS) -> list[Step]:
    """The first ``count`` steps of the schedule for ``seed``; no fault twice in a row."""
    rng = random.Random(seed)
    out: list[Step] = []
    for n in range(count):
        choices = [f for f in faults if not out or f.name != out[-1].kind] or list(faults)
        kind = rng.choices(choices, weights=[f.weight for f in choices])[0]
        out.append(Step(n, kind.name, _params(kind.name, rng)))
    return out


def _params(kind: str, rng: random.Random) -> dict[str, Any]:
    side = rng.choice(["head", "worker"])
    if kind in ("vllm_sigkill", "rank_sigstop", "daemon_sigkill"):
        return {"node": side}
    if kind == "link_cut":
        return {"down_s": round(rng.uniform(3, 8), 1)}
    if kind == "ctl_storm":
        return {"clients": rng.randint(3, 6), "node": side}
    if kind == "idle_connections":
        count = rng.choice([200, 400, 1100])
        return {"count": count, "hold_s": round(rng.uniform(5, 10), 1), "kill_rank": count > 1000}
    if kind == "log_flood":
        return {"seconds": round(rng.uniform(2, 5), 1)}
    if kind == "state_full":
        return {"hold_s": round(rng.uniform(4, 8), 1), "kill_rank": rng.random() < 0.5}
    return {}
