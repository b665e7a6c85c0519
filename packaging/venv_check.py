"""Check that the Python environment running this script holds exactly the pinned versions.

    python packaging/venv_check.py [--prune] [--only-installed] packaging/constraints.txt

Every installed distribution (but pip, setuptools, wheel and sparkd itself) must be pinned in the
constraints file at the version installed. Exit 0 when it is so, 1 listing each difference. ``--prune``
first uninstalls what the pins no longer name (a dependency dropped since the venv was made), with pip.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

UNPINNED = {"pip", "setuptools", "wheel", "sparkd", "sparkd-standin"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[canonical(name)] = version.strip()
    return found


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def differences(pinned: dict[str, str], have: dict[str, str]) -> list[str]:
    problems = []
    for name, version in sorted(have.items()):
        if name in UNPINNED:
            continue
        if name not in pinned:
            problems.append(f"{name} {version} is installed but not pinned")
        elif pinned[name] != version:
            problems.append(f"{name} {version} is installed, {pinned[name]} is pinned")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("constraints", type=Path)
    parser.add_argument("--prune", action="store_true", help="uninstall what the pins do not name first")
    args = parser.parse_args(argv)
    pinned = pins(args.constraints)
    if args.prune:
        extra = sorted(n for n in installed() if n not in pinned and n not in UNPINNED)
        if extra:
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", *extra], check=True)
    problems = differences(pinned, installed())
    for problem in problems:
        print(f"venv_check: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
