"""Run inside the real vLLM's virtualenv: parse many ``serve`` argvs with vLLM's own command line (as the vllm_args
preflight check does, one process for all), or list the options of ``vllm serve``. Prints JSON.

    python batch_parse.py parse < [[argv...], ...]   ->  [{"code": int, "stderr": str}, ...]
    python batch_parse.py options                    ->  {"--flag": "ActionClassName", ...}

vLLM logs to stdout as it imports: the JSON is the last line.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm import platforms

if platforms.current_platform.is_unspecified():  # no GPU here: parse as `vllm bench` does
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()

from vllm.entrypoints.cli import main as cli
from vllm.entrypoints.cli import serve

serve.ServeSubcommand.cmd = staticmethod(lambda args: None)


def parse(argv: list[str]) -> dict[str, object]:
    err = io.StringIO()
    code = 0
    sys.argv = ["vllm", *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # validate() raises TypeError/ValueError: vLLM's own refusal
            print(f"{type(exc).__name__}: {exc}", file=err)
            code = 1
    return {"code": code, "stderr": err.getvalue()}


def options() -> dict[str, str]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    sub = parser.add_subparsers(dest="subparser")
    serve_parser = next(cmd.subparser_init(sub) for cmd in serve.cmd_init() if cmd.name == "serve")
    return {name: type(action).__name__ for name, action in serve_parser._option_string_actions.items()}


if __name__ == "__main__":
    if sys.argv[1] == "parse":
        print(json.dumps([parse(argv) for argv in json.load(sys.stdin)]))
    else:
        print(json.dumps(options()))
