"""What the lifecycle remembers across daemon restarts: ``<state_dir>/lifecycle.json``.

The operator's intent, the restart budget, the open breaker and the remaining backoff (``Remembered``) are
kept as wall-clock times, because monotonic time does not survive a reboot. A missing file is a fresh start;
a file that does not parse or has the wrong shape is set aside (renamed ``.bad-<stamp>``, never deleted), logged
by name, and also means a fresh start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkd.host.clock import Clock
from sparkd.state.files import json_state, set_aside
from sparkd.state.schema import LIFECYCLE
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.policy import RestartState, Strike
from sparkd.supervisor.states import Intent, Remembered

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

VERSION = 1


def to_json(r: Remembered, clock: Clock) -> dict[str, Any]:
    offset = clock.wall() - clock.now()
    failure = r.last_failure
    return {
        "version": VERSION,
        "intent": r.intent.value,
        "consecutive": r.restart_state.consecutive,
        "strikes": [{"at": s.at + offset, "weight": s.weight, "class": s.cls.value} for s in r.restart_state.strikes],
        "repeat": r.restart_state.repeat,
        "breaker_reason": r.breaker_reason,
        "backoff_until": None if r.backoff_until is None else r.backoff_until + offset,
        "last_failure": None if failure is None else {
            "class": failure.cls.value, "sentence": failure.sentence, "exit_code": failure.exit_code,
            "signal": failure.signal, "evidence": failure.evidence},
    }


class Malformed(ValueError):
    pass


def _opt(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
        raise Malformed(f"{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def from_json(data: Any, clock: Clock) -> Remembered:
    """The remembered lifecycle; raises Malformed naming the key that is wrong."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise Malformed(f"not a version {VERSION} lifecycle record")
    offset = clock.wall() - clock.now()
    try:
        intent = Intent(data.get("intent", "run"))
        strikes = tuple(Strike(at=float(s["at"]) - offset, weight=int(s["weight"]), cls=FailureClass(s["class"]))
                        for s in _opt(data, "strikes", list) or [])
        failure_data = _opt(data, "last_failure", dict)
        failure = None if failure_data is None else Failure(
            FailureClass(failure_data["class"]), str(failure_data["sentence"]), _opt(failure_data, "exit_code", int),
            _opt(failure_data, "signal", int), _opt(failure_data, "evidence", str))
    except (KeyError, TypeError, ValueError) as exc:
        raise Malformed(str(exc)) from None
    backoff = _opt(data, "backoff_until", (int, float))
    return Remembered(
        intent=intent,
        restart_state=RestartState(consecutive=_opt(data, "consecutive", int) or 0, strikes=strikes,
                                   repeat=_opt(data, "repeat", str)),
        breaker_reason=_opt(data, "breaker_reason", str),
        backoff_until=None if backoff is None else float(backoff) - offset,
        last_failure=failure,
    )


def load(path: Path, clock: Clock, log: Logger) -> Remembered:
    """The remembered lifecycle in ``path``, or a fresh one (missing, unreadable or malformed: logged, and a bad
    file set aside)."""
    state = json_state(path, LIFECYCLE, log=log, clock=clock.wall)
    data = state.read()
    if data is None:
        log.info("lifecycle_fresh", path=str(path), reason="no usable lifecycle record")
        return Remembered()
    try:
        remembered = from_json(data, clock)
    except (ValueError, RecursionError) as exc:
        return _set_aside(path, clock, log, str(exc))
    log.info("lifecycle_restored", path=str(path), intent=remembered.intent.value,
             breaker_open=remembered.breaker_reason is not None, strikes=len(remembered.restart_state.strikes),
             backoff_s=None if remembered.backoff_until is None else round(remembered.backoff_until - clock.now(), 1))
    return remembered


def _set_aside(path: Path, clock: Clock, log: Logger, why: str) -> Remembered:
    aside = set_aside(path, clock.wall())
    log.warning("lifecycle_unusable", path=str(path), reason=why, set_aside=str(aside) if aside else None)
    return Remembered()
