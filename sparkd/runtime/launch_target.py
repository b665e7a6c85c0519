"""Whether the launch target (the executable, or the user's launch script run by bash) can run.

On the host this is answered in Python. In a container it is answered by ``CHECK_SCRIPT`` run there, whose exit
status ``target_sentence`` turns into the sentence preflight shows: the "ExecStart points at a ghost file"
failure, caught before a day of exit-127 restarts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sparkd.launch.program import executable, which

# Exit status of CHECK_SCRIPT: 0 runnable, 1 missing, 2 not executable, 3 not on PATH.
CHECK_SCRIPT = (
    't=$1; k=$2\n'
    'if [[ $k == file ]]; then [[ -f $t ]] || exit 1; exit 0; fi\n'
    'if [[ $t == */* ]]; then [[ -e $t ]] || exit 1; [[ -x $t && ! -d $t ]] || exit 2; exit 0; fi\n'
    'command -v -- "$t" >/dev/null || exit 3\n'
)


def launch_target(argv: tuple[str, ...]) -> tuple[str, str]:
    """(what must exist where the launch runs, ``file`` for a script run by bash or ``exec``)."""
    if argv[0] == "bash" and len(argv) > 1 and not argv[1].startswith("-"):
        return argv[1], "file"
    return argv[0], "exec"


def check_command(argv: tuple[str, ...]) -> list[str]:
    """The command that checks the launch target of ``argv`` where it will run (needs bash there)."""
    target, kind = launch_target(argv)
    return ["bash", "-c", CHECK_SCRIPT, "sparkd-check", target, kind]


def target_sentence(argv: tuple[str, ...], status: int, where: str) -> str | None:
    """The sentence for CHECK_SCRIPT's exit ``status``; ``where`` is e.g. ``in container vllm_ds4``."""
    target, _ = launch_target(argv)
    if status == 0:
        return None
    if status == 1:
        return f"the launch target {target} does not exist {where}"
    if status == 2:
        return f"the launch target {target} is not executable {where}"
    if status == 3:
        return f"the launch target {target} is not on PATH {where}"
    return f"the launch target {target} could not be checked {where} (check exited with {status})"


def missing_host_target(argv: tuple[str, ...], env: Mapping[str, str] | None = None) -> str | None:
    """CHECK_SCRIPT's answer for a launch on this host, in Python; ``env`` is the launch's (its PATH wins)."""
    target, kind = launch_target(argv)
    path = Path(target)
    if kind == "file":
        return None if path.is_file() else f"the launch target {target} does not exist"
    if "/" in target:
        if not path.exists():
            return f"the launch target {target} does not exist"
        if not executable(path):
            return f"the launch target {target} is not executable"
        return None
    search = (env or {}).get("PATH") or os.environ.get("PATH", "")
    if which(target, search) is None:
        return f"the launch target {target} is not on PATH ({search})"
    return None
