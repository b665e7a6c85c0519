"""`sparkd explain`: the daemon's classifier on a log file or stdin, run as the README shows it — and bad input is
one line on stderr with exit 2, never a traceback. With `--config` it has the facts the daemon takes from the config,
so a pasted log gets the daemon's sentence; beside an incident's incident.json it says whether the classes agree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import tomli_w
from loop_harness import config_data, running

from sparkd.cli.explain import explain
from sparkd.config import config_from_mapping, load_config
from sparkd.launch.facts import config_context
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.marks import vllm_lines
from sparkd.testing import FakeClock, FakeRuntime

SPARKD = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparkd"
CORPUS = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"
FREE_MEMORY = CORPUS / "fr002-free-memory-crash-loop.log"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(SPARKD), "explain", *args], input=stdin, capture_output=True, timeout=60,
                          check=False)


def test_a_log_file_gives_class_sentence_and_evidence() -> None:
    proc = run(str(FREE_MEMORY), "--exit-code", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("class:    free_memory_refusal\n")
    assert "sentence: vLLM refused to start: only 30 of 119.67 GiB was free" in out
    assert "evidence: " in out and "(~30/119.67 GiB)" in out
    assert "runbook:  /runbook#free_memory_refusal on sparkd's HTTP port" in out


def test_json_and_stdin_give_the_same_answer() -> None:
    from_file = json.loads(run(str(FREE_MEMORY), "--json").stdout)
    from_stdin = json.loads(run("-", "--json", stdin=FREE_MEMORY.read_bytes()).stdout)
    assert from_file == from_stdin
    assert set(from_file) == {"class", "sentence", "evidence", "runbook"}
    assert from_file["class"] == "free_memory_refusal" and from_file["runbook"] == "/runbook#free_memory_refusal"


@pytest.mark.parametrize("sig", ["SIGKILL", "kill", "9"])
def test_a_signal_by_name_or_number(sig: str) -> None:
    answer = json.loads(run("-", "--signal", sig, "--json", stdin=b"INFO 07-01 12:00:00 [core.py:1] step\n").stdout)
    assert answer["class"] == "unknown"
    assert "killed by SIGKILL from outside sparkd" in answer["sentence"]


def test_bytes_that_are_not_utf8_are_read_not_fatal() -> None:
    proc = run("-", "--json", stdin=b"\xff\xfe torch.OutOfMemoryError: CUDA out of memory.\n")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["class"] == "oom"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("/nonexistent/vllm.log",), "cannot read the log '/nonexistent/vllm.log'", id="missing file"),
        pytest.param((str(CORPUS),), "cannot read the log", id="a directory"),
        pytest.param((str(FREE_MEMORY), "--signal", "SIGNOPE"), "--signal 'SIGNOPE' is not a signal name",
                     id="bad signal name"),
        pytest.param((str(FREE_MEMORY), "--signal", "99"), "--signal '99' is not a signal number", id="bad number"),
        pytest.param((str(FREE_MEMORY), "--exit-code", "300"), "--exit-code", id="exit code out of range"),
    ],
)
def test_bad_input_is_one_clear_line(args: tuple[str, ...], says: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert says in err and "Traceback" not in err, err


API_PORT = 18999  # loop_harness's [launch] port
BIND_ERROR = (f"ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', {API_PORT}): address "
              "already in use")


@pytest.mark.anyio
async def test_with_the_config_a_pasted_log_gets_the_daemons_sentence(tmp_path: Path) -> None:
    """The daemon names the API port from its config; the same vLLM lines pasted with --config say the same,
    without it only "port 18999". The incident's own tail says sparkd's verdict again, and that it agrees."""
    config_file = tmp_path / "sparkd.toml"
    config_file.write_text(tomli_w.dumps(config_data(tmp_path)))
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(load_config(config_file), runtime, clock) as node:
        await node.until_state("starting")
        runtime.say("INFO:     Started server process [11912]", BIND_ERROR)
        runtime.crash(1)
        await node.until(lambda: node.state != "starting")
        await node.settled()
    (folder,) = (tmp_path / "state" / "incidents").iterdir()
    record = json.loads((folder / "incident.json").read_text())
    assert record["class"] == "port_in_use" and f"The API port {API_PORT} was already in use" in record["message"]
    pasted = tmp_path / "pasted.log"  # what `docker logs` shows: vLLM's lines, none of sparkd's
    pasted.write_text("\n".join(vllm_lines((folder / "log-tail.txt").read_text().splitlines())) + "\n")

    told = json.loads(run(str(pasted), "--exit-code", "1", "--config", str(config_file), "--json").stdout)
    assert (told["class"], told["sentence"], told["evidence"]) == (record["class"], record["message"],
                                                                   record["evidence"])
    bare = json.loads(run(str(pasted), "--exit-code", "1", "--json").stdout)
    assert bare["class"] == "port_in_use" and bare["sentence"] != record["message"]
    assert f"Port {API_PORT} was already in use" in bare["sentence"] and "API port" not in bare["sentence"]

    again = run(str(folder / "log-tail.txt"), "--config", str(config_file))
    assert again.returncode == 0, again.stderr
    assert f"sentence: {record['message']}" in again.stdout.decode()
    assert "incident: agrees" in again.stdout.decode()


def test_a_class_other_than_the_incidents_is_said(tmp_path: Path) -> None:
    (tmp_path / "incident.json").write_text(json.dumps({"class": "oom", "message": "out of memory"}))
    (tmp_path / "log-tail.txt").write_text(BIND_ERROR + "\n")
    out = run(str(tmp_path / "log-tail.txt"), "--exit-code", "1").stdout.decode()
    assert out.startswith("class:    port_in_use\n")
    assert "incident: differs: incident.json beside the log has oom" in out
    answer = json.loads(run(str(tmp_path / "log-tail.txt"), "--json").stdout)
    assert answer["incident_class"] == "oom"


SCRIPT = "/workspace/vllm-head.sh"
MISSING_SCRIPT = [f"bash: {SCRIPT}: No such file or directory\n"]


def test_the_launch_target_and_a_groups_master_port_come_from_the_config(tmp_path: Path) -> None:
    cfg = config_from_mapping(config_data(tmp_path, launch={"script": SCRIPT}), source="test")
    told = explain(MISSING_SCRIPT, 1, None, config_context(cfg))
    assert told.cls is FailureClass.config_error and f"The launch target {SCRIPT} does not exist" in told.sentence
    assert explain(MISSING_SCRIPT, 1).cls is not FailureClass.config_error  # any path: not the launch's own

    token = tmp_path / "token"
    token.write_text("group-token-of-32-bytes-or-more-0123456789\n")
    head = config_from_mapping(config_data(
        tmp_path, node={"role": "head", "address": "10.9.0.1"}, launch={"tensor_parallel_size": 2},
        cluster={"master_addr": "10.9.0.1", "master_port": 29612, "nnodes": 2, "peers": ["10.9.0.2"]},
        api={"token_file": str(token)}), source="test")
    assert (config_context(head).master_port, config_context(head).api_port) == (29612, API_PORT)
    assert config_context(cfg).master_port is None  # a single node has no rendezvous
    busy = ["torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 29612, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n"]
    assert explain(busy, 1, None, config_context(head)).sentence.startswith("The torch.distributed master port 29612 ")
    assert explain(busy, 1).sentence.startswith("Port 29612 was already in use")


@pytest.mark.parametrize(("text", "says"), [
    pytest.param('[launch]\nmodel = "/m"\nport = "eighty"\n', "launch.port", id="a bad value"),
    pytest.param("[launch\n", "TOML syntax error", id="not TOML"),
])
def test_a_bad_config_is_a_clear_error(tmp_path: Path, text: str, says: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    for path in (bad, tmp_path / "missing.toml"):
        proc = run(str(FREE_MEMORY), "--config", str(path))
        err = proc.stderr.decode()
        assert proc.returncode == 2 and proc.stdout == b"", err
        assert f"sparkd explain: invalid config {path}:" in err and "Traceback" not in err, err
    assert says in run(str(FREE_MEMORY), "--config", str(bad)).stderr.decode()


def test_a_log_that_stops_without_an_error_or_an_exit_may_be_a_process_still_running() -> None:
    """No error in the log and no --exit-code nor --signal: the process may still run, stuck where the log stops
    (held-out logs that stop during a start, labelled hang from their threads); given how it ended, it went away."""
    stops = ["INFO 08-12 20:26:03 [parallel_state.py:1] world_size=2 rank=0",
             "(Worker pid=960) INFO 08-12 20:26:09 [pynccl.py:113] vLLM is using nccl==2.28.9"]
    unknown = explain(stops)
    assert unknown.cls is FailureClass.unknown
    assert unknown.sentence.startswith("The log stops without an error at `INFO 08-12 20:26:09 [pynccl.py:113]")
    assert "still runs, it is stuck there" in unknown.sentence and "--exit-code" in unknown.sentence
    ended = explain(stops, exit_code=1)
    assert "stuck" not in ended.sentence and "exit 1" in ended.sentence
    erred = explain([*stops, "ERROR 08-12 20:27:00 [core.py:1] something broke"])
    assert "stuck" not in erred.sentence, "a log with an error says that error"
