"""``python -m sparkd.standin serve MODEL [flags]`` / ``sparkd-standin`` / ``sparkd standin``.

Kept light: spawned children import this module as ``__mp_main__``, so the server is imported lazily.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

VLLM_USAGE = "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ..."
SUBCOMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")


def _top_level_error(message: str) -> int:
    sys.stderr.write(f"{VLLM_USAGE}\nvllm: error: {message}\n")
    return 2


def _record_argv(path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(sys.argv))


def _serve(argv: list[str]) -> int:
    from sparkd.standin.args import USAGE, parse_serve_args
    from sparkd.standin.knobs import KnobError, load_knobs

    try:
        config, knob_flags = parse_serve_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the error
        return exc.code if isinstance(exc.code, int) else 2
    try:
        knobs = load_knobs(os.environ, knob_flags)
    except KnobError as exc:
        sys.stderr.write(f"usage: {USAGE}\nvllm serve: error: {exc}\n")
        return 2
    config = dataclasses.replace(config, derived_max_model_len=knobs.max_position_embeddings)
    if knobs.argv_file and knob_flags.get("argv_file"):
        _record_argv(knobs.argv_file)
    if config.headless:
        from sparkd.standin.headless import run_headless

        return run_headless(config, knobs)
    from sparkd.standin.server import run_api_server

    return run_api_server(config, knobs)


def main(argv: list[str] | None = None) -> int:
    """Run the stand-in like ``vllm``; returns the exit status (SIGTERM while loading re-raises SIGINT)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get("SPARKD_STANDIN_ARGV_FILE"):  # first thing: even a rejected command line is recorded
        _record_argv(os.environ["SPARKD_STANDIN_ARGV_FILE"])
    if not args:
        return _top_level_error("the following arguments are required: subparser")
    if args[0] in ("-v", "--version"):
        from sparkd.standin.knobs import load_knobs

        print(load_knobs(os.environ).version)
        return 0
    if args[0] != "serve":
        choices = ", ".join(f"'{name}'" for name in SUBCOMMANDS)
        return _top_level_error(f"argument subparser: invalid choice: '{args[0]}' (choose from {choices})")
    return _serve(args[1:])


if __name__ == "__main__":
    sys.exit(main())
