"""Security review §5, never attacked until review 2 (#37): code inside vLLM's container swaps the log sparkd reads
from the host (`/proc/<init>/root/tmp/sparkd-vllm.log`, docker-exec) for a symlink to a host file. A plain open()
resolves that link against the host's root — the test shows it does, here — and root would read the file into
`sparkctl logs`; sparkd opens the log inside the container's root (sparkd/runtime/inroot.py) and reads nothing of
the host, by an absolute link or a relative one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from docker_runtime_support import TIMEOUT, DockerPlace, run_to_end, sh
from test_runtime_docker_exec import setup  # noqa: F401 (the fixture: a docker-exec place of this test's own)

from sparkd.runtime.docker_exec import LOG_IN_CONTAINER

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
SECRET = "HOST-ONLY-SECRET-4242"


@pytest.fixture
def host_only() -> Iterator[Path]:
    """A folder on the host that no mount brings into the container (the test's tmp_path is mounted)."""
    folder = Path(tempfile.mkdtemp(prefix="sparkd-hostonly-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_log_linked_out_of_the_container_reads_nothing_of_the_host(
        setup: DockerPlace, host_only: Path) -> None:  # noqa: F811 (the fixture, imported)
    secret = host_only / "host-secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    log = LOG_IN_CONTAINER
    script = (f"echo one; rm -f {log}; ln -s {secret} {log}; sleep 2; "
              f"ln -sfn ../../../../../../../..{secret} {log}.new && mv -T {log}.new {log}; sleep 2; echo done")
    runtime = setup.runtime()
    instance = await runtime.launch(sh(script))
    host_path = Path(instance.log_path)
    with anyio.fail_after(TIMEOUT):
        while not host_path.is_symlink():
            await anyio.sleep(0.05)
    assert os.readlink(host_path) == str(secret)
    assert SECRET in host_path.read_text()  # the attack is real: a plain open() reads the host's file
    code, lines = await run_to_end(runtime, instance)
    assert code == 0
    assert not any(SECRET in line for line in lines), lines
