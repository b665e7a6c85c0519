"""Shared fixtures: the real Docker engine and the sparkd test image (docs/design.md §8), the event loop of every
async test (``anyio_backend``), fake sysfs trees and a fake vLLM.

Tests marked ``@pytest.mark.docker`` get a working engine or fail loudly with the reason: a missing engine is
never a silent skip. Locally, ``SPARKD_TESTS_NO_DOCKER=1`` skips them with an explicit reason.

If no engine answers, the ``docker_client`` fixture runs ``tests/infra/ensure-docker.sh`` once (installs
docker.io if needed and starts dockerd; needs root). ``SPARKD_TESTS_ENSURE_DOCKER=0`` turns that off.

Containers made through ``make_container`` / ``make_session_container`` run the local test image with host
networking and the host's ``/usr``, Python, venv and repo mounted read-only (``python_mounts``), so
``<repo>/.venv/bin/python -m sparkd...`` runs inside. Every container carries the labels
``sparkd.test=1`` and ``sparkd.test.session=<id>``; at the end of the session exactly the containers with
this session's label are removed (force). No other container is ever touched.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from childrun import is_owner, shared_folder
from sysfs_tree import SysfsTree

from sparkd.testing import new_event_loop

# A shell that starts the suite in the background (`make test &` in a script) hands it SIGINT ignored, and every
# program the tests start would inherit that: a Ctrl-C test, or the interrupt that ends a background soak, would
# reach nothing. The suite takes the default back, so its programs get SIGINT as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO_ROOT = Path(__file__).resolve().parent.parent
INFRA_DIR = REPO_ROOT / "tests" / "infra"
ENSURE_DOCKER = INFRA_DIR / "ensure-docker.sh"

NO_DOCKER_ENV = "SPARKD_TESTS_NO_DOCKER"
ENSURE_DOCKER_ENV = "SPARKD_TESTS_ENSURE_DOCKER"

TEST_LABEL = "sparkd.test"
SESSION_LABEL = "sparkd.test.session"
PID_LABEL = "sparkd.test.pid"


def _load_build_image() -> ModuleType:
    name = "sparkd_tests_infra_build_image"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, INFRA_DIR / "build_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


build_image = _load_build_image()


def _no_docker() -> bool:
    return os.environ.get(NO_DOCKER_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


_NO_DOCKER_REASON = f"{NO_DOCKER_ENV}=1: docker-marked tests skipped on request (never set this in CI)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _tier_beside_or_in_line(config, items)
    if not _no_docker():
        return
    skip = pytest.mark.skip(reason=_NO_DOCKER_REASON)
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(skip)


# ---------------------------------------------------------------------------------------------------------
# The real-vLLM tier, beside the other tests


def _load_realvllm_beside() -> ModuleType:
    folder = REPO_ROOT / "tests" / "realvllm"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    import beside

    return beside


TIER_NODEIDS = pytest.StashKey[list[str]]()


def _tier_beside_or_in_line(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With other tests selected too, the tier's tests leave this session for a child started beside it (their
    nodeids stashed for it) and its collector stays; alone (or inside that child), the tier runs in line and the
    collector goes."""
    beside = _load_realvllm_beside()
    tier = [item for item in items if beside.is_tier_item(item.nodeid)]
    collector = [item for item in items if beside.COLLECTOR in item.nodeid]
    others = [item for item in items if "realvllm/" not in item.nodeid]
    moved = tier if tier and others and not beside.INSIDE else collector
    if tier and moved is tier:
        config.stash[TIER_NODEIDS] = [item.nodeid for item in tier]
    if moved:
        config.hook.pytest_deselected(items=moved)
        items[:] = [item for item in items if item not in moved]


@pytest.fixture(scope="session", autouse=True)
def realvllm_beside(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real-vLLM tier started with the session's first test, when its tests left the session for it."""
    nodeids = request.config.stash.get(TIER_NODEIDS, None)
    if not nodeids:
        yield None
        return
    beside = _load_realvllm_beside()
    folder = shared_folder(tmp_path_factory, "realvllm-beside")
    tier = beside.start(folder, nodeids) if is_owner() else None
    try:
        yield beside.outcome(folder)
    finally:
        if tier is not None:
            tier.finish(interrupted=_stopped_early(request.session))


@pytest.fixture(autouse=True)
def _umask_as_it_was() -> Iterator[None]:
    """A test that runs sparkd's programs or its daemon in-process takes their umask (027) for the rest of the
    worker; each test starts with the umask the session had, so that a later test's files keep their usual modes."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture(autouse=True)
def _docker_marker_requires_engine(request: pytest.FixtureRequest) -> None:
    """A ``docker``-marked test errors with the engine's problem even if it names no docker fixture."""
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_client")


# ---------------------------------------------------------------------------------------------------------
# The soak, beside the other tests


def _load_soak_private() -> ModuleType:
    soak = REPO_ROOT / "tests" / "soak"
    if str(soak) not in sys.path:
        sys.path.insert(0, str(soak))
    import private

    return private


@pytest.fixture(scope="session", autouse=True)
def soak_in_background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """When ``tests/soak/test_soak.py::test_soak`` is selected (and runs as root, outside its own namespace), the
    soak starts with the session's first test and runs beside the others; ``test_soak`` collects its outcome. It
    mostly waits on its faults' recoveries, so this saves its minutes, not its CPU."""
    selected = any(item.nodeid.endswith("soak/test_soak.py::test_soak") for item in request.session.items)
    if not selected or os.geteuid() != 0 or os.environ.get("SPARKD_SOAK") == "1":
        yield None
        return
    private = _load_soak_private()
    folder = shared_folder(tmp_path_factory, "soak")
    soak = private.start(folder) if is_owner() else None
    try:
        yield private.outcome(folder)
    finally:
        if soak is not None:
            soak.finish(interrupted=_stopped_early(request.session))


_INTERRUPTED: list[bool] = []
_BESIDE_LINES: list[str] = []
_BESIDE_COLLECTORS = ("soak/test_soak.py::test_soak", "realvllm/test_beside.py::",
                      "unit/test_corpus_accuracy.py::test_held_out_accuracy",
                      "unit/test_second_reading.py::test_every_blind_excerpt_was_read_once")
_BESIDE_PREFIXES = ("soak: ", "realvllm: ", "real-vLLM tier timings", "classifier: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The closing lines of the runs beside the suite, from their collectors' output, and the classifier's accuracy
    on the real-log corpus (under pytest-xdist the reports reach the session's own process with the output they
    captured)."""
    if report.when == "call" and any(c in report.nodeid for c in _BESIDE_COLLECTORS):
        _BESIDE_LINES.extend(line for line in report.capstdout.splitlines() if line.startswith(_BESIDE_PREFIXES))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _BESIDE_LINES:
        terminalreporter.section("beside the suite: the soak, the real-vLLM tier and the classifier's held-out logs")
        for line in _BESIDE_LINES:
            terminalreporter.line(line)


def pytest_keyboard_interrupt() -> None:
    _INTERRUPTED.append(True)


def _stopped_early(session: pytest.Session) -> bool:
    """Interrupted, or stopped at a failure (-x): the children beside it are ended, not waited for."""
    return bool(_INTERRUPTED or session.shouldstop or session.shouldfail)


# ---------------------------------------------------------------------------------------------------------
# Engine


def _connect() -> tuple[Any, str | None]:
    """(client, None) if the engine answers a ping, else (None, reason)."""
    try:
        import docker
    except ImportError as exc:  # the project depends on it; a broken venv should say so
        return None, f"the 'docker' package is not importable: {exc}"
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return client, None


@pytest.fixture(scope="session")
def docker_session_id() -> str:
    """Identifies this pytest session's containers (label ``sparkd.test.session``)."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def docker_test_labels(docker_session_id: str) -> dict[str, str]:
    """Labels every container made for this session carries; give them to containers that code under test
    creates, so the session-end cleanup removes those too."""
    return {TEST_LABEL: "1", SESSION_LABEL: docker_session_id, PID_LABEL: str(os.getpid())}


def _remove_session_containers(client: Any, session_id: str) -> list[str]:
    """Force-remove the containers labelled with this session's id, and only those."""
    import docker.errors

    removed: list[str] = []
    for container in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}):
        # Double-check the label on the object itself before removing anything.
        if container.labels.get(SESSION_LABEL) != session_id:
            continue
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass
    return removed


@pytest.fixture(scope="session")
def docker_client(docker_session_id: str) -> Iterator[Any]:
    """A ``docker.DockerClient`` connected to a live engine.

    Skips only when ``SPARKD_TESTS_NO_DOCKER=1``; otherwise a missing engine fails the test with the reason.
    At session end, force-removes the containers labelled with this session's id.
    """
    if _no_docker():
        pytest.skip(_NO_DOCKER_REASON)
    client, reason = _connect()
    if client is None and os.environ.get(ENSURE_DOCKER_ENV, "1") != "0":
        try:
            proc = subprocess.run(
                ["bash", str(ENSURE_DOCKER)], capture_output=True, text=True, timeout=900, check=False
            )
            output = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0:
                pytest.fail(
                    f"No Docker engine ({reason}) and {ENSURE_DOCKER.relative_to(REPO_ROOT)} failed "
                    f"(exit {proc.returncode}):\n{output}\n"
                    f"Set {NO_DOCKER_ENV}=1 to skip docker tests locally.",
                    pytrace=False,
                )
        except subprocess.TimeoutExpired:
            pytest.fail(f"No Docker engine ({reason}) and {ENSURE_DOCKER} timed out", pytrace=False)
        client, reason = _connect()
    if client is None:
        pytest.fail(
            f"Docker engine unavailable: {reason}\n"
            f"Start one with `bash {ENSURE_DOCKER.relative_to(REPO_ROOT)}` (as root), "
            f"or set {NO_DOCKER_ENV}=1 to skip docker tests locally.",
            pytrace=False,
        )
    try:
        yield client
    finally:
        try:
            _remove_session_containers(client, docker_session_id)
        finally:
            client.close()


@pytest.fixture(scope="session")
def test_image(docker_client: Any) -> str:
    """Name of the local test image (``sparkd-test:latest``), built now if missing or outdated."""
    try:
        return build_image.ensure_image(docker_client)
    except Exception as exc:
        pytest.fail(f"could not build the test image {build_image.IMAGE}: {type(exc).__name__}: {exc}")


@pytest.fixture(scope="session")
def python_mounts() -> dict[str, dict[str, str]]:
    """Read-only mounts (docker SDK ``volumes`` format) for the host's /usr, Python, the venv and the repo.
    Do not mutate; merge: ``{**python_mounts, "/host/dir": {"bind": "/dir", "mode": "rw"}}``."""
    return build_image.python_mounts(REPO_ROOT)


@pytest.fixture(scope="session")
def venv_python() -> str:
    """``<repo>/.venv/bin/python``: the same path on the host and inside test containers."""
    return build_image.venv_python(REPO_ROOT)


# ---------------------------------------------------------------------------------------------------------
# Containers


class ContainerFactory:
    """Creates containers from the test image with our defaults and tracks them for removal."""

    _counter = itertools.count(1)

    def __init__(
        self,
        client: Any,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        labels: Mapping[str, str],
        session_id: str,
    ) -> None:
        self.client = client
        self.image = image
        self.mounts = dict(mounts)
        self.labels = dict(labels)
        self.session_id = session_id
        self.created: list[Any] = []

    def __call__(
        self,
        command: str | Sequence[str] | None = None,
        *,
        name: str | None = None,
        network_mode: str = "host",
        ipc_mode: str | None = None,
        cap_add: Sequence[str] = (),
        volumes: Mapping[str, Mapping[str, str]] | None = None,
        environment: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        init: bool = False,
        start: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Run (or with ``start=False`` only create) a container; returns a docker SDK ``Container``.

        - ``command``: default ``sleep infinity`` (the image's CMD); a string goes through ``/bin/sh -c``.
        - ``network_mode``: ``"host"``; ``ipc_mode``: e.g. ``"host"`` to share /dev/shm with the host.
        - ``cap_add``: single capabilities (``["SYS_PTRACE", "KILL"]``); ``privileged`` fails on these hosts.
        - ``volumes``: merged over ``python_mounts`` (same format; a host path given here wins).
        - ``labels``: merged over the session labels (which cannot be overridden).
        - ``init``: run docker-init as PID 1 (reaps zombies, forwards signals).
        - ``kwargs``: passed through to ``client.containers.run`` / ``create``.
        """
        if isinstance(command, str):
            cmd: list[str] | None = ["/bin/sh", "-c", command]
        else:
            cmd = list(command) if command is not None else None
        all_labels = {**(labels or {}), **self.labels}
        all_volumes = {**self.mounts, **(dict(volumes) if volumes else {})}
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", **(environment or {})}
        params: dict[str, Any] = {
            "name": name or f"sparkd-test-{self.session_id}-{next(self._counter)}",
            "network_mode": network_mode,
            "cap_add": list(cap_add) or None,
            "volumes": all_volumes,
            "environment": env,
            "labels": all_labels,
            "init": init or None,
            **kwargs,
        }
        if ipc_mode is not None:
            params["ipc_mode"] = ipc_mode
        if start:
            container = self.client.containers.run(self.image, cmd, detach=True, **params)
        else:
            container = self.client.containers.create(self.image, cmd, **params)
        self.created.append(container)
        return container

    def remove_all(self) -> None:
        """Force-remove the containers this factory made (each re-checked for this session's label)."""
        import docker.errors

        while self.created:
            container = self.created.pop()
            try:
                container.reload()
                if container.labels.get(SESSION_LABEL) == self.session_id:
                    container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass


def _factory(
    docker_client: Any,
    test_image: str,
    python_mounts: dict[str, dict[str, str]],
    docker_test_labels: dict[str, str],
    docker_session_id: str,
) -> ContainerFactory:
    return ContainerFactory(docker_client, test_image, python_mounts, docker_test_labels, docker_session_id)


@pytest.fixture
def make_container(
    docker_client: Any,
    test_image: str,
    python_mounts: dict[str, dict[str, str]],
    docker_test_labels: dict[str, str],
    docker_session_id: str,
) -> Iterator[Callable[..., Any]]:
    """Factory for containers removed when the test ends. See :meth:`ContainerFactory.__call__`."""
    factory = _factory(docker_client, test_image, python_mounts, docker_test_labels, docker_session_id)
    try:
        yield factory
    finally:
        factory.remove_all()


@pytest.fixture(scope="session")
def make_session_container(
    docker_client: Any,
    test_image: str,
    python_mounts: dict[str, dict[str, str]],
    docker_test_labels: dict[str, str],
    docker_session_id: str,
) -> Iterator[Callable[..., Any]]:
    """Like ``make_container``, for containers shared by several tests; removed at session end."""
    factory = _factory(docker_client, test_image, python_mounts, docker_test_labels, docker_session_id)
    try:
        yield factory
    finally:
        factory.remove_all()


# ---------------------------------------------------------------------------------------------------------
# RDMA devices in sysfs


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """Every async test runs on asyncio, on the loop that tells sparkd.testing's fake clock when every task is
    blocked (trio's autojump, on asyncio's public selector API)."""
    return "asyncio", {"loop_factory": new_event_loop}


@pytest.fixture
def sysfs(tmp_path: Path) -> SysfsTree:
    """A ``/sys`` of the test's own (tests/sysfs_tree.py)."""
    return SysfsTree(tmp_path / "sys")


# ---------------------------------------------------------------------------------------------------------
# A `vllm` command line for the argv parse check


# vLLM's command-line module layout (vllm.entrypoints.cli.main / serve, vllm.platforms) over the vLLM stand-in's own
# parser (sparkd_standin.args, release 0.24), which rejects unknown flags with vLLM's argparse errors.
FAKE_VLLM = {
    "vllm/__init__.py": '__version__ = "0.0.0+standin-parser"\n',
    "vllm/platforms/__init__.py": "class _Platform:\n    def is_unspecified(self):\n        return False\n\n"
                                  "current_platform = _Platform()\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/serve.py": "class ServeSubcommand:\n    @staticmethod\n    def cmd(args):\n"
                                     "        raise SystemExit('the engine would start here')\n",
    "vllm/entrypoints/cli/main.py": (
        "import sys\n"
        "from sparkd_standin.args import parse_command\n"
        "from vllm.entrypoints.cli import serve\n\n"
        "def main():\n"
        "    serve.ServeSubcommand.cmd(parse_command(sys.argv[1:], '0.24', '0.24.0'))\n"
    ),
}


@pytest.fixture
def fake_vllm(tmp_path: Path) -> tuple[Path, Path]:
    """(a ``vllm`` executable run by this venv's Python, the directory to put on its PYTHONPATH)."""
    lib = tmp_path / "fakevllm"
    for name, text in FAKE_VLLM.items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(text)
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\nfrom vllm.entrypoints.cli.main import main\nmain()\n")
    exe.chmod(0o755)
    return exe, lib
