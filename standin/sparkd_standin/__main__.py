"""``sparkd-standin serve MODEL [flags]`` / ``python -m sparkd_standin ...`` / ``sparkd standin ...``: ``vllm``.

Kept light: spawned children import this module as ``__mp_main__``, so the server is imported lazily.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def _record_argv(path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(sys.argv))


def main(argv: list[str] | None = None) -> int:
    """Run the stand-in like ``vllm``; returns the exit status (SIGTERM while loading re-raises SIGINT)."""
    from sparkd_standin.args import parse_command, requested_family
    from sparkd_standin.knobs import KnobError, Knobs, load_knobs
    from sparkd_standin.logfmt import FORK_PREFIX_ENV

    args = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get("SPARKD_STANDIN_ARGV_FILE"):  # first thing: even a rejected command line is recorded
        _record_argv(os.environ["SPARKD_STANDIN_ARGV_FILE"])
    os.environ.pop(FORK_PREFIX_ENV, None)  # a top-level process inherits no log prefix
    family, version = requested_family(args, os.environ, Knobs.vllm_version)
    try:
        command = parse_command(args, family, version)
    except SystemExit as exc:  # argparse printed the usage error (2), the help or the version (0)
        return exc.code if isinstance(exc.code, int) else 2
    if command.subcommand is None:
        return 0  # the help was printed, as vLLM does for a bare ``vllm``
    if command.config is None:
        sys.stderr.write(f"sparkd-standin: `vllm {command.subcommand}` is not imitated; only `vllm serve` is\n")
        return 2
    try:
        knobs = load_knobs(os.environ, command.knob_flags)
    except KnobError as exc:
        sys.stderr.write(f"usage: vllm serve [model_tag] [options]\nvllm serve: error: {exc}\n")
        return 2
    config = dataclasses.replace(command.config, derived_max_model_len=knobs.max_position_embeddings)
    if knobs.argv_file and command.knob_flags.get("argv_file"):
        _record_argv(knobs.argv_file)
    if config.headless:
        from sparkd_standin.headless import run_headless

        return run_headless(config, knobs)
    from sparkd_standin.server import run_api_server

    return run_api_server(config, knobs)


if __name__ == "__main__":
    sys.exit(main())
