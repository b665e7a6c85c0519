"""A rehearsal: the same launch with the vLLM stand-in in place of vLLM — same flags, same environment."""

from __future__ import annotations

import sys

from sparkd.launch import LaunchSpec


def rehearsal(spec: LaunchSpec) -> LaunchSpec:
    argv = spec.argv
    rest = argv[2:] if argv[0] == "bash" else argv[1:]
    return LaunchSpec(argv=(sys.executable, "-m", "sparkd.standin", *rest), env=spec.env,
                      config_hash=spec.config_hash)
