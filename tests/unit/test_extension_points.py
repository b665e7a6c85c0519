"""What an extension costs, held to docs/design.md: in a copy of the package, add a dummy preflight check, health
signal, control command and runtime the way the design's table says, count the files touched, and run something
that proves the dummy is picked up (the check runs, the watch posts the signal's verdict, the daemon's control API
answers the command, the config's runtime kind makes the runtime)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"


def promised() -> dict[str, int]:
    """The table under "What an extension costs" in docs/design.md: extension -> source files it touches."""
    text = DESIGN.read_text()
    table = text[text.index("What an extension costs"):].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = int(re.match(r"\d+", cells[-1]).group())  # type: ignore[union-attr]
    return rows


def edit(path: Path, anchor: str, new: str) -> None:
    """Write ``new`` in place of ``anchor``, which must occur exactly once."""
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path}: {anchor!r} occurs {text.count(anchor)} times"
    path.write_text(text.replace(anchor, new))


# ---- the dummies: each writes its files into the copy and returns a script that proves it is picked up --------

CHECK = '''"""Check: the dummy of tests/unit/test_extension_points.py."""

from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check


@check
async def check_dummy(ctx: PreflightContext) -> CheckResult:
    return CheckResult("dummy", Verdict.ok, "the dummy check ran")
'''

CHECK_PROOF = '''
import tempfile
from pathlib import Path
import anyio
from sparkd.config import config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext
from sparkd.preflight.runner import DEFAULT_CHECKS, run_preflight
from sparkd.runtime.process import ProcessRuntime

tmp = tempfile.mkdtemp()
for skip in ([], ["dummy"]):  # the config takes the new id
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "m"}, "paths": {"state_dir": tmp},
                               "preflight": {"skip": skip}}, env={})
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(Path(tmp)))
    report = anyio.run(run_preflight, ctx, tuple(c for c in DEFAULT_CHECKS if c.id == "dummy"))
    print([(r.id, r.found) for r in report.results])
'''

SIGNAL = '''"""A health signal: the dummy of tests/unit/test_extension_points.py."""

from sparkd.daemon.watch.healthsignal import Probes, Signal
from sparkd.supervisor import vocabulary as v


async def probe(probes: Probes) -> str:
    return "a dummy reading"


def rule(tracker, reading, now, cfg):  # type: ignore[no-untyped-def]
    return tracker, v.HealthDegraded(f"dummy: {reading} at {now:g}")


DUMMY = Signal("dummy", probe, rule, lambda cfg: 7.0)
'''

SIGNAL_PROOF = '''
import anyio
from sparkd.config import HealthConfig
from sparkd.daemon.watch.instance import InstanceWatch, Watched
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime, new_event_loop


class Log:
    def info(self, *args, **kwargs): pass
    warning = info


class Reports:
    def __init__(self): self.posted = []
    def post(self, obs): self.posted.append(obs)
    def state(self): return State.ready
    def on_line(self, line, persist=True): pass
    def classify_exit(self, exit_code, sig, hint, engine_gone=False): raise AssertionError("no exit here")


async def main():
    runtime, clock, reports = FakeRuntime(), FakeClock(start=0.0), Reports()
    watch = InstanceWatch(Watched(runtime.start()), runtime, reports, FakeProbes(runtime), HealthConfig(canary=False),
                          clock, Log())
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        await clock.run_until(lambda: any(isinstance(o, v.HealthDegraded) for o in reports.posted), limit_s=60)
        await watch.close()
    print([o.reason for o in reports.posted if isinstance(o, v.HealthDegraded)])

anyio.run(main, backend_options={"loop_factory": new_event_loop})
'''

COMMAND = '''"""``GET /v1/dummy``: the dummy of tests/unit/test_extension_points.py."""

from typing import Any

from sparkd.commands.base import NoParams, Reply, ok
from sparkd.commands.command import Cli, Command


async def execute(control: Any, request: NoParams) -> Reply:
    return ok({"dummy": "answered"})


def render(result: dict[str, Any]) -> str:
    return result["dummy"]


COMMAND = Command("dummy", "GET", NoParams, execute, render, cli=Cli(help="Answer as the dummy."))
'''

COMMAND_PROOF = '''
import anyio, httpx
from click.testing import CliRunner
from starlette.applications import Starlette
from sparkd.api.server import command_routes
from sparkd.cli.sparkctl import main as sparkctl
from sparkd.commands import operator


async def main():
    app = Starlette(routes=command_routes(None, operator()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sparkd") as client:
        print((await client.get("/v1/dummy")).json())

anyio.run(main)
print([line.strip() for line in CliRunner().invoke(sparkctl, ["--help"]).output.splitlines() if "dummy" in line])
'''

RUNTIME = '''"""The dummy runtime of tests/unit/test_extension_points.py: the process runtime under another kind."""

from sparkd.runtime.process import ProcessRuntime


class DummyRuntime(ProcessRuntime):
    pass


RUNTIME = DummyRuntime
'''

RUNTIME_PROOF = '''
import tempfile
from sparkd.config import config_from_mapping
from sparkd.runtime import make_runtime

cfg = config_from_mapping({"runtime": "dummy", "launch": {"model": "m"}, "container": {"image": "i"},
                           "paths": {"state_dir": tempfile.mkdtemp()}}, env={})
print(type(make_runtime(cfg)).__name__, "for", cfg.runtime)
'''


def add_check(pkg: Path) -> tuple[str, str]:
    (pkg / "preflight" / "dummy.py").write_text(CHECK)
    edit(pkg / "config" / "supervision.py", "PREFLIGHT_CHECKS: tuple[str, ...] = (\n",
         'PREFLIGHT_CHECKS: tuple[str, ...] = (\n    "dummy",\n')
    return CHECK_PROOF, "[('dummy', 'the dummy check ran')]\n[('dummy', 'skipped ([preflight] skip)')]"


def add_signal(pkg: Path) -> tuple[str, str]:
    (pkg / "daemon" / "watch" / "dummy_signal.py").write_text(SIGNAL)
    signals = pkg / "daemon" / "watch" / "signals.py"
    anchor = "from sparkd.daemon.watch.healthsignal import"
    edit(signals, anchor, f"from sparkd.daemon.watch.dummy_signal import DUMMY\n{anchor}")
    edit(signals, "    CANARY,\n", "    CANARY,\n    DUMMY,\n")
    return SIGNAL_PROOF, "['dummy: a dummy reading at 7']"


def add_command(pkg: Path) -> tuple[str, str]:
    (pkg / "commands" / "dummy.py").write_text(COMMAND)
    edit(pkg / "commands" / "__init__.py", 'OPERATOR_NAMES = (', 'OPERATOR_NAMES = ("dummy", ')
    return COMMAND_PROOF, "{'ok': True, 'result': {'dummy': 'answered'}}\n['dummy       Answer as the dummy.']"


def add_runtime(pkg: Path) -> tuple[str, str]:
    (pkg / "runtime" / "dummy.py").write_text(RUNTIME)
    anchor = "class RuntimeKind(StrEnum):\n"
    edit(pkg / "config" / "sections.py", anchor, f'{anchor}    dummy = "dummy"\n')
    return RUNTIME_PROOF, "DummyRuntime for dummy"


EXTENSIONS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "a preflight check": add_check,
    "a health signal": add_signal,
    "a control command": add_command,
    "a runtime": add_runtime,
}


def files(pkg: Path) -> dict[str, bytes]:
    return {str(p.relative_to(pkg)): p.read_bytes() for p in pkg.rglob("*.py")}


def test_the_design_names_every_extension() -> None:
    assert set(promised()) == set(EXTENSIONS)


@pytest.mark.parametrize("what", EXTENSIONS)
def test_an_extension_costs_what_the_design_says(what: str, tmp_path: Path) -> None:
    pkg = tmp_path / "sparkd"
    shutil.copytree(REPO / "sparkd", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = files(pkg)
    proof, expected = EXTENSIONS[what](pkg)
    after = files(pkg)
    touched = sorted(name for name in after if before.get(name) != after[name])
    assert len(touched) == promised()[what], touched
    script = f"import sparkd; assert sparkd.__file__.startswith({str(tmp_path)!r}), sparkd.__file__\n{proof}"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == expected
