"""``sparkd check-config --json``: the verdict CI reads, one JSON object on stdout.

``{"valid": bool, "config": path, "source": where the problems are ("from the environment" or the path),
"problems": ["key: message", ...], "findings": [{"rule", "level", "key", "message"}, ...], "node", "role",
"runtime", "launch_hash"}``: ``problems`` are what makes the file unloadable (each names its key or variable),
``findings`` the lint's errors and warnings of a loadable one; ``valid`` is false when either stops it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkd.cli.common import host_file_findings, node_lint, unit_findings
from sparkd.config import ConfigError, load_config
from sparkd.launch.lint import Level


def check_config_json(path: Path, profile: str | None) -> dict[str, Any]:
    report: dict[str, Any] = {"valid": False, "config": str(path), "source": None, "problems": [], "findings": []}
    try:
        cfg = load_config(path, profile=profile)
    except ConfigError as exc:
        report.update(source=exc.source, problems=exc.problems)
        return report
    findings = [*node_lint(cfg, path), *host_file_findings(cfg, path), *unit_findings(cfg, path)]
    report["findings"] = [{"rule": f.rule, "level": f.level.value, "key": f.key, "message": f.message}
                          for f in findings]
    report.update(valid=not any(f.level is Level.error for f in findings), node=cfg.node.name,
                  role=cfg.node.role.value, runtime=cfg.runtime.value, launch_hash=cfg.launch_hash())
    return report
