"""Manual pages generated from the click commands themselves (the package's build runs this): ``sparkd(8)``,
``sparkctl(8)`` and one page per subcommand (``sparkctl-status(8)``, ``sparkd-check-config(8)``, ...) with NAME,
SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS (each subcommand's ``Exit status:`` epilog, the one ``--help``
shows), FILES and SEE ALSO.

    python -m sparkd.cli.manpages OUTDIR [--date YYYY-MM-DD] [--version V]
"""

from __future__ import annotations

import argparse
import gzip
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from sparkd import __version__

__all__ = ["pages"]

SECTION = "8"
FILES = "/etc/sparkd/sparkd.toml, /var/lib/sparkd/, /run/sparkd/sparkd.sock, /var/log/sparkd/vllm.log"
GROUP_EXIT = {"sparkd": "0 success; 1 failure; 2 an invalid config (the problem named); 3 a host problem (a port "
                        "taken, a directory not writable); 4 another sparkd runs on this node.",
              "sparkctl": "As each subcommand's page says; 4 always means the daemon is unreachable."}


def _escape(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _exit_status(command: click.Command, name: str) -> str:
    epilog = (command.epilog or "").strip()
    if epilog.startswith("Exit status:"):
        return epilog.removeprefix("Exit status:").strip()
    return GROUP_EXIT.get(name, "0 success; non-zero a failure, the reason printed.")


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    out = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        flags, text = record
        out += [".TP", f"\\fB{_escape(flags)}\\fR", _escape(text or "")]
    return out


def page(prog: str, name: str, command: click.Command, parent: click.Context | None, date: str,
         version: str) -> str:
    ctx = click.Context(command, info_name=name.replace("-", " ", 1) if parent else name, parent=parent)
    summary = command.get_short_help_str(limit=120).rstrip(".")
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f'.TH {name.upper()} {SECTION} "{date}" "sparkd {version}" "sparkd"', ".SH NAME",
             f"{name} \\- {_escape(summary)}", ".SH SYNOPSIS", f"\\fB{prog}\\fR {_escape(usage)}",
             ".SH DESCRIPTION", _escape((command.help or "").strip())]
    if isinstance(command, click.Group):
        lines += [".SH COMMANDS"]
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None:
                lines += [".TP", f"\\fB{sub_name}\\fR",
                          _escape(sub.get_short_help_str(limit=120)) + f" See \\fB{name}-{sub_name}\\fR(8)."]
    options = _options(command, ctx)
    if options:
        lines += [".SH OPTIONS", *options]
    lines += [".SH EXIT STATUS", _escape(_exit_status(command, name)), ".SH FILES", FILES, ".SH SEE ALSO"]
    root = name.split("-", 1)[0]
    lines.append(f"\\fB{root}\\fR(8), /usr/share/doc/sparkd/README.md, /usr/share/doc/sparkd/runbook.md")
    return "\n".join(lines) + "\n"


def pages(date: str, version: str = __version__) -> dict[str, str]:
    """``{file name: page text}`` for both programs and every subcommand."""
    from sparkd.cli.sparkctl import main as sparkctl
    from sparkd.cli.sparkd import main as sparkd

    out = {}
    for prog, group in (("sparkd", sparkd), ("sparkctl", sparkctl)):
        out[f"{prog}.{SECTION}"] = page(prog, prog, group, None, date, version)
        ctx = click.Context(group, info_name=prog)
        for sub_name in group.list_commands(ctx):
            sub = group.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                name = f"{prog}-{sub_name}"
                out[f"{name}.{SECTION}"] = page(f"{prog} {sub_name}", name, sub, ctx, date, version)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write sparkd's manual pages (gzipped) into OUTDIR.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--date", default=datetime.now(UTC).strftime("%Y-%m-%d"))
    parser.add_argument("--version", default=__version__)
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    for file_name, text in pages(args.date, args.version).items():
        (args.outdir / f"{file_name}.gz").write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
