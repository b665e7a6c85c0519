"""A daemon imports only what it uses (issues 26 and 35): a single node's, running and ready with the flight recorder
off, has loaded none of the group's machinery (the coordinator, the peer client, the fabric and weights proofs),
none of the weights' (its own manifest is made when first asked), none of the flight recorder's (the ring, its
writer, the watchdog, the memory settle's rules), none of the webhooks' notifier without ``[notify]`` targets, no
Docker SDK (a process runtime), nothing of sparkctl's (httpx, rich), no uvicorn or starlette (the control API is
sparkd's own on h11), no pydantic-settings (a config with no profile and no SPARKD_* override has no layers to
stack), no difflib (a typo's suggestion), none of the failure classifier's tables (no failure to explain yet) and,
with no NVIDIA driver, no NVML bindings. A head's daemon loads the group's, a recorder's the ring's, one with
targets the notifier. Each runs in a fresh interpreter: this one has imported everything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparkd.host.gpu import nvml

HERE = Path(__file__).resolve().parent
GROUP = ("sparkd.cluster.coordinator", "sparkd.cluster.peers", "sparkd.cluster.fabric_check",
         "sparkd.cluster.fabric_probe", "sparkd.cluster.bandwidth", "sparkd.cluster.weights")
WEIGHTS = ("sparkd.preflight.weights_local", "sparkd.preflight.manifest")
RECORDER = ("sparkd.daemon.views.recorder", "sparkd.recorder.record", "sparkd.recorder.ring",
            "sparkd.recorder.writer", "sparkd.recorder.watchdog", "sparkd.recorder.excerpt",
            "sparkd.recorder.baseline", "sparkd.commands.recorder")
NOTIFY = ("sparkd.notify", "sparkd.notify.sender", "sparkd.notify.events", "sparkd.notify.shapes",
          "sparkd.notify.limits")
NEVER = ("docker", "httpx", "rich", "sparkd.cli.sparkctl", "sparkd.api.client", "uvicorn", "starlette")
LAYERS = ("pydantic_settings", "sparkd.config.sources", "dotenv", "argparse")  # a config with layers to stack
ON_ERROR = ("difflib",)  # a typo's "did you mean": a config with an error only
# the failure classifier's tables (issue 35: 1.3 MiB at rest): loaded with the first failure to explain
CLASSIFIER = ("sparkd.supervisor.classify", "sparkd.supervisor.cause", "sparkd.supervisor.families",
              "sparkd.supervisor.rules", "sparkd.supervisor.events", "sparkd.supervisor.devicecodes")

# The daemon as `sparkd run` builds it (rich kept out first, as run does), over the loop harness's fakes, until
# its vLLM is ready; then the modules it holds.
SCRIPT = """
import json, sys
sys.modules.setdefault("rich", None)
import anyio
from pathlib import Path
import loop_harness
from sparkd.testing import FakeClock, FakeRuntime, new_event_loop

async def main(role, tmp):
    extra = {
        "single": {},
        "recorder": {"recorder": {"enabled": True}},
        "notify": {"notify": {"targets": [{"url": "http://127.0.0.1:9/hook"}]}},
        "head": {"node": {"role": "head"}, "cluster": {"master_addr": "127.0.0.1", "nnodes": 2,
                                                       "peers": ["127.0.0.1:1"]}},
    }[role]
    cfg = loop_harness.config(Path(tmp), **extra)
    clock = FakeClock()
    async with loop_harness.running(cfg, FakeRuntime(), clock) as node:
        if role != "head":
            await node.until_state("ready")
        held = sorted(name for name, module in sys.modules.items() if module is not None)
        (Path(tmp) / "modules.json").write_text(json.dumps(held))  # not stdout: the daemon's log shares it

anyio.run(main, *sys.argv[1:], backend_options={"loop_factory": new_event_loop})
"""


def loaded(role: str, tmp: Path) -> set[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, role, str(tmp)], capture_output=True, text=True,
                         timeout=120, cwd=HERE, env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads((tmp / "modules.json").read_text()))


def test_a_single_nodes_daemon_loads_nothing_of_the_group_weights_recorder_docker_or_sparkctl(
        tmp_path: Path) -> None:
    modules = loaded("single", tmp_path)
    assert "sparkd.daemon.app" in modules and "sparkd.cluster.ranks" in modules
    unused = {*GROUP, *WEIGHTS, *RECORDER, *NOTIFY, *NEVER, *LAYERS, *ON_ERROR, *CLASSIFIER}
    assert not modules & unused, sorted(modules & unused)
    if not nvml._driver_library_loads():
        assert "pynvml" not in modules


def test_a_daemon_with_the_flight_recorder_loads_its_ring(tmp_path: Path) -> None:
    modules = loaded("recorder", tmp_path)
    assert {"sparkd.daemon.views.recorder", "sparkd.recorder.writer", "sparkd.recorder.ring"} <= modules
    assert not modules & {*GROUP, *NEVER}


def test_a_daemon_with_notify_targets_loads_the_notifier(tmp_path: Path) -> None:
    modules = loaded("notify", tmp_path)
    assert set(NOTIFY) <= modules
    assert not modules & {*GROUP, *RECORDER, *NEVER}


def test_a_heads_daemon_loads_the_groups_machinery(tmp_path: Path) -> None:
    modules = loaded("head", tmp_path)
    assert set(GROUP) - {"sparkd.cluster.fabric_probe"} <= modules  # the probe answers a head's request: a worker's
    assert not modules & set(NEVER)
