"""The field's containers on the real engine: the shipped configs of report 002's `docker run` line and report
001's compose service (and 001's compose file converted by import-compose) create containers whose HostConfig
carries exactly those settings; an adopted container's drift is reported key by key and `recreate` clears it; RDMA
preflight in a real container given a device node the test creates; vLLM's parse of the argv inside the
container; a missing device named before the launch.

This host (like CI) may create a container with --privileged or memlock -1 but not start it: such tests read the
HostConfig of the created container, whether or not its start succeeded.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from docker_runtime_support import DockerPlace, sh
from sysfs_tree import SysfsTree, roce_gid

from sparkd.cli.compose import import_compose
from sparkd.config import Config, RuntimeKind, load_config
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.container import check_container
from sparkd.preflight.launch_target import check_launch_target
from sparkd.preflight.rdma import check_rdma
from sparkd.preflight.vllm_args import check_vllm_args
from sparkd.runtime.base import LaunchError
from sparkd.runtime.docker_run import DockerRunRuntime
from sparkd.supervisor.failures import FailureClass
from sparkd.vllm_probe import PLUGIN_DIR

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3


def place_of(kind: RuntimeKind, request: pytest.FixtureRequest, tmp_path: Path) -> DockerPlace:
    return DockerPlace(kind, request.getfixturevalue("docker_client"), request.getfixturevalue("test_image"),
                       request.getfixturevalue("python_mounts"), request.getfixturevalue("docker_test_labels"),
                       request.getfixturevalue("docker_session_id"), tmp_path)


@pytest.fixture
def exec_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerPlace]:
    place = place_of(RuntimeKind.docker_exec, request, tmp_path)
    try:
        yield place
    finally:
        place.remove()


@pytest.fixture
def run_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerPlace]:
    place = place_of(RuntimeKind.docker_run, request, tmp_path)
    try:
        yield place
    finally:
        place.remove()


def uverbs_dir(root: Path) -> Path:
    """A directory holding one character device node like /dev/infiniband/uverbs0 (major 231)."""
    root.mkdir(parents=True)
    os.mknod(root / "uverbs0", 0o600 | stat.S_IFCHR, os.makedev(231, 192))
    return root


async def launch_created(runtime: Any) -> None:
    """Launch; on a host that cannot start such a container the created one stays for its HostConfig."""
    with contextlib.suppress(LaunchError):
        await runtime.launch(sh("true"))


def shipped(place: DockerPlace, tmp_path: Path, example: str, toml: str | None = None,
            paths: dict[str, str] | None = None) -> Config:
    """``config/examples/<example>`` as shipped (or ``toml``), in this test's place: its container name, node,
    image and the host paths in ``paths`` swapped for this test's; nothing else changed."""
    text = toml if toml is not None else (REPO / "config" / "examples" / example).read_text()
    data = tomllib.loads(text)
    swaps = {f'name = "{data["container"]["name"]}"': f'name = "{place.name}"',
             f'name = "{data["node"]["name"]}"': f'name = "{place.node}"',
             f'image = "{data["container"]["image"]}"': f'image = "{place.image}"', **(paths or {})}
    for old, new in swaps.items():
        assert old in text, f"{example} no longer says {old}"
        text = text.replace(old, new)
    assert "\n[paths]\n" not in text, f"{example} has its own [paths]"
    text += f'\n[paths]\nrun_dir = "{tmp_path / "sparkd-run"}"\n'  # sparkd's own folder in this test's
    (tmp_path / example).write_text(text)
    return load_config(tmp_path / example, env={})


def probe_mounts(tmp_path: Path) -> list[tuple[str, str, bool]]:
    """What sparkd adds for its step probe: the plugin read-only, the step files' folder writable."""
    probe = str(tmp_path / "sparkd-run" / "probe")
    return [(str(PLUGIN_DIR), str(PLUGIN_DIR), True), (probe, probe, False)]


async def test_field_002_docker_run_line(exec_place: DockerPlace, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docker run -d --name vllm_ds4 --gpus all --ipc host --net host --privileged -v MODELS:/models
    -v ~/.cache/vllm:/root/.cache/vllm -v ~/.cache/flashinfer:/root/.cache/flashinfer IMAGE sleep infinity,
    from the shipped config/examples/field-002-echo-docker-exec.toml."""
    monkeypatch.setenv("HOME", str(tmp_path))
    models = tmp_path / "models"
    for path in (models, tmp_path / ".cache" / "vllm", tmp_path / ".cache" / "flashinfer"):
        path.mkdir(parents=True)
    cfg = shipped(exec_place, tmp_path, "field-002-echo-docker-exec.toml",
                  paths={'source = "/home/milo/models"': f'source = "{models}"'})
    await launch_created(exec_place.runtime(cfg))
    attrs = exec_place.container().attrs
    host = attrs["HostConfig"]
    assert (host["Privileged"], host["NetworkMode"], host["IpcMode"]) == (True, "host", "host")
    assert [(r["Count"], r["Capabilities"]) for r in host["DeviceRequests"]] == [(-1, [["gpu"]])]
    assert sorted((m["Source"], m["Target"]) for m in host["Mounts"]) == sorted([
        (str(models), "/models"), (f"{tmp_path}/.cache/vllm", "/root/.cache/vllm"),
        (f"{tmp_path}/.cache/flashinfer", "/root/.cache/flashinfer"),
        *((source, target) for source, target, _ in probe_mounts(tmp_path))])
    assert attrs["Config"]["Entrypoint"] == ["sleep", "infinity"]
    assert await exec_place.runtime(cfg).drift() == []  # the container sparkd made is the config's


@pytest.mark.parametrize("source", ["compose", "shipped"])
async def test_field_001_compose_service(run_place: DockerPlace, tmp_path: Path, source: str) -> None:
    """Report 001's compose service, converted by import-compose and as the shipped
    config/examples/field-001-dsv4-1m-compose.toml (which adds a FlashInfer cache mount)."""
    devices = uverbs_dir(tmp_path / "infiniband")
    hf = tmp_path / "hf"
    hf.mkdir()
    mounts = [("/etc/group", "/etc/group", True), ("/etc/passwd", "/etc/passwd", True),
              (str(hf), "/cache/huggingface", False)]
    if source == "compose":
        compose = (REPO / "tests" / "data" / "field-001-compose.yaml").read_text()
        compose = compose.replace("/dev/infiniband:/dev/infiniband", f"{devices}:/dev/infiniband")
        (tmp_path / "compose.yaml").write_text(compose)
        env = {"NODE_RANK": "1", "HEADLESS": "1", "MASTER_ADDR": "192.168.0.8", "HF_CACHE": str(hf),
               "HOME": str(tmp_path)}
        toml = import_compose(tmp_path / "compose.yaml", environ=env).toml
        toml = toml.replace("\n[node]\n", '\n[node]\nname = "spark-head"\n', 1)  # the import names no node
        # the compile caches under the test's folder, not the host's /var/cache/sparkd (issue 36's default)
        toml = toml.replace("\n[container]\n", f'\n[container]\ncompile_cache_dir = "{tmp_path}/compile-cache"\n', 1)
        mounts.append((f"{tmp_path}/compile-cache/flashinfer", "/root/.cache/flashinfer", False))
        cfg = shipped(run_place, tmp_path, "imported.toml", toml)
    else:
        flashinfer = tmp_path / "flashinfer"
        flashinfer.mkdir()
        mounts.append((str(flashinfer), "/root/.cache/flashinfer", False))
        cfg = shipped(run_place, tmp_path, "field-001-dsv4-1m-compose.toml", paths={
            '"/dev/infiniband:/dev/infiniband"': f'"{devices}:/dev/infiniband"',
            'source = "/home/user/.cache/huggingface"': f'source = "{hf}"',
            'source = "/var/cache/sparkd/flashinfer"': f'source = "{flashinfer}"'})
    runtime = DockerRunRuntime(cfg, labels=run_place.labels)
    await launch_created(runtime)
    host = run_place.container().attrs["HostConfig"]
    assert (host["NetworkMode"], host["IpcMode"], host["Privileged"]) == ("host", "host", False)
    assert host["ShmSize"] == 64 * GIB
    assert sorted((u["Name"], u["Soft"], u["Hard"]) for u in host["Ulimits"]) == [
        ("memlock", -1, -1), ("stack", 67108864, 67108864)]
    assert host["Devices"] == [{"PathOnHost": str(devices), "PathInContainer": "/dev/infiniband",
                                "CgroupPermissions": "rwm"}]
    assert [(r["Count"], r["Capabilities"]) for r in host["DeviceRequests"]] == [(-1, [["gpu"]])]
    assert sorted((m["Source"], m["Target"], m.get("ReadOnly", False)) for m in host["Mounts"]) == sorted(
        [*mounts, *probe_mounts(tmp_path)])


async def test_an_adopted_container_drifts_key_by_key_until_recreated(exec_place: DockerPlace, tmp_path: Path,
                                                                       make_container: Any) -> None:
    """A hand-made container (as report 002 made vllm_ds4) adopted by name, compared with the config."""
    make_container("sleep infinity", name=exec_place.name, environment={"STALE": "1"}, ipc_mode="private",
                   volumes={str(tmp_path): {"bind": "/data", "mode": "rw"}})
    devices = uverbs_dir(tmp_path / "ib")
    cfg = exec_place.config(devices=[f"{devices}:/dev/infiniband"], shm_size="1g",
                            ulimits={"stack": "8m"}, cap_add=["IPC_LOCK"], env={"NCCL_IB_DISABLE": "0"})
    runtime = exec_place.runtime(cfg)
    found = {d.key: (d.configured, d.actual) for d in await runtime.drift()}
    assert found["container.devices"] == ([f"{devices}:/dev/infiniband:rwm"], [])
    assert found["container.ulimits"] == (["stack=8388608:8388608"], [])
    assert found["container.shm_size"] == (GIB, 67108864)
    assert found["container.cap_add"] == (["IPC_LOCK"], [])
    assert found["container.env"][0] == ["NCCL_IB_DISABLE=0"] and "STALE=1" in found["container.env"][1]
    # the test's folder at the same place shows the probe's folder, sparkd's source the plugin: no mount of their own
    assert found["container.mounts"] == ([f"{tmp_path}:{tmp_path}"], [f"{tmp_path}:/data"])
    result = await check_container(PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    for key in ("container.devices", "container.ulimits", "container.shm_size", "container.env", "container.mounts"):
        assert f"{key}: the config says" in result.found
    warned = exec_place.config(devices=[f"{devices}:/dev/infiniband"], shm_size="1g",
                               ulimits={"stack": "8m"}, cap_add=["IPC_LOCK"], env={"NCCL_IB_DISABLE": "0"},
                               sections={"preflight": {"drift": "warn"}})
    soft = await check_container(PreflightContext(cfg=warned, spec=render(warned), runtime=runtime))
    assert soft.verdict is Verdict.warn

    said = await runtime.recreate()
    assert said.startswith(f"removed container {exec_place.name}") and "created it from the config" in said
    assert await runtime.drift() == []
    again = await check_container(PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime))
    assert again.verdict is Verdict.ok


async def test_rdma_in_a_real_container_given_a_device_node(exec_place: DockerPlace, tmp_path: Path,
                                                            sysfs: SysfsTree) -> None:
    sysfs.port("rocep1s0f0", gids={3: (roce_gid("10.0.0.1"), "RoCE v2")})
    devices = uverbs_dir(tmp_path / "ib")
    sections = {"node": {"role": "head", "address": "10.0.0.1"}, "cluster": {"master_addr": "10.0.0.1",
                                                                             "nnodes": 2}}
    env = {"NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "3"}

    async def rdma(**more: Any) -> Any:
        cfg = exec_place.config(env=env, sections={**sections, "preflight": more.pop("preflight", {})}, **more)
        runtime = exec_place.runtime(cfg)
        await runtime.ensure_container()
        try:
            return await check_rdma(PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime,
                                                     sys_root=sysfs.root))
        finally:
            exec_place.remove()

    bare = await rdma()
    assert bare.verdict is Verdict.fail and bare.failure_class is FailureClass.config_error
    assert f"there is no /dev/infiniband/uverbs* in container {exec_place.name}" in bare.found
    assert f"the locked-memory limit in container {exec_place.name} is " in bare.found  # Docker's default
    given = await rdma(devices=[f"{devices}:/dev/infiniband"], preflight={"rdma_min_memlock": 4096})
    assert given.verdict is Verdict.ok, given.found
    assert "1 active RDMA port(s): rocep1s0f0 port 1" in given.found and "RoCE v2 GID index 3" in given.found


async def test_a_misspelled_flag_fails_in_the_container_naming_it(exec_place: DockerPlace,
                                                                  fake_vllm: tuple[Path, Path]) -> None:
    """The ``fake_vllm`` command line (vLLM's CLI layout over the stand-in's parser), seen in the container at the
    same path (the test's tmp dir and the venv are mounted there)."""
    exe, lib = fake_vllm
    cfg = exec_place.config(sections={"launch": {"executable": str(exe), "model": "m", "max_num_seqs": 4,
                                                 "extra_args": ["--enable-expert-paralel"],
                                                 "env": {"PYTHONPATH": str(lib)}}})
    runtime = exec_place.runtime(cfg)
    await runtime.ensure_container()
    with anyio.fail_after(60):
        result = await check_vllm_args(PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert f"vLLM rejects the rendered argv in container {exec_place.name}" in result.found
    assert "unrecognized arguments: --enable-expert-paralel" in result.found


async def test_a_device_that_is_not_there_fails_preflight_naming_it(run_place: DockerPlace, tmp_path: Path) -> None:
    cfg = run_place.config(devices=[f"{tmp_path}/no-such-device:/dev/infiniband"])
    result = await check_launch_target(PreflightContext(cfg=cfg, spec=render(cfg), runtime=run_place.runtime(cfg)))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert result.found == (f"the device {tmp_path}/no-such-device in container.devices does not exist on this host "
                            "(no RDMA driver loaded, or another path)")
