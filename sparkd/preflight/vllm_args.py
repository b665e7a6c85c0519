"""Check: the vLLM that will serve accepts the rendered argv, seconds before a cold start rather than after it.

Where vLLM runs (in its container, or on the host), the interpreter of the launch's executable (its ``#!`` line,
else ``python3``) imports vLLM's own command line and parses ``serve MODEL FLAGS...`` exactly as ``vllm serve``
does, with the serve command replaced by nothing: no engine starts, no weights load. An unknown flag, a bad
choice or malformed JSON fails with vLLM's own message (class ``config_error``); a vLLM that cannot even start — a
package that does not import, a shared library or package metadata missing — fails as an ``image_error`` naming the
module or library (the classifier's image family reads vLLM's traceback). Where no GPU is visible (a
docker-run check container has none) vLLM's CPU platform stands in for the parse, as ``vllm bench`` does.

Not checked (ok or warn, never a failure): a ``[launch] script`` (sparkd renders no argv there), a launch that is
not ``EXECUTABLE serve``, an interpreter that cannot import vLLM (the stand-in), a parse that ran out of time.
Results are cached in ``<state_dir>/vllm-args.json`` by the image id and a hash of the argv and environment (on
the host, by the executable's path, size and mtime instead of an image id): a repeated preflight costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from typing import Any

from sparkd.launch.render import LaunchSpec
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.runtime.base import ExecResult, TargetUnavailable
from sparkd.state.files import read_json, write_json
from sparkd.supervisor.failures import FailureClass

NOT_IMPORTABLE = 90  # the interpreter has no vLLM (or not this command-line layout)
NOT_ON_PATH = 91
BROKEN = 92  # vLLM is there but does not import: the launch would die the same way
CACHE_KEEP = 64
OUTPUT_KEEP = 16_000  # characters of a failed parse's output kept (the incident's log tail shows them)

# Runs vLLM's CLI main() with the serve subcommand's action replaced; prints vLLM's version on success.
PARSE_SNIPPET = '''
import sys, traceback
try:
    import vllm
    from vllm import platforms
    from vllm.entrypoints.cli import main as cli, serve
except ImportError as exc:
    if (getattr(exc, "name", "") or "vllm").startswith("vllm"):
        print(f"cannot import vLLM's command line with {sys.executable}: {exc}", file=sys.stderr)
        sys.exit(90)
    traceback.print_exc()
    sys.exit(92)
except Exception:
    traceback.print_exc()
    sys.exit(92)
if platforms.current_platform.is_unspecified():
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()
serve.ServeSubcommand.cmd = staticmethod(lambda args: None)
sys.argv = ["vllm", *sys.argv[1:]]
cli.main()
print("vllm", getattr(vllm, "__version__", "?"))
'''
# $1: the launch's executable; the rest: its arguments. Finds the interpreter, then parses.
RESOLVE_SCRIPT = r'''
exe=$(command -v -- "$1") || { echo "$1 is not on PATH" >&2; exit 91; }
shift
py=python3
IFS= read -r first < "$exe" 2>/dev/null || first=
case $first in
  '#!'*python*) set -f; set -- ${first#??} -- "$@"; set +f
                while [ "$1" != -- ]; do case $1 in */env|-*) ;; *) py=$1;; esac; shift; done; shift;;
esac
exec "$py" -c "$SPARKD_PARSE_SNIPPET" "$@"
'''
IDENTITY_SCRIPT = 'p=$(command -v -- "$1") && stat -Lc "%n %s %Y" "$p"'


def parse_command(spec: LaunchSpec) -> list[str]:
    return ["sh", "-c", RESOLVE_SCRIPT, "sparkd-vllm-args", *spec.argv]


def vllm_message(stderr: str) -> str:
    """vLLM's own words from a failed parse: argparse's ``error:`` line on, else the last line."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if re.match(r"^(vllm( serve)?|usage)?.*\berror:", line) and not line.startswith("usage:"):
            return " ".join(lines[i:i + 4])
    return lines[-1] if lines else "(no message)"


def judge(result: ExecResult, where: str) -> tuple[Verdict, str, FailureClass | None]:
    """Pure: what a parse's exit status and output mean. A vLLM that cannot even start (a package that does not
    import, a library or package metadata missing: the classifier's image family) is an image error, not a rejected
    argv; only argparse's own complaint or vLLM's config check is the argv's fault."""
    if result.exit_code == 0:
        version = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "vLLM"
        return Verdict.ok, f"{version} accepts the rendered argv {where}", None
    if result.exit_code in (NOT_IMPORTABLE, NOT_ON_PATH, 126, 127):
        return Verdict.warn, f"argv not checked {where}: {vllm_message(result.stderr)}", None
    if result.exit_code == 124:
        return Verdict.warn, f"argv not checked {where}: vLLM took too long to parse it", None
    from sparkd.supervisor.classify import classify  # the classifier's tables load only for a refusal

    failure = classify(None, None, result.stderr.splitlines())
    if failure.cls is FailureClass.image_error or result.exit_code == BROKEN:
        what = (failure.sentence.removeprefix("vLLM cannot start: ") if failure.cls is FailureClass.image_error
                else vllm_message(result.stderr))
        return Verdict.fail, f"vLLM cannot start {where}: {what}", FailureClass.image_error
    return (Verdict.fail, f"vLLM rejects the rendered argv {where}: {vllm_message(result.stderr)}",
            FailureClass.config_error)


def cache_key(identity: str, spec: LaunchSpec) -> str:
    payload = json.dumps([identity, list(spec.argv), sorted(spec.env.items())])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


async def launch_identity(ctx: PreflightContext) -> str | None:
    """What the parse depends on besides the argv: the image id, or on the host the executable itself."""
    if ctx.image is not None:
        return ctx.image.id
    try:
        result = await ctx.runtime.exec(["sh", "-c", IDENTITY_SCRIPT, "sparkd-id", ctx.spec.argv[0]],
                                        env=ctx.spec.env)
    except TargetUnavailable:
        return None
    return f"exe:{result.stdout.strip()}" if result.exit_code == 0 and result.stdout.strip() else None


def _cached(ctx: PreflightContext, key: str) -> dict[str, Any] | None:
    entry = (read_json(ctx.cfg.paths.state_dir / "vllm-args.json") or {}).get(key)
    return entry if isinstance(entry, dict) and entry.get("verdict") in ("ok", "fail") else None


def _cached_class(hit: dict[str, Any]) -> FailureClass | None:
    if hit["verdict"] != "fail":
        return None
    try:
        return FailureClass(hit.get("class") or FailureClass.config_error)
    except ValueError:
        return FailureClass.config_error


def _remember(ctx: PreflightContext, key: str, verdict: Verdict, found: str, cls: FailureClass | None,
              output: str) -> None:
    path = ctx.cfg.paths.state_dir / "vllm-args.json"
    if ctx.dry_run or not path.parent.is_dir():  # a dry run changes nothing, not even a cache
        return
    entries = {k: v for k, v in (read_json(path) or {}).items() if k != key}
    entries[key] = {"verdict": verdict.value, "found": found, "class": cls.value if cls else None,
                    "output": output[-OUTPUT_KEEP:]}
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next preflight a parse
        write_json(path, dict(list(entries.items())[-CACHE_KEEP:]))


@check
async def check_vllm_args(ctx: PreflightContext) -> CheckResult:
    launch, spec = ctx.cfg.launch, ctx.spec
    if launch.script:
        return CheckResult(Verdict.ok, "not checked: [launch] script runs the user's own command")
    if len(spec.argv) < 2 or spec.argv[1] != "serve":
        return CheckResult(Verdict.ok, f"not checked: the launch is not `{spec.argv[0]} serve`")
    identity = await launch_identity(ctx)
    key = cache_key(identity, spec) if identity else None
    hit = _cached(ctx, key) if key else None
    if hit is not None:
        verdict = Verdict(hit["verdict"])
        return CheckResult(verdict, f"{hit['found']} (cached)", failure_class=_cached_class(hit),
                           output=str(hit.get("output") or ""))
    try:
        result = await ctx.runtime.exec(parse_command(spec), env={**spec.env, "SPARKD_PARSE_SNIPPET": PARSE_SNIPPET},
                                        timeout_s=ctx.cfg.preflight.vllm_args_timeout_s)
    except TargetUnavailable as exc:
        return CheckResult(Verdict.warn, f"argv not checked: {exc}")
    verdict, found, cls = judge(result, ctx.runtime.where)
    output = result.stderr if verdict is Verdict.fail else ""
    if key and verdict is not Verdict.warn:
        _remember(ctx, key, verdict, found, cls, output)
    return CheckResult(verdict, found, failure_class=cls, output=output[-OUTPUT_KEEP:])
