"""Manual pages generated from the click commands (sparkd/cli/manpages.py, run by packaging/build-deb.sh): one
page per subcommand of both programs, each with an EXIT STATUS that is the one its --help shows, and that
man(1) renders."""

from __future__ import annotations

import shutil
import subprocess

import click
import pytest

from sparkd.cli.manpages import pages
from sparkd.cli.sparkctl import main as sparkctl
from sparkd.cli.sparkd import main as sparkd

PAGES = pages("2026-01-01", "9.9")


@pytest.mark.parametrize(("prog", "group"), [("sparkd", sparkd), ("sparkctl", sparkctl)])
def test_a_page_per_subcommand_with_its_exit_status(prog: str, group: click.Group) -> None:
    ctx = click.Context(group)
    subcommands = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}  # sparkctl's are built
    subcommands = {name: sub for name, sub in subcommands.items() if sub is not None}  # when named (the registry)
    assert len(subcommands) >= 7
    for name, sub in subcommands.items():
        text = PAGES[f"{prog}-{name}.8"]
        status = text.split(".SH EXIT STATUS\n", 1)[1].split("\n.SH", 1)[0]
        assert status.strip() and ".TH " + f"{prog}-{name}".upper() in text, (name, text)
        epilog = sub.epilog or ""
        if epilog.startswith("Exit status:"):
            assert status.strip() == epilog.removeprefix("Exit status:").strip()


def test_reload_says_the_exit_status_it_has() -> None:
    status = PAGES["sparkctl-reload.8"].split(".SH EXIT STATUS\n", 1)[1]
    assert status.startswith("0 the config on disk is valid and taken on; 1 it is invalid")
    assert "124 --wait ran out of time" in PAGES["sparkctl-restart.8"]


@pytest.mark.skipif(shutil.which("man") is None, reason="no man(1) here")
def test_man_renders_a_page(tmp_path: object) -> None:
    out = subprocess.run(["man", "-l", "-"], input=PAGES["sparkctl-status.8"], capture_output=True, text=True,
                         env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 0 and "EXIT STATUS" in out.stdout and "sparkctl status [OPTIONS]" in out.stdout
