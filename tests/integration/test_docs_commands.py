"""Every command the README and docs show runs as written.

Shell blocks in README.md and docs/*.md (docs/design.md aside) say where they run, in the fence's info
string (GitHub shows only the first word):

- ```` ```sh doc-test=host ````: on this host, from the repository root, with the venv's commands on PATH;
- ```` ```sh doc-test=node ````: as root on a node installed the way the package lays it out (/etc/sparkd,
  /usr/bin/sparkd, the unit running sparkd with the vLLM stand-in), i.e. the systemd container;
- ```` ```sh doc-test=manual ````: not runnable here; the block's first line says why and which test covers it.

Each line is one command (``\\`` continues it) and must exit 0, or the status its ``# [exit N]`` comment names.
A shell block without a marker fails the suite. `make run` and its curl run here too, in namespaces of their
own (a private PID, network and /dev/shm), so the demo daemon sees nothing of the host.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from systemd_infra import systemd_infra

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "design.md")]
SHELLS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
EXIT = re.compile(r"#\s*\[exit (\d+)\]")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    mode: str | None
    body: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[tuple[str, int]]:
        """(command, expected exit status) per line; comments-only lines skipped."""
        out: list[tuple[str, int]] = []
        pending = ""
        for raw in self.body.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            if not line or line.startswith("#"):
                continue
            expected = EXIT.search(line)
            out.append((line, int(expected.group(1)) if expected else 0))
        return out


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            words = m.group("info").split()
            language = words[0] if words else ""
            mode = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("doc-test=")), None)
            body = "\n".join(line[len(m.group("indent")):] for line in m.group("body").splitlines())
            found.append(Block(path, text[: m.start()].count("\n") + 1, language, mode, body))
    return found


SHELL_BLOCKS = [b for b in blocks() if b.language in SHELLS]


def of(mode: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in SHELL_BLOCKS if b.mode == mode]


def test_every_shell_block_says_where_it_runs() -> None:
    assert len(SHELL_BLOCKS) >= 10
    for block in SHELL_BLOCKS:
        assert block.mode in ("host", "node", "manual"), f"{block.id}: mark it doc-test=host|node|manual"
        if block.mode == "manual":
            first = block.body.strip().splitlines()[0]
            assert first.startswith("# not run by the suite"), f"{block.id}: a manual block says why, first"


def run_lines(block: Block, run: Any) -> None:
    for command, expected in block.commands():
        code, out = run(command)
        assert code == expected, f"{block.id}: `{command}` exited {code}, not {expected}:\n{out[-3000:]}"


@pytest.mark.parametrize("block", of("host"))
def test_host_blocks_run_as_written(block: Block, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "HOME": str(tmp_path)}

    def run(command: str) -> tuple[int, str]:
        proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout + proc.stderr

    run_lines(block, run)


# ---- on a node laid out like the package's, with the unit running: the systemd container


NODE_CONFIG = f"""\
runtime = "process"
[node]
name = "docs"
role = "single"
[launch]
executable = "{VENV_BIN / "sparkd-standin"}"
model = "deepseek-ai/DeepSeek-V4-Flash"
host = "127.0.0.1"
port = 8000
[launch.env]
SPARKD_STANDIN_STARTUP_SECONDS = "1"
[preflight]
skip = ["memory", "page_cache"]
[api]
token_file = "/etc/sparkd/peer.token"
[supervisor]
stop_grace_s = 10
[restart]
backoff_initial_s = 1
"""


@pytest.fixture(scope="module")
def node(docker_client: Any, docker_test_labels: dict[str, str]) -> Iterator[Any]:
    infra = systemd_infra()
    try:
        infra.ensure_image(docker_client)
    except Exception as exc:
        pytest.fail(f"could not build {infra.IMAGE}: {type(exc).__name__}: {exc}", pytrace=False)
    with infra.booted(docker_client, docker_test_labels, volumes=infra.python_mounts(REPO)) as n:
        n.sh(f"groupadd --system sparkd && ln -s {VENV_BIN / 'sparkd'} /usr/bin/sparkd"
             f" && ln -s {VENV_BIN / 'sparkctl'} /usr/bin/sparkctl")
        n.write("/lib/systemd/system/sparkd.service", (REPO / "systemd" / "sparkd.service").read_text())
        n.write("/etc/sparkd/sparkd.toml", NODE_CONFIG)
        n.write("/etc/sparkd/peer.token", "0123456789abcdef" * 4 + "\n", mode=0o600)
        n.sh("systemctl daemon-reload && systemctl start sparkd")
        yield n


def node_ready(node: Any) -> None:
    node.wait("sparkd ready", lambda: '"state": "ready"' in node.out("sparkctl --json status", check=False))


@pytest.mark.docker
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", of("node"))
def test_node_blocks_run_as_written(block: Block, node: Any) -> None:
    node_ready(node)

    def run(command: str) -> tuple[int, str]:
        code, out = node.sh(command, check=False, timeout=180)
        return int(code), str(out)

    run_lines(block, run)


# ---- `make run`, then the README's curl, in namespaces of their own


@pytest.mark.timeout(300)
def test_make_run_serves_the_standin_as_the_readme_says(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    assert "make run    #" in readme and "try `curl -s http://127.0.0.1:8000/v1/models`" in readme
    answer, log, status = tmp_path / "models.json", tmp_path / "run.log", tmp_path / "status.txt"
    # set -m: `make run` gets a process group of its own, where Ctrl-C (SIGINT) reaches make and sparkd.
    script = f"""set -m
mount -t tmpfs -o size=512m tmpfs /dev/shm
ip link set lo up
make run > {log} 2>&1 &
for i in $(seq 180); do
    if curl -s http://127.0.0.1:8000/v1/models > {answer}.part && test -s {answer}.part; then
        mv {answer}.part {answer}; break
    fi
    sleep 0.5
done
# vLLM answers a moment before sparkd's next /health probe calls it ready: ask until it says so (30 s at most).
for i in $(seq 60); do
    .venv/bin/sparkctl status > {status} 2>&1; rc=$?
    test $rc -eq 0 && break
    sleep 0.5
done
echo "exit $rc" >> {status}
kill -INT -- -$!
wait $!
"""
    # A private PID namespace (the demo's stale-process sweep sees only its own), network (port 8000 and
    # 9479 are its own) and mount namespace (its own /dev/shm for the segment sweep).
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount",
                             "--propagation", "private", "bash", "-c", script], cwd=REPO, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(200)
        shown = log.read_text(errors="replace") if log.exists() else ""
        assert answer.exists(), f"`make run` never served /v1/models:\n{shown[-3000:]}"
        assert '"id":"deepseek-v4-flash"' in answer.read_text().replace(" ", ""), answer.read_text()
        assert '"event": "stopped"' in shown, shown[-3000:]  # Ctrl-C stopped vLLM and sparkd
        # Plain `sparkctl status` in the checkout finds the demo's socket (issue 28), and `make run` says how.
        said = status.read_text()
        assert " on demo (single, process): ready since " in said and said.endswith("exit 0\n"), said
        assert "sparkctl status" in shown, shown[:3000]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.timeout(300)
def test_make_run_refuses_a_taken_port_naming_the_holder(tmp_path: Path) -> None:
    """`make run` on a box where another vLLM holds port 8000 (default titles, its launcher alive) refuses to
    start with one line naming the holder, and touches nothing (issue 23): the holder lives on."""
    readme = (REPO / "README.md").read_text()
    assert "when port 8000 is taken it refuses to start with\none line naming the holder" in readme
    log = tmp_path / "run.log"
    holder = (f"{VENV_BIN / 'python'} -c 'import setproctitle, socket, time; "
              "setproctitle.setproctitle(\"VLLM::Worker_TP0\"); s = socket.socket(); "
              "s.bind((\"127.0.0.1\", 8000)); s.listen(); print(\"ready\", flush=True); time.sleep(600)'")
    script = f"""ip link set lo up
coproc HOLDER {{ exec {holder}; }}
read -r line <&"${{HOLDER[0]}}"
make run > {log}.out 2> {log}.err
echo "exit $? holder $HOLDER_PID" > {log}
kill -0 $HOLDER_PID && echo "holder alive" >> {log}
kill $HOLDER_PID
"""
    # A private PID namespace (the holder's PID is the one make run names), network (port 8000 is its own) and
    # mount namespace (its own /dev/shm).
    proc = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount",
                           "--propagation", "private", "bash", "-c", script], cwd=REPO, start_new_session=True,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    shown = log.read_text() if log.exists() else proc.stderr
    words = shown.split()
    assert words[:2] == ["exit", "2"] and "holder alive" in shown, shown  # make's status for a failed recipe
    err = Path(f"{log}.err").read_text()
    ours = [line for line in err.splitlines() if not line.startswith("make")]
    assert ours == [f"not ready: Preflight ports failed: API port (launch.port) 8000 is held by PID {words[3]} "
                    "(VLLM::Worker_TP0): not a stale vLLM process (not a SPARKDEMO::* process of a launch of this "
                    "node), so sparkd leaves it alone; stop it or choose another port [port_in_use]"], err
    assert "sparkd run" not in Path(f"{log}.out").read_text()  # the daemon never started
