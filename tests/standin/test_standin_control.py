"""The control file (CONTROL_FILE): stall, hang or leak a rank that is already serving, and only that one — a
command written before a launch is never that launch's. Real processes; each test cleans up what it started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins, http, serving, wait_until

from sparkd_standin.control import Command, ControlFile, parse

MIB = 1 << 20


@pytest.mark.parametrize(("text", "command"), [
    ("7 stall\n", Command("7", "stall")),
    ("x1 hang\n", Command("x1", "hang")),
    ("3 leak 300 150\n", Command("3", "leak", 300.0, 150.0)),
    ("7 stall", None),  # a partial write: no newline yet
    ("3 leak 300\n", None),
    ("3 leak 0 150\n", None),
    ("3 leak fast 150\n", None),
    ("7 stall now\n", None),
    ("7 explode\n", None),
    ("8 answers garble\n", Command("8", "answers", value="garble")),
    ("8 answers purple\n", None),
    ("9 spec off\n", Command("9", "spec", value="off")),
    ("9 nans on\n", Command("9", "nans", value="on")),
    ("9 spec\n", None),
    ("stall\n", None),
    ("", None),
])
def test_parse(text: str, command: Command | None) -> None:
    assert parse(text) == command


def write(path: Path, text: str) -> None:
    """As the soak writes it: whole, by rename."""
    part = path.with_suffix(".part")
    part.write_text(text)
    os.replace(part, path)


def test_a_process_acts_on_each_new_command_once_and_never_on_what_was_there_at_its_start(tmp_path: Path) -> None:
    path = tmp_path / "control"
    write(path, "1 hang\n")
    control = ControlFile(str(path))
    assert control.poll() is None
    write(path, "2 stall\n")
    assert control.poll() == Command("2", "stall")
    assert control.poll() is None
    write(path, "3 stall\n")
    assert control.poll() == Command("3", "stall")
    assert ControlFile(str(tmp_path / "absent")).poll() is None


def _head(launch: Standins, port: int, control: Path) -> Standin:
    env = {"SPARKD_STANDIN_CONTROL_FILE": str(control)}
    return launch.start("m", "--host", "127.0.0.1", "--port", str(port), "-tp", "2", env=env)


def test_hang_at_run_time_and_the_next_launch_does_not_repeat_it(launch: Standins, tmp_path: Path) -> None:
    control = tmp_path / "control"
    port = free_port()
    first = _head(launch, port, control)
    serving(first, port)
    assert http("127.0.0.1", port).get("/health").status_code == 200
    write(control, "1 hang\n")
    wait_until(lambda: _no_answer(port), timeout=10)
    first.send(signal.SIGTERM)
    assert first.wait_exit(30) == 0
    second = _head(launch, port, control)  # the command is still in the file
    serving(second, port)
    time.sleep(1.0)  # several polls
    assert http("127.0.0.1", port).get("/health").status_code == 200


def _no_answer(port: int) -> bool:
    try:
        http("127.0.0.1", port, 1.0).get("/health")
    except httpx.ReadTimeout:
        return True
    return False


def test_stall_at_run_time_wedges_the_engine_while_health_stays_200(launch: Standins, tmp_path: Path) -> None:
    control = tmp_path / "control"
    port = free_port()
    standin = _head(launch, port, control)
    serving(standin, port)
    body = {"prompt": "hi", "max_tokens": 2}
    assert http("127.0.0.1", port, 10).post("/v1/completions", json=body).status_code == 200
    write(control, "1 stall\n")
    time.sleep(1.0)
    with pytest.raises(httpx.ReadTimeout):
        http("127.0.0.1", port, 3.0).post("/v1/completions", json=body)
    assert http("127.0.0.1", port).get("/health").status_code == 200


def test_leak_at_run_time_grows_each_worker_up_to_its_cap(launch: Standins, tmp_path: Path) -> None:
    control = tmp_path / "control"
    standin = _head(launch, free_port(), control)
    standin.wait_ready()
    worker = standin.titled()[f"{standin.title_prefix}::Worker_TP0"]
    before = worker.memory_info().rss
    time.sleep(1.0)
    assert worker.memory_info().rss < before + 50 * MIB, "no leak before the command"
    write(control, "1 leak 300 150\n")
    wait_until(lambda: worker.memory_info().rss > before + 140 * MIB, timeout=15)
    time.sleep(0.5)
    assert worker.memory_info().rss < before + 250 * MIB  # capped
