"""Preflight checks that look inside a real container, through the runtime (``missing_target``, ``exec``,
``read_file``): the launch target and the configured image, the model path with its config and shards, and the
image integrity assertions (the field's double-applied mxfp4.py patch). Also: a dry run creates no container."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import docker.errors
import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict
from sparkd.preflight.container import check_container
from sparkd.preflight.image import check_image
from sparkd.preflight.launch_target import check_launch_target
from sparkd.runtime.docker_exec import DockerExecRuntime
from sparkd.runtime.docker_run import DockerRunRuntime
from sparkd.supervisor.failures import FailureClass

pytestmark = pytest.mark.docker

MXFP4 = "/opt/vllm/model_executor/layers/quantization/mxfp4.py"
PATCHED_ONCE = (
    "def process_weights(self):\n"
    "    if self.backend == 'triton':\n"
    "        torch.cuda.empty_cache()\n"
    "    _setup_kernel()\n"
    "    del w13, w2\n"
    "    torch.cuda.empty_cache()\n"
)
PATCHED_TWICE = PATCHED_ONCE + "    del w13, w2\n    torch.cuda.empty_cache()\n"  # the mod re-applied: 3 lines


def put(container: Any, path: str, text: str) -> None:
    """Write a file into the container's own layer (where the field's hand-applied mods lived)."""
    parent, name = path.rsplit("/", 1)
    container.exec_run(["mkdir", "-p", parent])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert container.put_archive(parent, buf.getvalue())


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model-00001-of-00002.safetensors").write_bytes(b"\0")
    (root / "model-00002-of-00002.safetensors").write_bytes(b"\0")
    return root


class Box:
    """One container of the test image for the module, with a model mounted at /models/m."""

    def __init__(self, container: Any, image: str, models: Path) -> None:
        self.container, self.image, self.models = container, image, models
        self.name = container.name

    def config(self, **sections: Any) -> Config:
        data: dict[str, Any] = {
            "runtime": "docker-exec", "node": {"name": "pftest"},
            "container": {"name": self.name, "image": self.image},
            "launch": {"executable": "/usr/bin/true", "model": "/models/m"},
        }
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **values}
        return config_from_mapping(data, env={})


@pytest.fixture(scope="module")
def box(make_session_container: Callable[..., Any], test_image: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    models = model_dir(tmp_path_factory.mktemp("pf-models") / "m")
    container = make_session_container(volumes={str(models): {"bind": "/models/m", "mode": "ro"}})
    put(container, MXFP4, PATCHED_ONCE)
    yield Box(container, test_image, models)
    container.remove(force=True)


def run(check: Any, ctx: PreflightContext) -> CheckResult:
    async def go() -> CheckResult:
        result: CheckResult = await check(ctx)
        return result

    return anyio.run(go)


def exec_context(box: Box, docker_client: Any, labels: dict[str, str], **sections: Any) -> PreflightContext:
    cfg = box.config(**sections)
    runtime = DockerExecRuntime(cfg, labels=labels, client=docker_client)
    return PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime)


# ---- launch target and model, inside the container ----------------------------------------------------------


def test_target_and_model_present_in_the_container(box: Box, docker_client: Any,
                                                   docker_test_labels: dict[str, str]) -> None:
    result = run(check_launch_target, exec_context(box, docker_client, docker_test_labels))
    assert result.verdict is Verdict.ok, result
    assert f"the launch target /usr/bin/true is there in container {box.name}" in result.found
    assert "model /models/m: config.json and 2 weight file(s)" in result.found


def test_model_not_in_the_container_is_a_config_error(box: Box, docker_client: Any,
                                                      docker_test_labels: dict[str, str]) -> None:
    # The host has the path; the container does not (it was never mounted): checked where vLLM runs.
    ctx = exec_context(box, docker_client, docker_test_labels, launch={"model": str(box.models)})
    result = run(check_launch_target, ctx)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert result.found == f"the model path {box.models} does not exist in container {box.name}"


def test_wrong_image_is_a_config_error(box: Box, docker_client: Any, docker_test_labels: dict[str, str]) -> None:
    ctx = exec_context(box, docker_client, docker_test_labels, container={"image": "sparkd-test-other:nope"})
    result = run(check_container, ctx)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert f"the container vLLM runs in container {box.name} differs from the config" in result.found
    assert f"container.image: the config says 'sparkd-test-other:nope (not on this node)', the container has " \
           f"'{box.image} (" in result.found
    assert "`sparkctl recreate` replaces it from the config" in result.found


def test_dry_run_does_not_create_the_container(box: Box, docker_client: Any,
                                               docker_test_labels: dict[str, str]) -> None:
    name = f"sparkd-pftest-absent-{uuid.uuid4().hex[:8]}"
    cfg = box.config(container={"name": name})
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), dry_run=True,
                           runtime=DockerExecRuntime(cfg, labels=docker_test_labels, client=docker_client))
    result = run(check_launch_target, ctx)
    assert result.verdict is Verdict.warn and f"container {name} does not exist" in result.found
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(name)


# ---- image integrity assertions -----------------------------------------------------------------------------


def test_image_assertions(box: Box, docker_client: Any, docker_test_labels: dict[str, str]) -> None:
    rule = {"path": MXFP4, "pattern": "empty_cache", "count": 2}
    ctx = exec_context(box, docker_client, docker_test_labels, preflight={"assert": [rule]})
    result = run(check_image, ctx)
    assert result.verdict is Verdict.ok and result.found == f"1 assertion(s) hold in container {box.name}"

    put(box.container, MXFP4, PATCHED_TWICE)  # someone re-applies the mod inside the container
    try:
        result = run(check_image, ctx)
    finally:
        put(box.container, MXFP4, PATCHED_ONCE)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert f"{MXFP4} has 3 line(s) matching 'empty_cache' in container {box.name}, expected 2" in result.found

    missing = {"path": "/opt/vllm/not-there.py", "pattern": "x", "count": 1}
    result = run(check_image, exec_context(box, docker_client, docker_test_labels, preflight={"assert": [missing]}))
    assert result.verdict is Verdict.fail and "/opt/vllm/not-there.py does not exist in container" in result.found


def test_docker_run_checks_in_a_short_lived_container(box: Box, docker_client: Any, test_image: str,
                                                      docker_test_labels: dict[str, str]) -> None:
    """docker-run: no container exists before the launch; the checks run in one of the image with the mounts."""
    checkers = {"label": ["sparkd.check=1", "sparkd.node=pftest"]}
    data: dict[str, Any] = {
        "runtime": "docker-run", "node": {"name": "pftest"},
        "container": {"image": test_image, "name": f"sparkd-pftest-run-{uuid.uuid4().hex[:8]}", "mounts": [
            {"source": "/usr", "target": "/usr", "read_only": True},
            {"source": str(box.models), "target": "/models/m", "read_only": True}]},
        "launch": {"executable": "/usr/bin/true", "model": "/models/m"},
        "preflight": {"assert": [{"path": "/models/m/config.json", "pattern": "^[{]", "count": 1}]},
    }
    cfg = config_from_mapping(data, env={})
    runtime = DockerRunRuntime(cfg, client=docker_client, labels=docker_test_labels)
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=runtime)
    target = run(check_launch_target, ctx)
    assert target.verdict is Verdict.ok and f"in image {test_image}" in target.found, target
    assert run(check_image, ctx).verdict is Verdict.ok
    (box.models / "model-00002-of-00002.safetensors").rename(box.models / "moved.bin")
    try:
        target = run(check_launch_target, ctx)
    finally:
        (box.models / "moved.bin").rename(box.models / "model-00002-of-00002.safetensors")
    assert target.verdict is Verdict.fail and "model-00002-of-00002.safetensors" in target.found
    assert docker_client.containers.list(all=True, filters=checkers) == []  # each removed after its check
