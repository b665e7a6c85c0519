"""The launch's program as sparkd finds it: on the search path in order, a file it may execute, for sparkd's
effective user and capabilities (a user's demo run with CAP_DAC_READ_SEARCH from a checkout under a 0700 folder
starts its program; ``shutil.which`` would have called it unreachable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.launch.program import executable, which

NOBODY = 65534


def program(folder: Path, name: str = "prog", mode: int = 0o755) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_the_first_executable_file_on_the_search_path_is_found(tmp_path: Path) -> None:
    program(tmp_path / "a", mode=0o644)                 # not executable: passed over
    (tmp_path / "b" / "prog").mkdir(parents=True)       # a folder: passed over
    found = program(tmp_path / "c")
    program(tmp_path / "d")                             # later on the path: not chosen
    search = os.pathsep.join(str(tmp_path / x) for x in "abcd")
    assert which("prog", search) == str(found)
    assert which("prog", str(tmp_path / "a")) is None
    assert not executable(tmp_path / "b" / "prog") and executable(found)


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another user: needs root")
def test_a_program_behind_a_private_folder_is_found_with_the_capability_that_reaches_it(tmp_path: Path) -> None:
    private = tmp_path / "private"
    found = program(private / "bin")
    private.chmod(0o700)
    os.chmod(tmp_path, 0o755)
    code = ("import shutil, sys; from sparkd.launch.program import which;"
            f"print(which('prog', {str(found.parent)!r}), shutil.which('prog', path={str(found.parent)!r}))")
    argv = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
            "--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search", sys.executable, "-c", code]
    said = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert said == [str(found), "None"]  # the real user's check (shutil.which) cannot see it
