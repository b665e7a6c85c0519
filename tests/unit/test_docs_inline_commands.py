"""The commands the README and docs name in running prose (inline code, outside the code blocks that
test_docs_commands.py runs): each is a real `sparkd`/`sparkctl` subcommand, given only options it has, or a target
the Makefile has, so the prose cannot drift from the CLI. Synopsis notation is allowed: `[--json]`, placeholders
such as FILE or N, `...`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from sparkd.cli import sparkctl, sparkd

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"`((?:sparkctl|sparkd) [^`\n]*)`")
MAKE = re.compile(r"`(?:[A-Z_]+=\S+ )*make (?P<target>[\w-]+)[^`\n]*`")
PROGRAMS: dict[str, click.Command] = {"sparkd": sparkd.main, "sparkctl": sparkctl.main}


def prose(doc: Path) -> str:
    return FENCE.sub("", doc.read_text())


def inline_commands() -> list[tuple[str, str]]:
    return sorted({(doc.name, m.group(1)) for doc in DOCS for m in INLINE.finditer(prose(doc))})


def make_targets() -> list[tuple[str, str]]:
    return sorted({(doc.name, m.group("target")) for doc in DOCS for m in MAKE.finditer(prose(doc))})


def options_of(command: click.Command) -> set[str]:
    return {name for p in command.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def problems(text: str) -> list[str]:
    """What in one inline command the CLI does not have."""
    words = shlex.split(re.split(r"\s[>|]\s", text)[0].replace("[", " ").replace("]", " "))
    command, wrong = PROGRAMS[words[0]], []
    allowed = options_of(command) | {"-h", "--help"}
    for word in words[1:]:
        if word.startswith("-"):
            if word.split("=", 1)[0] not in allowed:
                wrong.append(f"{word} is no option of {command.name}")
        elif isinstance(command, click.Group):  # a group's word is its subcommand (`sparkd weights verify`)
            sub = command.get_command(click.Context(command), word)
            if sub is None:
                return [*wrong, f"{word!r} is no subcommand of {command.name}"]
            command = sub
            allowed |= options_of(sub)
    if isinstance(command, click.Group):
        wrong.append("no subcommand named")
    return wrong


@pytest.mark.parametrize(("doc", "text"), inline_commands())
def test_an_inline_command_is_one_the_cli_has(doc: str, text: str) -> None:
    assert problems(text) == [], f"{doc}: `{text}`"


@pytest.mark.parametrize(("doc", "target"), make_targets())
def test_an_inline_make_command_is_a_target(doc: str, target: str) -> None:
    assert re.search(rf"^{re.escape(target)}:", (REPO / "Makefile").read_text(), re.M), f"{doc}: `make {target}`"


def test_the_check_sees_the_commands_and_catches_drift() -> None:
    assert {t for _, t in make_targets()} >= {"run", "test", "soak", "bench"}
    assert len(inline_commands()) >= 30  # the README's command table alone names more
    assert problems("sparkctl [--json] status") == []
    assert problems("sparkd explain LOGFILE [--exit-code N] [--signal SIG] [--json]") == []
    assert problems("sparkctl restart --soon") == ["--soon is no option of restart"]
    assert problems("sparkd check --config FILE") == ["'check' is no subcommand of main"]
    assert problems("sparkd --config FILE") == ["--config is no option of main", "'FILE' is no subcommand of main"]
    assert problems("sparkctl --json") == ["no subcommand named"]
    assert problems("sparkd weights verify --config FILE [--full]") == []
    assert problems("sparkd weights --config FILE") == ["--config is no option of weights", "'FILE' is no subcommand "
                                                        "of weights"]
