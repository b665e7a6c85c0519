"""Lint of what would kill a drain early, or keep vLLM from draining: the drain flag given twice, a launch script
that disagrees with ``[stop] drain_s``, a container or unit stop timeout shorter than the drained stop's grace. Pure.

The graces are :mod:`sparkd.supervisor.graces`'s; the unit's ``TimeoutStopSec`` is read where sparkd runs
(:mod:`sparkd.host.unit`) and judged here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sparkd.config import Config, RuntimeKind
from sparkd.launch.finding import Finding, Level
from sparkd.launch.render import SHUTDOWN_TIMEOUT_FLAG
from sparkd.launch.script import ScriptFacts
from sparkd.supervisor.graces import drained_grace_s, unit_stop_timeout_s


def drain_rules(cfg: Config, facts: ScriptFacts | None) -> Iterator[Finding]:
    """The flag and the script against ``[stop] drain_s``, and the container's own stop timeout."""
    drain = cfg.stop.drain_s
    if not cfg.launch.script:
        for i, arg in enumerate(cfg.launch.extra_args):
            if arg.split("=", 1)[0] == SHUTDOWN_TIMEOUT_FLAG:
                yield Finding("shutdown-timeout-in-extra-args", Level.error, f"launch.extra_args[{i}]",
                              f"{SHUTDOWN_TIMEOUT_FLAG} is rendered from stop.drain_s ({drain}), and every stop "
                              "grace is derived from it; set stop.drain_s instead")
    elif facts is not None and facts.command:
        yield from _script_drain(cfg, facts)
    timeout = cfg.container.stop_timeout_s
    if cfg.runtime is RuntimeKind.docker_run and timeout is not None and timeout < drained_grace_s(cfg):
        yield Finding("container-stop-timeout-short", Level.error, "container.stop_timeout_s",
                      f"{timeout} s is shorter than a drained stop ({_grace(cfg)}): `docker stop` or the engine's "
                      "shutdown would SIGKILL vLLM in the middle of its drain; raise it or leave it unset")


def _script_drain(cfg: Config, facts: ScriptFacts) -> Iterator[Finding]:
    script, drain = cfg.launch.script, cfg.stop.drain_s
    said = facts.value(SHUTDOWN_TIMEOUT_FLAG)
    if said is None and drain > 0 and not facts.mentions(SHUTDOWN_TIMEOUT_FLAG):
        yield Finding("script-without-drain", Level.warning, "launch.script",
                      f"{script} launches vLLM without {SHUTDOWN_TIMEOUT_FLAG}, so a stop aborts the requests in "
                      f"flight; add `{SHUTDOWN_TIMEOUT_FLAG} {drain}` to its serve line (or set stop.drain_s = 0)")
    elif said is not None and said.isdigit() and int(said) != drain:
        yield Finding("script-drain-differs", Level.error, "launch.script",
                      f"{script} launches vLLM with {SHUTDOWN_TIMEOUT_FLAG} {said}, but stop.drain_s is {drain}: "
                      "sparkd derives its stop grace from drain_s and would SIGKILL a longer drain; make them "
                      "agree")


def _grace(cfg: Config) -> str:
    return (f"stop.drain_s {cfg.stop.drain_s} s + supervisor.stop_grace_s {cfg.supervisor.stop_grace_s:g} s = "
            f"{drained_grace_s(cfg):g} s")


@dataclass(frozen=True)
class UnitStop:
    """The stop timeout of the systemd unit that runs sparkd with this config, as systemd reports it."""

    unit: str
    timeout_s: float | None  # None: infinity (systemd never SIGKILLs it)
    source: str  # where the value comes from: the unit file or a drop-in, as `systemctl show` names it


def unit_rules(cfg: Config, unit: UnitStop | None) -> Iterator[Finding]:
    """The unit must let sparkd's own shutdown finish a drained stop, the GPU memory's release and the sweep."""
    if unit is None or unit.timeout_s is None:
        return
    need = unit_stop_timeout_s(cfg)
    if unit.timeout_s < need:
        yield Finding("unit-stop-timeout-short", Level.error, "stop.drain_s",
                      f"{unit.unit} has TimeoutStopSec={unit.timeout_s:g}s ({unit.source}), shorter than sparkd's "
                      f"own stop: a drained stop ({_grace(cfg)}), supervisor.gpu_release_timeout_s "
                      f"{cfg.supervisor.gpu_release_timeout_s:g} s and the sweep need {need:g} s; systemd would "
                      f"SIGKILL sparkd in the middle of the drain. Set TimeoutStopSec={need:g}s or more in a drop-in "
                      "(`systemctl edit sparkd`), or lower stop.drain_s")
