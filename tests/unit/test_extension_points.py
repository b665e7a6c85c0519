"""What an extension costs, held to docs/design.md: in a copy of the package, add a preflight check, a health signal
(a real one: a page of vLLM's API read through the probes' port, judged by a rule in the core), a control command, a
runtime, a view and a config key the way the design's table says, count the files touched, and run something that
proves each is picked up (the check runs, the watch posts the signal's verdict, the daemon's control API answers the
command, the config's runtime kind makes the runtime, the running daemon's view sees its states, a reloaded key's
new value is the one in use)."""

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
    return CheckResult(Verdict.ok, "the dummy check ran")
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

SIGNAL = '''"""A health signal: vLLM lists the model it serves (`GET /v1/models`); none listed is a degraded vLLM."""

import json

from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.healthsignal import Answer, Probes, Signal


async def probe(probes: Probes):  # type: ignore[no-untyped-def]
    return await probes.fetch("/v1/models")


def rule(tracker, reading, now, cfg):  # type: ignore[no-untyped-def]
    if not isinstance(reading, Answer):
        return tracker, None  # no answer at all: /health's to judge
    try:
        listed = [m.get("id") for m in json.loads(reading.body).get("data", [])]
    except (ValueError, AttributeError, TypeError):
        listed = []
    if reading.status == 200 and listed:
        return tracker, None
    return tracker, v.HealthDegraded(f"models: /v1/models lists no model (HTTP {reading.status}) at {now:g}")


MODELS = Signal("models", probe, rule, lambda cfg: 7.0)
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
    async def classify_exit(self, exit_code, sig, hint, engine_gone=False): raise AssertionError("no exit here")
    async def head_stops_the_group(self): return False


async def main():
    runtime, clock, reports = FakeRuntime(), FakeClock(start=0.0), Reports()
    probes = FakeProbes(runtime)
    probes.pages["/v1/models"] = '{"object": "list", "data": []}'
    settings = HealthConfig(canary=False)
    watch = InstanceWatch(Watched(runtime.start()), runtime, reports, probes, lambda: settings, clock, Log())
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
from sparkd.api.server import command_routes, routed
from sparkd.cli.sparkctl import main as sparkctl
from sparkd.commands import operator
from sparkd.testing.http import HandlerTransport


async def main():
    app = routed(command_routes(None, operator()))
    async with httpx.AsyncClient(transport=HandlerTransport(app), base_url="http://sparkd") as client:
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
    (pkg / "supervisor" / "signals" / "models.py").write_text(SIGNAL)
    signals = pkg / "supervisor" / "signals" / "__init__.py"
    anchor = "from sparkd.supervisor.signals.canary import CANARY\n"
    edit(signals, anchor, f"{anchor}from sparkd.supervisor.signals.models import MODELS\n")
    edit(signals, "    CANARY,\n", "    CANARY,\n    MODELS,\n")
    return SIGNAL_PROOF, "['models: /v1/models lists no model (HTTP 200) at 7']"


def add_command(pkg: Path) -> tuple[str, str]:
    (pkg / "commands" / "dummy.py").write_text(COMMAND)
    edit(pkg / "commands" / "__init__.py", 'OPERATOR_NAMES = (', 'OPERATOR_NAMES = ("dummy", ')
    return COMMAND_PROOF, "{'ok': True, 'result': {'dummy': 'answered'}}\n['dummy       Answer as the dummy.']"


def add_runtime(pkg: Path) -> tuple[str, str]:
    (pkg / "runtime" / "dummy.py").write_text(RUNTIME)
    anchor = "class RuntimeKind(StrEnum):\n"
    edit(pkg / "config" / "sections.py", anchor, f'{anchor}    dummy = "dummy"\n')
    return RUNTIME_PROOF, "DummyRuntime for dummy"


# A daemon of the copy over sparkd.testing's fakes, from a config file (the view's and the config key's proofs).
DAEMON = '''
import sys
import tempfile
from pathlib import Path
import anyio
import structlog
from sparkd.config import load_config
from sparkd.daemon.adapters import Adapters
from sparkd.daemon.app import Daemon
from sparkd.testing import FakeClock, FakeNotifier, FakeProbes, FakeRuntime, new_event_loop, passing_check

TOML = """
runtime = "process"
[node]
name = "copy"
[launch]
executable = "/usr/bin/true"
model = "/models/m"
port = 18999
[paths]
state_dir = "{tmp}/state"
run_dir = "{tmp}/run"
instances_dir = "{tmp}/instances"
[api]
socket_group = ""
port = 0
[guard]
enabled = false
[recorder]
enabled = false
settle_s = 0
reboot_after_falls = 0
[health]
canary = false
[acceptance]
enabled = false
"""


structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the proof's


def daemon(extra=""):
    tmp = tempfile.mkdtemp()
    path = Path(tmp) / "sparkd.toml"
    path.write_text(TOML.format(tmp=tmp) + extra)
    runtime, clock = FakeRuntime(), FakeClock()
    adapters = Adapters(clock=clock, notifier=FakeNotifier(), probes=lambda: FakeProbes(runtime),
                        checks=(passing_check(),), sweep=())
    return Daemon(load_config(path), runtime, config_path=path, adapters=adapters), clock, path


async def until_ready(d, clock):
    await clock.run_until(lambda: d.sup.state().value == "ready", limit_s=600)
'''

VIEW = '''"""A view: what the node went through, in words (the dummy of tests/unit/test_extension_points.py)."""

from sparkd.daemon.loop.nodestate import NodeState
from sparkd.supervisor import vocabulary as v

SEEN: list[str] = []


class StateNotes:
    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if after.state is not before.state:
            SEEN.append(f"{before.state.value} -> {after.state.value}")
'''

VIEW_PROOF = DAEMON + '''
from sparkd.daemon.views.notes import SEEN


async def main():
    d, clock, _ = daemon()
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.run)
        await until_ready(d, clock)
        tg.cancel_scope.cancel()
    print(SEEN)

anyio.run(main, backend_options={"loop_factory": new_event_loop})
'''

KEY_PROOF = DAEMON + '''

async def main():
    d, clock, path = daemon('[supervisor]\\nnote = "before"\\n')
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.run)
        await until_ready(d, clock)
        shown = [d.view.status()["note"]]
        path.write_text(path.read_text().replace("before", "after"))
        report = await d.reloader.reload()
        shown.append(d.view.status()["note"])
        tg.cancel_scope.cancel()
    print(shown, report.settings)

anyio.run(main, backend_options={"loop_factory": new_event_loop})
'''


def add_view(pkg: Path) -> tuple[str, str]:
    (pkg / "daemon" / "views" / "notes.py").write_text(VIEW)
    app = pkg / "daemon" / "app.py"
    anchor = "from sparkd.daemon.views.ownlog import OwnLog\n"
    edit(app, anchor, f"{anchor}from sparkd.daemon.views.notes import StateNotes\n")
    edit(app, "self.on_state = in_order(", "self.on_state = in_order(StateNotes().on_state, ")
    return VIEW_PROOF, "['adopting -> preflight', 'preflight -> starting', 'starting -> ready']"


def add_key(pkg: Path) -> tuple[str, str]:
    edit(pkg / "config" / "supervision.py", "class SupervisorConfig(_Section):\n",
         'class SupervisorConfig(_Section):\n    note: str = Field(default="", description="A note, shown.")\n')
    edit(pkg / "daemon" / "views" / "status.py", '"version": __version__,',
         '"note": cfg.supervisor.note, "version": __version__,')
    return KEY_PROOF, "['before', 'after'] [\"supervisor.note: 'before' → 'after'\"]"


EXTENSIONS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "a preflight check": add_check,
    "a health signal": add_signal,
    "a control command": add_command,
    "a runtime": add_runtime,
    "a view": add_view,
    "a config key": add_key,
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
