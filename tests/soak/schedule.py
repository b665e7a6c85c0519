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


# The faults of issue 16, item 6.
FAULTS: tuple[FaultKind, ...] = (
    FaultKind("vllm_sigkill", 4, "SIGKILL of one rank's main vLLM process"),
    FaultKind("rank_sigstop", 2, "SIGSTOP of a whole rank (a hang only the peer's probes can see)"),
    FaultKind("stall", 2, "the head's running engine stalls: no step completes, /health stays 200"),
    FaultKind("hang", 2, "the head's running API server hangs: connections accepted, nothing answered"),
    FaultKind("leak", 1, "the head's running worker leaks real memory until the memory guard stops it"),
    FaultKind("link_cut", 2, "the link between the nodes cut, then restored (sometimes a crash right after)"),
    FaultKind("daemon_sigkill", 3, "SIGKILL of one daemon, then a new one started (adoption)"),
    FaultKind("ctl_storm", 2, "restart/stop/start/reset from several clients at once, on one node or both"),
    FaultKind("broken_config", 2, "a broken config on disk, then reload, SIGHUP or restart; then restored"),
    FaultKind("idle_connections", 1, "hundreds of idle TCP connections to the head's control port"),
    FaultKind("peer_flood", 1, "a third host holds 100 connections to the worker's port past the peer grace"),
    FaultKind("log_flood", 2, "an unthrottled flood of output in the head's raw vLLM log"),
    FaultKind("state_full", 1, "the head's state filesystem filled to the last byte for a while"),
    FaultKind("handshake_flood", 1, "a local user on the worker floods the head's port with connections that never "
                                    "begin their (TLS) handshake"),
    FaultKind("slow_body", 1, "a local user on the worker holds requests to the head whose body never comes"),
)
# Opt-in (SOAK_DOCKERD=1, dockerd.py): a Docker engine of the soak's own restarted under a docker-exec daemon.
DOCKERD = FaultKind("dockerd_restart", 2, "the Docker engine of a docker-exec daemon stopped, then started again")
# How the broken_config fault breaks the file, and how it asks for it to be taken on (reloads.py).
BREAKAGES = ("toml_syntax", "wrong_type", "infinite", "unknown_key", "floors_out_of_order", "deep_nesting")
ASKS = ("reload", "sighup", "restart_here", "restart_other")


@dataclass(frozen=True)
class Step:
    n: int
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


def kinds_from_env(env: dict[str, str] | None = None) -> tuple[FaultKind, ...]:
    """The faults of this run: the default ones, and the dockerd restart when ``SOAK_DOCKERD=1``; only those
    ``SOAK_FAULTS`` names (comma-separated) when it is set."""
    env = dict(os.environ) if env is None else env
    kinds = (*FAULTS, DOCKERD) if env.get("SOAK_DOCKERD") == "1" else FAULTS
    only = {name.strip() for name in env.get("SOAK_FAULTS", "").split(",") if name.strip()}
    unknown = only - {k.name for k in kinds}
    if unknown:
        raise ValueError(f"SOAK_FAULTS names no such fault: {', '.join(sorted(unknown))}")
    return tuple(k for k in kinds if k.name in only) if only else kinds


def seed_from_env(env: dict[str, str] | None = None) -> int:
    """``SOAK_SEED`` when set (to replay a run), else a fresh one."""
    env = dict(os.environ) if env is None else env
    raw = env.get("SOAK_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def first_step_from_env(env: dict[str, str] | None = None) -> int:
    """``SOAK_FROM``: replay a seed's schedule from this step on (its faults and their parameters unchanged)."""
    env = dict(os.environ) if env is None else env
    raw = env.get("SOAK_FROM", "").strip()
    if raw and not raw.isdigit():
        raise ValueError(f"SOAK_FROM must be a step number (0, 1, ...), not {raw!r}")
    return int(raw or 0)


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
    """The first ``count`` steps of the schedule for ``seed``: every kind once, in a seeded order (so that a
    short soak meets each fault), then kinds drawn by weight; no fault twice in a row."""
    rng = random.Random(seed)
    first = rng.sample(faults, len(faults))
    out: list[Step] = []
    for n in range(count):
        if n < len(first):
            kind = first[n]
        else:
            choices = [f for f in faults if f.name != out[-1].kind] or list(faults)
            kind = rng.choices(choices, weights=[f.weight for f in choices])[0]
        out.append(Step(n, kind.name, _params(kind.name, rng)))
    return out


def _params(kind: str, rng: random.Random) -> dict[str, Any]:
    side = rng.choice(["head", "worker"])
    if kind in ("vllm_sigkill", "rank_sigstop", "daemon_sigkill"):
        return {"node": side}
    if kind == "link_cut":  # crash_after: long enough for the head to wait (peer_lost) several times first
        crash_after = rng.random() < 0.4
        down_s = rng.uniform(6, 10) if crash_after else rng.uniform(3, 8)
        return {"down_s": round(down_s, 1), "crash_after": crash_after}
    if kind == "ctl_storm":
        return {"clients": rng.randint(3, 6), "node": rng.choice(["head", "worker", "both"]), "shift": rng.randrange(7)}
    if kind == "broken_config":
        return {"node": side, "breakage": rng.choice(BREAKAGES), "ask": rng.choice(ASKS)}
    if kind == "dockerd_restart":
        return {"down_s": round(rng.uniform(3, 8), 1)}
    if kind == "leak":
        return {"mb_per_s": rng.choice([300, 500])}
    if kind == "idle_connections":
        count = rng.choice([200, 400, 1100])
        return {"count": count, "hold_s": round(rng.uniform(5, 10), 1), "kill_rank": count > 1000}
    if kind == "peer_flood":  # security review §1: it must never cost the pair its peer (peer_lost)
        return {"count": 100, "hold_s": round(rng.uniform(8, 14), 1)}
    if kind == "log_flood":
        return {"seconds": round(rng.uniform(2, 5), 1)}
    if kind == "handshake_flood":  # review 2, #12: no resource before proof
        return {"count": 1000, "hold_s": round(rng.uniform(10, 16), 1), "rate": 200}
    if kind == "slow_body":  # review 2, #10/#11: the whole request has a deadline
        return {"count": 16, "hold_s": round(rng.uniform(10, 16), 1)}
    if kind == "state_full":
        return {"hold_s": round(rng.uniform(4, 8), 1), "kill_rank": rng.random() < 0.5}
    return {}
