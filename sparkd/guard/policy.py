"""The memory guard's decision: a pure function of (state, sample, monotonic now, config, facts).

``decide`` reads no clock and does no I/O; the guard loop (:mod:`sparkd.guard.guard`) carries the state
between samples and carries out the action. Rules, in the order ``decide`` applies them:

1. **Floors** on MemAvailable, absolute bytes: under ``kill_below`` → kill level, under ``stop_below`` →
   stop, under ``warn_below`` → warn, else ok.
2. **Hysteresis**: a level the guard is at holds until MemAvailable is back above its floor plus
   ``recover_margin``, so a value hovering at a floor cannot flap.
3. **MemFree, gated**: MemFree under ``free_below`` counts as the stop level, but only while MemAvailable
   is under ``free_gate_below``. MemFree alone sits near zero whenever page cache is full; an ungated
   MemFree trigger killed a healthy launch in the field.
4. **Escalators** lift a warn or stop level one stage, never ok: PSI ``full avg10`` at or above
   ``psi_full_avg10_escalate``, and ``NV_ERR_NO_MEMORY`` in the kernel log within ``nvrm_escalate_s``.
   Neither acts alone: pressure or a driver error with memory to spare is startup noise.
5. **Debounce**: the guard rises to a level after ``debounce_samples`` consecutive samples at or past it;
   it falls as soon as the raw level (with hysteresis) falls.
6. **Start gate**: a start is refused while MemAvailable is under ``refuse_start_below`` (once refused,
   until it is back above that plus the margin), and during the cool-down after a stop or kill.
7. **Action**, vLLM running: kill level → kill; stop level → stop; warn → warn. Not running: refuse_start
   when the gate is shut, else warn/ok. A running vLLM on an ok level whose leak trend says so → warn, or a
   planned restart when the trend asks for one and vLLM is idle (once per instance).
8. **Cool-down**: after a kill nothing repeats for ``cooldown_s`` (the memory takes time to come back);
   after a stop, for ``stop_grace_s`` plus that (vLLM gets its grace to unlink its shared memory). Meanwhile
   no start is allowed. A kill level kills at once even while a stop is under way (escalation); a vLLM
   still running at the stop level when the stop's cool-down ends is killed (the stop did not work). The
   episode ends when the level is ok after the cool-down.
9. **Dry run**: the same decisions and state, marked ``dry_run`` and worded "would"; the loop acts on none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from sparkd.config import GuardConfig
from sparkd.guard.sample import Sample, gib
from sparkd.guard.trend import TrendVerdict

__all__ = ["Action", "Decision", "GuardState", "Level", "decide"]


class Level(IntEnum):
    ok = 0
    warn = 1
    stop = 2
    kill = 3


class Action(StrEnum):
    ok = "ok"
    warn = "warn"  # log, status and metrics only
    refuse_start = "refuse_start"  # vLLM is not running and must not be started now
    cooldown = "cooldown"  # acted recently; waiting for the memory to come back
    stop = "stop"  # SIGTERM the vLLM tree, SIGKILL after the grace
    kill = "kill"  # SIGKILL the vLLM tree now
    planned_restart = "planned_restart"  # the leak trend reaches the floor soon; restart while idle


ACTING = frozenset({Action.stop, Action.kill, Action.planned_restart})


@dataclass(frozen=True)
class GuardState:
    level: Level = Level.ok  # debounced, with hysteresis
    streaks: tuple[int, int, int] = (0, 0, 0)  # consecutive samples with the raw level >= warn, stop, kill
    start_refused: bool = False  # the start floor's own hysteresis
    last_action: Action | None = None  # stop or kill of the current episode
    last_action_at: float | None = None
    nvrm_seen: int = 0  # the cumulative NV_ERR_NO_MEMORY count at the previous sample
    nvrm_at: float | None = None  # when new NV_ERR_NO_MEMORY lines last appeared
    restart_planned: bool = False  # a planned restart was asked for this instance


@dataclass(frozen=True)
class Decision:
    action: Action
    level: Level
    start_allowed: bool
    reason: str  # one sentence with the numbers
    available: int  # MemAvailable the decision rests on, bytes
    at: float  # monotonic seconds
    dry_run: bool = False

    @property
    def acts(self) -> bool:
        """Does the loop carry this out (stop, kill, planned restart, not in dry run)?"""
        return self.action in ACTING and not self.dry_run


_FLOORS = ((Level.kill, "kill"), (Level.stop, "stop"), (Level.warn, "warn"))


def _floor(level: Level, cfg: GuardConfig) -> int:
    return {Level.kill: cfg.kill_below, Level.stop: cfg.stop_below, Level.warn: cfg.warn_below}[level]


def _floor_level(sample: Sample, held: Level, cfg: GuardConfig) -> tuple[Level, list[str]]:
    """Rules 1–3: the level from the floors, with hysteresis for the levels the guard holds."""
    available = sample.available
    level, causes = Level.ok, []
    for candidate, name in _FLOORS:
        floor = _floor(candidate, cfg)
        if available < floor:
            level = candidate
            causes.append(f"MemAvailable {gib(available)} is under the {name} floor {gib(floor)}")
            break
        if held >= candidate and available < floor + cfg.recover_margin:
            level = candidate
            causes.append(f"MemAvailable {gib(available)} is not yet back above the {name} floor "
                          f"{gib(floor)} + {gib(cfg.recover_margin)}")
            break
    free_floor = cfg.free_below + (cfg.recover_margin if held >= Level.stop else 0)
    if level < Level.stop and sample.free < free_floor and available < cfg.free_gate_below:
        level = Level.stop
        causes.append(f"MemFree {gib(sample.free)} is under {gib(cfg.free_below)} while MemAvailable "
                      f"{gib(available)} is under {gib(cfg.free_gate_below)}")
    return level, causes


def _escalated(level: Level, sample: Sample, nvrm_at: float | None, now: float,
               cfg: GuardConfig) -> tuple[Level, list[str]]:
    """Rule 4: PSI and driver errors lift a warn or stop level one stage."""
    if level not in (Level.warn, Level.stop):
        return level, []
    causes = []
    psi = sample.psi_full_avg10
    if cfg.psi_full_avg10_escalate is not None and psi is not None and psi >= cfg.psi_full_avg10_escalate:
        causes.append(f"PSI full avg10 {psi:.0f}% reaches {cfg.psi_full_avg10_escalate:.0f}%")
    if nvrm_at is not None and cfg.nvrm_escalate_s > 0 and now - nvrm_at < cfg.nvrm_escalate_s:
        causes.append(f"the driver logged NV_ERR_NO_MEMORY {now - nvrm_at:.1f} s ago")
    if not causes:
        return level, []
    return Level(level + 1), [*causes, f"so {Level(level + 1).name} rather than {level.name}"]


def _debounce(raw: Level, streaks: tuple[int, int, int], cfg: GuardConfig) -> tuple[Level, tuple[int, int, int]]:
    """Rule 5: rise after `debounce_samples` samples in a row; fall at once."""
    warn, stop, kill = (n + 1 if raw >= lvl else 0 for n, lvl in zip(streaks, (1, 2, 3), strict=True))
    level = Level.ok
    for lvl, n in ((Level.warn, warn), (Level.stop, stop), (Level.kill, kill)):
        if n >= cfg.debounce_samples:
            level = lvl
    return level, (warn, stop, kill)


def _in_cooldown(state: GuardState, now: float, cfg: GuardConfig) -> bool:
    """Rule 8: a kill cools down for `cooldown_s`; a stop for its grace plus that."""
    if state.last_action_at is None or state.last_action not in (Action.stop, Action.kill):
        return False
    window = cfg.cooldown_s + (cfg.stop_grace_s if state.last_action is Action.stop else 0.0)
    return now - state.last_action_at < window


def _running_action(level: Level, state: GuardState, cooling: bool) -> Action:
    """Rules 7–8 for a running vLLM, floors only."""
    if level is Level.kill:
        return Action.cooldown if cooling and state.last_action is Action.kill else Action.kill
    if level is Level.stop:
        if cooling:
            return Action.cooldown
        return Action.kill if state.last_action in (Action.stop, Action.kill) else Action.stop
    if level is Level.warn:
        return Action.cooldown if cooling else Action.warn
    return Action.ok


@dataclass(frozen=True)
class _Facts:
    running: bool
    trend: TrendVerdict | None
    idle: bool | None


def _choose(level: Level, start_allowed: bool, state: GuardState, cooling: bool, facts: _Facts) -> Action:
    if not facts.running:
        if not start_allowed:
            return Action.refuse_start
        return Action.warn if level >= Level.warn else Action.ok
    action = _running_action(level, state, cooling)
    trend = facts.trend
    if action is Action.ok and trend is not None:
        if trend.plan_restart and facts.idle is True and not state.restart_planned:
            return Action.planned_restart
        if trend.warn:
            return Action.warn
    return action


def decide(
    state: GuardState, sample: Sample, now: float, cfg: GuardConfig, *, running: bool,
    trend: TrendVerdict | None = None, idle: bool | None = None,
) -> tuple[GuardState, Decision]:
    """The next state and the decision for ``sample`` at monotonic ``now``.

    ``running``: a vLLM tree exists on this node. ``trend``: the leak trend's verdict, if there is one.
    ``idle``: vLLM has no running requests (True), has some (False), or nobody knows (None).
    """
    nvrm_at = now if sample.nvrm_errors > state.nvrm_seen else state.nvrm_at
    floor_level, causes = _floor_level(sample, state.level, cfg)
    raw, lifted = _escalated(floor_level, sample, nvrm_at, now, cfg)
    level, streaks = _debounce(raw, state.streaks, cfg)
    cooling = _in_cooldown(state, now, cfg)
    refuse_floor = cfg.refuse_start_below + (cfg.recover_margin if state.start_refused else 0)
    refused = sample.available < refuse_floor or level >= Level.stop
    start_allowed = not refused and not cooling
    facts = _Facts(running, trend, idle)
    action = _choose(level, start_allowed, state, cooling, facts)

    last_action, last_at = state.last_action, state.last_action_at
    if action in (Action.stop, Action.kill):
        last_action, last_at = action, now
    elif level is Level.ok and not cooling:
        last_action, last_at = None, None  # the episode is over
    after = GuardState(
        level=level, streaks=streaks, start_refused=refused, last_action=last_action, last_action_at=last_at,
        nvrm_seen=sample.nvrm_errors, nvrm_at=nvrm_at,
        restart_planned=running and (state.restart_planned or action is Action.planned_restart),
    )
    reason = _reason(action, level, raw, [*causes, *lifted], sample, state, streaks, now, cfg, facts)
    decision = Decision(action, level, start_allowed, reason, sample.available, now, cfg.dry_run)
    return after, decision


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _why(level: Level, raw: Level, causes: list[str], sample: Sample, streaks: tuple[int, int, int],
         cfg: GuardConfig) -> str:
    """The causes, the first one with its sample count (or how far the debounce has got)."""
    if not causes:
        return f"MemAvailable {gib(sample.available)} is above every floor"
    first, rest = causes[0], causes[1:]
    if raw > level:
        first += f" ({streaks[raw - 1]} of {_plural(cfg.debounce_samples, 'sample')} before the guard acts)"
    elif level >= Level.warn:
        first += f" for {_plural(streaks[level - 1], 'sample')}"
    return "; ".join([first, *rest])


def _reason(action: Action, level: Level, raw: Level, causes: list[str], sample: Sample, state: GuardState,
            streaks: tuple[int, int, int], now: float, cfg: GuardConfig, facts: _Facts) -> str:
    why = _why(level, raw, causes, sample, streaks, cfg)
    would = "would " if cfg.dry_run else ""
    last = state.last_action.value if state.last_action is not None else "action"
    since = f"{now - state.last_action_at:.1f} s ago" if state.last_action_at is not None else ""
    if action is Action.stop:
        return f"{would}stop vLLM (SIGTERM, {cfg.stop_grace_s:g} s grace): {why}"
    if action is Action.kill:
        if state.last_action is not None and level is Level.stop:
            why += f"; the guard's {last} {since} did not bring it back"
        return f"{would}SIGKILL the vLLM tree: {why}"
    if action is Action.cooldown:
        grace = f"grace {cfg.stop_grace_s:g} s + " if state.last_action is Action.stop else ""
        return f"cool-down after the guard's {last} {since} ({grace}cool-down {cfg.cooldown_s:g} s): {why}"
    if action is Action.refuse_start:
        if _in_cooldown(state, now, cfg):
            return f"no vLLM start during the cool-down after the guard's {last} {since}: {why}"
        floor, available = cfg.refuse_start_below, sample.available
        if available < floor:
            return f"no vLLM start: MemAvailable {gib(available)} is under the start floor {gib(floor)}"
        if state.start_refused and available < floor + cfg.recover_margin:
            return (f"no vLLM start: MemAvailable {gib(available)} is not yet back above the start floor "
                    f"{gib(floor)} + {gib(cfg.recover_margin)}")
        return f"no vLLM start: {why}"
    trend = facts.trend
    if action is Action.planned_restart and trend is not None:
        return f"{would}restart vLLM while it is idle: {trend.reason}"
    if action is Action.warn and level is Level.ok and trend is not None:
        return f"memory leak trend: {trend.reason}"
    return why
