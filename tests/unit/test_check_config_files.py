"""`sparkd check-config` warns about the peer token file the config names: missing, or readable by others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def check(tmp_path: Path, token: Path | None) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "c.toml"
    api = f'[api]\ntoken_file = "{token}"\n' if token else ""
    path.write_text(f'runtime = "process"\n[launch]\nmodel = "/m"\n{api}')
    return subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)


@pytest.mark.parametrize(
    ("mode", "secret", "expected"),
    [(None, "", "does not exist, so the peer API refuses every request"),
     (0o644, "s" * 64, "is open to group or others (mode 0644): chmod 600"),
     (0o640, "s" * 64, "is open to group or others (mode 0640): chmod 600"),
     (0o600, "s3cret", "holds 6 bytes; at least 32 are needed"), (0o600, "s" * 64, None)],
    ids=["missing", "world-readable", "group-readable", "short", "private"],
)
def test_token_file_warnings(tmp_path: Path, mode: int | None, secret: str, expected: str | None) -> None:
    """The checks `sparkd run` refuses to start on (tests/unit/test_startup_checks.py), said by check-config."""
    token = tmp_path / "peer.token"
    if mode is not None:
        token.write_text(secret + "\n")
        token.chmod(mode)
    result = check(tmp_path, token)
    assert result.returncode == 0, result.stderr  # warnings, not errors
    if expected is None:
        assert "api.token_file" not in result.stderr, result.stderr
    else:
        assert f"warning: api.token_file: {token} {expected}" in result.stderr, result.stderr
        assert "[token-file-" in result.stderr


def test_no_token_file_named_no_warning(tmp_path: Path) -> None:
    result = check(tmp_path, None)
    assert result.returncode == 0 and "token" not in result.stderr, result.stderr


def test_render_refuses_what_check_config_refuses(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('runtime = "process"\n[launch]\nmodel = "/m"\n'
                    '[launch.env]\nVLLM_WORKER_MULTIPROC_METHOD = "fork"\n')
    result = subprocess.run([sys.executable, "-m", "sparkd.cli", "render", "--config", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "[multiproc-fork]" in result.stderr, result.stderr
