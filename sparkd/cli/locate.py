"""Where sparkctl finds the daemon's control socket, without loading (or needing) a valid config.

In order: ``--socket PATH``; ``--config FILE``, of which only ``[paths] run_dir`` is read (and the
``SPARKD_PATHS__RUN_DIR`` override), so that a typo elsewhere in the file, made while editing it, does not lock
the operator out of ``status``, ``stop`` and ``logs``; ``SPARKD_SOCKET``; the demo's socket
(``.sparkd-demo/run/sparkd.sock``) when run from the directory ``make run`` runs in; ``/run/sparkd/sparkd.sock``.
Standard library only: this is on the path of every sparkctl call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_CONFIG_PATH", "DEFAULT_SOCKET", "DEMO_SOCKET", "Located", "locate", "socket_from_config"]

DEFAULT_SOCKET = Path("/run/sparkd/sparkd.sock")
DEFAULT_CONFIG_PATH = Path("/etc/sparkd/sparkd.toml")  # sparkd.config.DEFAULT_CONFIG_PATH, without importing it
DEMO_SOCKET = Path(".sparkd-demo/run/sparkd.sock")  # config/examples/demo.toml's [paths] run_dir, from the repo
SOCKET_NAME = "sparkd.sock"


@dataclass(frozen=True)
class Located:
    socket: Path
    note: str | None = None  # what the operator should know about how it was found


def socket_from_config(path: Path, env: Mapping[str, str]) -> Located:
    """The socket the config at ``path`` names (``<run_dir>/sparkd.sock``), reading nothing else of it."""
    import tomllib

    run_dir = next((v for k, v in env.items() if k.upper() == "SPARKD_PATHS__RUN_DIR"), None)
    if run_dir is not None:
        return Located(Path(run_dir) / SOCKET_NAME)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return Located(DEFAULT_SOCKET, f"cannot read {path} ({exc.strerror or exc}); trying {DEFAULT_SOCKET}")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return Located(DEFAULT_SOCKET, f"{path} is not valid TOML ({exc}), so its [paths] run_dir cannot be read; "
                                       f"trying {DEFAULT_SOCKET}")
    paths = data.get("paths")
    run_dir = paths.get("run_dir") if isinstance(paths, dict) else None
    if run_dir is None:
        return Located(DEFAULT_SOCKET)
    if not isinstance(run_dir, str) or not run_dir:
        return Located(DEFAULT_SOCKET, f"{path}: paths.run_dir is not a path ({run_dir!r}); trying {DEFAULT_SOCKET}")
    return Located(Path(run_dir) / SOCKET_NAME)


def locate(socket: Path | None, config: Path | None, env: Mapping[str, str] | None = None,
           cwd: Path | None = None) -> Located:
    env = os.environ if env is None else env
    if socket is not None:
        return Located(socket)
    if config is not None:
        return socket_from_config(config, env)
    if env.get("SPARKD_SOCKET"):
        return Located(Path(env["SPARKD_SOCKET"]))
    demo = (cwd or Path.cwd()) / DEMO_SOCKET
    if not os.path.exists(DEFAULT_SOCKET) and demo.is_socket():
        return Located(demo if cwd is not None else DEMO_SOCKET)
    return Located(DEFAULT_SOCKET)
