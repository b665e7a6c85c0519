"""The guard's pure policy: tables of (state, sample, facts) → decision, and scripted histories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sparkd.config import GuardConfig
from sparkd.guard.meminfo import MemInfo
from sparkd.guard.policy import Action, Decision, GuardState, Level, decide
from sparkd.guard.psi import Pressure
from sparkd.guard.sample import GIB, Sample
from sparkd.guard.trend import TrendVerdict

# Round floors in GiB: kill 2 < stop 4 < warn 8 < start 16; margin 1; MemFree 2 gated at 8.
BASE: dict[str, Any] = dict(
    warn_below=8 * GIB,
    refuse_start_below=16 * GIB,
    stop_below=4 * GIB,
    kill_below=2 * GIB,
    recover_margin=1 * GIB,
    free_below=2 * GIB,
    free_gate_below=8 * GIB,
    psi_full_avg10_escalate=40.0,
    nvrm_escalate_s=10.0,
    cooldown_s=15.0,
    stop_grace_s=30.0,
    debounce_samples=1,
)


def cfg(**overrides: Any) -> GuardConfig:
    return GuardConfig(**{**BASE, **overrides})


def sample(
    avail: float, *, free: float | None = None, psi: float | None = None, nvrm: int = 0, at: float = 100.0
) -> Sample:
    a = int(avail * GIB)
    f = a if free is None else int(free * GIB)
    mem = MemInfo(
        mem_total=128 * GIB,
        mem_free=f,
        mem_available=a,
        cached=max(0, a - f),
        swap_total=0,
        swap_free=0,
        active=GIB,
        inactive=GIB,
        unevictable=0,
        shmem=0,
        slab=GIB,
        page_tables=0,
    )
    pressure = None if psi is None else Pressure(psi, 0, psi, 0)
    return Sample(at, mem, pressure, nvrm)


def trend(*, warn: bool = True, plan: bool = False) -> TrendVerdict:
    return TrendVerdict(
        slope=-GIB / 60,
        fitted=10 * GIB,
        seconds_to_floor=360.0,
        warn=warn,
        plan_restart=plan,
        reason="MemAvailable falls -1024 MiB/min (Theil–Sen), now ~10.0 GiB: the stop floor 4.0 GiB is 6 min away",
    )


def held(level: Level, **changes: Any) -> GuardState:
    """A state that has sat at ``level`` long enough for any debounce."""
    streaks = tuple(100 if level >= lvl else 0 for lvl in (1, 2, 3))
    return GuardState(level=level, streaks=streaks, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Row:
    sample: Sample
    action: Action
    level: Level
    start_allowed: bool
    says: tuple[str, ...] = ()  # substrings of the reason
    state: GuardState = field(default_factory=GuardState)
    running: bool = True
    config: dict[str, Any] = field(default_factory=dict)
    trend: TrendVerdict | None = None
    idle: bool | None = None


NOW = 100.0

ROWS: dict[str, Row] = {
    # -- floors on MemAvailable, vLLM running --
    "far above every floor": Row(sample(40), Action.ok, Level.ok, True, ("40.0 GiB is above every floor",)),
    "under the warn floor warns": Row(
        sample(7), Action.warn, Level.warn, False, ("MemAvailable 7.0 GiB is under the warn floor 8.0 GiB",)
    ),
    "at a floor is not under it": Row(sample(4), Action.warn, Level.warn, False),
    "under the stop floor stops": Row(
        sample(3.9),
        Action.stop,
        Level.stop,
        False,
        ("stop vLLM (SIGTERM, 30 s grace)", "3.9 GiB is under the stop floor 4.0"),
    ),
    "under the kill floor kills": Row(
        sample(1.9), Action.kill, Level.kill, False, ("SIGKILL the vLLM tree", "under the kill floor 2.0 GiB")
    ),
    "between warn and start floors, running: warn only": Row(sample(12), Action.ok, Level.ok, False),
    # -- vLLM not running: the start gate --
    "not running, under the stop floor: refuse": Row(
        sample(3), Action.refuse_start, Level.stop, False, ("no vLLM start",), running=False
    ),
    "not running, under the kill floor: refuse, nothing to kill": Row(
        sample(1), Action.refuse_start, Level.kill, False, running=False
    ),
    "not running, under the start floor: refuse": Row(
        sample(10), Action.refuse_start, Level.ok, False, ("under the start floor 16.0 GiB",), running=False
    ),
    "not running, above the start floor: ok": Row(sample(20), Action.ok, Level.ok, True, running=False),
    # -- MemFree, gated by MemAvailable --
    "MemFree low while MemAvailable low: stop": Row(
        sample(7, free=1.5),
        Action.stop,
        Level.stop,
        False,
        ("MemFree 1.5 GiB is under 2.0 GiB while MemAvailable 7.0 GiB is under 8.0 GiB",),
    ),
    "MemFree low, MemAvailable plenty (page cache): ok": Row(sample(30, free=0.5), Action.ok, Level.ok, True),
    "MemFree low, MemAvailable just at the gate: ok": Row(sample(8, free=0.5), Action.ok, Level.ok, False),
    "MemFree above its floor, MemAvailable low: warn": Row(sample(7, free=3), Action.warn, Level.warn, False),
    # -- PSI escalates, never acts alone --
    "PSI lifts warn to stop": Row(
        sample(7, psi=55),
        Action.stop,
        Level.stop,
        False,
        ("PSI full avg10 55% reaches 40%", "so stop rather than warn"),
    ),
    "PSI at its threshold lifts": Row(sample(7, psi=40), Action.stop, Level.stop, False),
    "PSI under its threshold does not": Row(sample(7, psi=39.9), Action.warn, Level.warn, False),
    "PSI lifts stop to kill": Row(sample(3.5, psi=50), Action.kill, Level.kill, False),
    "PSI with memory to spare: ok": Row(sample(30, psi=95), Action.ok, Level.ok, True),
    "PSI escalation off": Row(
        sample(7, psi=95), Action.warn, Level.warn, False, config={"psi_full_avg10_escalate": None}
    ),
    "no PSI source": Row(sample(7), Action.warn, Level.warn, False),
    # -- NV_ERR_NO_MEMORY escalates, never acts alone --
    "new NVRM line lifts warn to stop": Row(
        sample(7, nvrm=3), Action.stop, Level.stop, False, ("the driver logged NV_ERR_NO_MEMORY 0.0 s ago",)
    ),
    "NVRM line with memory to spare: ok": Row(sample(30, nvrm=3), Action.ok, Level.ok, True),
    "recent NVRM line still lifts": Row(
        sample(7, nvrm=3), Action.stop, Level.stop, False, state=GuardState(nvrm_seen=3, nvrm_at=NOW - 9)
    ),
    "old NVRM line no longer lifts": Row(
        sample(7, nvrm=3), Action.warn, Level.warn, False, state=GuardState(nvrm_seen=3, nvrm_at=NOW - 11)
    ),
    "NVRM escalation off": Row(sample(7, nvrm=3), Action.warn, Level.warn, False, config={"nvrm_escalate_s": 0}),
    # -- the leak trend --
    "trend warns on an ok level": Row(sample(20), Action.warn, Level.ok, True, ("memory leak trend",), trend=trend()),
    "trend asks for a restart while idle": Row(
        sample(20),
        Action.planned_restart,
        Level.ok,
        True,
        ("restart vLLM while it is idle", "6 min away"),
        trend=trend(plan=True),
        idle=True,
    ),
    "trend restart waits while busy": Row(sample(20), Action.warn, Level.ok, True, trend=trend(plan=True), idle=False),
    "trend restart waits while idleness is unknown": Row(
        sample(20), Action.warn, Level.ok, True, trend=trend(plan=True), idle=None
    ),
    "trend restart once per instance": Row(
        sample(20),
        Action.warn,
        Level.ok,
        True,
        trend=trend(plan=True),
        idle=True,
        state=GuardState(restart_planned=True),
    ),
    "trend not falling: ok": Row(sample(20), Action.ok, Level.ok, True, trend=trend(warn=False)),
    "floors win over the trend": Row(sample(3.9), Action.stop, Level.stop, False, trend=trend(plan=True), idle=True),
    "trend means nothing without vLLM": Row(
        sample(20), Action.ok, Level.ok, True, trend=trend(plan=True), idle=True, running=False
    ),
    # -- dry run --
    "dry run would stop": Row(
        sample(3.9), Action.stop, Level.stop, False, ("would stop vLLM",), config={"dry_run": True}
    ),
    "dry run would kill": Row(
        sample(1.9), Action.kill, Level.kill, False, ("would SIGKILL",), config={"dry_run": True}
    ),
    "dry run would restart": Row(
        sample(20),
        Action.planned_restart,
        Level.ok,
        True,
        ("would restart",),
        config={"dry_run": True},
        trend=trend(plan=True),
        idle=True,
    ),
    # -- cool-down (stop: 30 s grace + 15 s; kill: 15 s) --
    "kill level right after a kill: cool-down": Row(
        sample(1.5),
        Action.cooldown,
        Level.kill,
        False,
        ("cool-down after the guard's kill 5.0 s ago",),
        state=held(Level.kill, last_action=Action.kill, last_action_at=NOW - 5),
    ),
    "kill level after the kill's cool-down: kill again": Row(
        sample(1.5),
        Action.kill,
        Level.kill,
        False,
        state=held(Level.kill, last_action=Action.kill, last_action_at=NOW - 16),
    ),
    "kill level during a stop: escalate at once": Row(
        sample(1.5),
        Action.kill,
        Level.kill,
        False,
        state=held(Level.stop, last_action=Action.stop, last_action_at=NOW - 1),
    ),
    "stop level during a stop's grace: cool-down": Row(
        sample(3.5),
        Action.cooldown,
        Level.stop,
        False,
        state=held(Level.stop, last_action=Action.stop, last_action_at=NOW - 40),
    ),
    "stop level after a stop's grace and cool-down: kill": Row(
        sample(3.5),
        Action.kill,
        Level.stop,
        False,
        ("did not bring it back",),
        state=held(Level.stop, last_action=Action.stop, last_action_at=NOW - 46),
    ),
    "warn level during cool-down": Row(
        sample(7),
        Action.cooldown,
        Level.warn,
        False,
        state=held(Level.warn, last_action=Action.kill, last_action_at=NOW - 5),
    ),
    "recovered while running during cool-down: ok, but no start": Row(
        sample(40), Action.ok, Level.ok, False, state=held(Level.ok, last_action=Action.kill, last_action_at=NOW - 5)
    ),
    "not running during cool-down: no start": Row(
        sample(40),
        Action.refuse_start,
        Level.ok,
        False,
        ("during the cool-down",),
        running=False,
        state=held(Level.ok, last_action=Action.kill, last_action_at=NOW - 5),
    ),
    "not running after cool-down: start allowed": Row(
        sample(40),
        Action.ok,
        Level.ok,
        True,
        running=False,
        state=held(Level.ok, last_action=Action.kill, last_action_at=NOW - 15),
    ),
}


def decide_row(row: Row) -> tuple[GuardState, Decision]:
    return decide(row.state, row.sample, NOW, cfg(**row.config), running=row.running, trend=row.trend, idle=row.idle)


@pytest.mark.parametrize("name", list(ROWS))
def test_policy_row(name: str) -> None:
    """Each row: one observation against one state gives one action, level and start gate."""
    row = ROWS[name]
    _, decision = decide_row(row)
    assert (decision.action, decision.level, decision.start_allowed) == (row.action, row.level, row.start_allowed), (
        decision.reason
    )
    for text in row.says:
        assert text in decision.reason
    assert decision.available == row.sample.available
    assert decision.dry_run is bool(row.config.get("dry_run"))


def test_dry_run_decides_but_does_not_act() -> None:
    """A dry-run stop is the same decision and state, marked so the loop carries out nothing."""
    real_state, real = decide(GuardState(), sample(3.9), NOW, cfg(), running=True)
    dry_state, dry = decide(GuardState(), sample(3.9), NOW, cfg(dry_run=True), running=True)
    assert real.acts and not dry.acts
    assert dry_state == real_state
    assert dry.reason == "would " + real.reason


def test_action_starts_an_episode_and_ok_after_cooldown_ends_it() -> None:
    """A stop records itself; the episode ends once the level is ok after the cool-down."""
    state, d = decide(GuardState(), sample(3.9), NOW, cfg(), running=True)
    assert d.action is Action.stop and (state.last_action, state.last_action_at) == (Action.stop, NOW)
    state, d = decide(state, sample(40), NOW + 10, cfg(), running=False)
    assert state.last_action is Action.stop and not d.start_allowed
    state, d = decide(state, sample(40), NOW + 45, cfg(), running=False)
    assert state.last_action is None and d.start_allowed


def run(
    history: list[tuple[float, Sample]], config: GuardConfig, *, running: bool = True, state: GuardState | None = None
) -> list[Decision]:
    state = state or GuardState()
    out = []
    for now, s in history:
        state, d = decide(state, s, now, config, running=running)
        out.append(d)
    return out


def series(*gibs: float, start: float = 0.0, step: float = 0.01, **kw: Any) -> list[tuple[float, Sample]]:
    return [(start + i * step, sample(g, at=start + i * step, **kw)) for i, g in enumerate(gibs)]


DEBOUNCE: dict[str, tuple[tuple[float, ...], list[Action]]] = {
    "two samples under the stop floor do nothing": ((3.9, 3.9, 20, 20), [Action.ok, Action.ok, Action.ok, Action.ok]),
    "the third sample under the stop floor stops": ((3.9, 3.9, 3.9), [Action.ok, Action.ok, Action.stop]),
    "warn comes before stop when memory falls": (
        (7, 7, 7, 3.9, 3.9, 3.9),
        [Action.ok, Action.ok, Action.warn, Action.warn, Action.warn, Action.stop],
    ),
    "a plunge to the kill floor kills after three samples": ((1.5, 1.5, 1.5), [Action.ok, Action.ok, Action.kill]),
    "alternating across the floor never acts": ((3.9, 20, 3.9, 20, 3.9, 20), [Action.ok] * 6),
    "a blip in a run restarts the count": (
        (3.9, 3.9, 20, 3.9, 3.9, 3.9),
        [Action.ok, Action.ok, Action.ok, Action.ok, Action.ok, Action.stop],
    ),
}


@pytest.mark.parametrize("name", list(DEBOUNCE))
def test_debounce(name: str) -> None:
    """The guard rises to a level only after `debounce_samples` consecutive samples at or past it."""
    values, expected = DEBOUNCE[name]
    assert [d.action for d in run(series(*values), cfg(debounce_samples=3))] == expected


def test_debounce_reason_counts_samples() -> None:
    """While debouncing, the reason says how many samples are still to come; at the action, how many it took."""
    decisions = run(series(3.9, 3.9, 3.9), cfg(debounce_samples=3))
    assert "(1 of 3 samples before the guard acts)" in decisions[0].reason
    assert "for 3 samples" in decisions[2].reason


HYSTERESIS: dict[str, tuple[tuple[float, ...], list[Level]]] = {
    # warn floor 8, margin 1: in under 8, out at 9 or more
    "warn holds until floor + margin": ((7.9, 8.5, 8.99, 9.0), [Level.warn, Level.warn, Level.warn, Level.ok]),
    "stop holds until floor + margin, then falls to warn": (
        (3.9, 4.5, 4.99, 5.0, 9.5),
        [Level.stop, Level.stop, Level.stop, Level.warn, Level.ok],
    ),
    "kill holds until floor + margin": ((1.9, 2.5, 3.1), [Level.kill, Level.kill, Level.stop]),
    "hovering at the stop floor does not flap": ((3.95, 4.05, 3.95, 4.05, 4.5), [Level.stop] * 5),
    "a fall straight to ok from kill": ((1.9, 20), [Level.kill, Level.ok]),
}


@pytest.mark.parametrize("name", list(HYSTERESIS))
def test_hysteresis(name: str) -> None:
    """A level is left only above its floor plus `recover_margin`."""
    values, expected = HYSTERESIS[name]
    assert [d.level for d in run(series(*values, step=100.0), cfg())] == expected


def test_memfree_hysteresis() -> None:
    """A MemFree stop holds until MemFree is back above its floor plus the margin."""
    history = [(i * 100.0, sample(7, free=f, at=i * 100.0)) for i, f in enumerate((1.5, 2.5, 3.1))]
    assert [d.level for d in run(history, cfg())] == [Level.stop, Level.stop, Level.warn]


def test_start_gate_hysteresis() -> None:
    """Once refused, a start waits until MemAvailable is above the start floor plus the margin."""
    decisions = run(series(15.9, 16.5, 16.99, 17.0, step=100.0), cfg(), running=False)
    assert [d.start_allowed for d in decisions] == [False, False, False, True]
    assert [d.action for d in decisions] == [Action.refuse_start] * 3 + [Action.ok]


def test_start_gate_opens_without_history() -> None:
    """A node that never dipped starts at the floor itself."""
    _, d = decide(GuardState(), sample(16), NOW, cfg(), running=False)
    assert d.start_allowed


def test_escalation_history_stop_then_kill() -> None:
    """Falling through the stop floor stops once; falling on to the kill floor kills at once, mid-grace."""
    decisions = run(series(3.9, 3.0, 2.5, 1.9, 1.5, step=1.0), cfg())
    assert [d.action for d in decisions] == [
        Action.stop,
        Action.cooldown,
        Action.cooldown,
        Action.kill,
        Action.cooldown,
    ]


def test_planned_restart_only_once_per_instance() -> None:
    """After asking once, the trend only warns; a new instance (not running in between) may ask again."""
    t = trend(plan=True)
    state, d1 = decide(GuardState(), sample(20), NOW, cfg(), running=True, trend=t, idle=True)
    state, d2 = decide(state, sample(20), NOW + 1, cfg(), running=True, trend=t, idle=True)
    state, _ = decide(state, sample(20), NOW + 2, cfg(), running=False)
    state, d3 = decide(state, sample(20), NOW + 3, cfg(), running=True, trend=t, idle=True)
    assert [d1.action, d2.action, d3.action] == [Action.planned_restart, Action.warn, Action.planned_restart]


def test_new_nvrm_lines_are_noticed_once() -> None:
    """The cumulative NVRM count is remembered, so an unchanged count is not a new line."""
    state, _ = decide(GuardState(), sample(30, nvrm=2), NOW, cfg(), running=True)
    assert (state.nvrm_seen, state.nvrm_at) == (2, NOW)
    state, _ = decide(state, sample(30, nvrm=2), NOW + 20, cfg(), running=True)
    assert state.nvrm_at == NOW


@pytest.mark.parametrize(
    "bad",
    [
        {"kill_below": 5 * GIB},
        {"stop_below": 9 * GIB},
        {"refuse_start_below": 3 * GIB},
        {"min_interval_s": 2.0, "max_interval_s": 1.0},
        {"psi_trigger": "some 1"},
    ],
)
def test_config_rejects_unordered_floors(bad: dict[str, Any]) -> None:
    """Floors must be ordered kill < stop < warn and stop <= start; sizes and triggers must parse."""
    with pytest.raises(ValueError):
        cfg(**bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4 GiB", 4 * GIB),
        ("512MiB", 512 * 1024**2),
        ("1.5g", int(1.5 * GIB)),
        ("2048", 2048),
        (7, 7),
    ],
)
def test_config_sizes(text: object, value: int) -> None:
    """Floors accept bytes or sizes with binary units."""
    assert cfg(free_below=text).free_below == value
