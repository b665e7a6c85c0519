"""``sparkctl``: the operator's command line for a running sparkd."""

from __future__ import annotations

import click

from sparkd import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
def main() -> None:
    """Drive the sparkd daemon on this node: status, start, stop, restart, reset, logs."""
