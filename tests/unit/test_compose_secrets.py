"""`sparkd import-compose`'s secrets and its output (security review 2, #32): `-o` over a symlink wrote through it,
0644, with `--api-key sk-…` in extra_args and HF_TOKEN in clear. Now the output is a new file of mode 0600 (a link
or an existing file refused; `--force` replaces a regular file only), `--api-key` becomes `api_key_file` and
`--hf-token` HF_TOKEN in the environment, each with a note saying where the secret goes."""

from __future__ import annotations

import stat
import subprocess
import sys
import tomllib
from pathlib import Path

from sparkd.cli.compose import import_compose
from sparkd.cli.compose.secrets import API_KEY_FILE

COMPOSE = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.32.0
    network_mode: host
    environment:
      HF_TOKEN: hf_COMPOSESECRET_111
      DB_LOGIN: ghp_SHAPEDLIKEATOKEN99
    command: ["/m", "--api-key", "sk-COMPOSEAPIKEY-22", "--hf-token=hf_FLAG_33", "--wandb-token", "w_44",
              "--port", "8000"]
"""


def test_compose_secrets_leave_the_command_line_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "docker-compose.yml"
    path.write_text(COMPOSE)
    imported = import_compose(path, environ={})
    data = tomllib.loads(imported.toml)
    launch, env = data["launch"], data["container"]["env"]
    assert launch["extra_args"] == [] and launch["port"] == 8000 and launch["api_key_file"] == API_KEY_FILE
    assert env["HF_TOKEN"] == "hf_FLAG_33" and launch["secret_env"] == ["DB_LOGIN"]
    assert "sk-COMPOSEAPIKEY-22" not in imported.toml and "w_44" not in imported.toml
    said = "\n".join(imported.not_carried)
    assert f"--api-key's value is not written here: put that key in {API_KEY_FILE}" in said
    assert "--wandb-token's value is not carried" in said and "DB_LOGIN look like secrets" in said
    assert "this config holds the secrets DB_LOGIN, HF_TOKEN ([container] env): it is written mode 0600" in said
    assert "sk-COMPOSEAPIKEY-22" not in said and "hf_FLAG_33" not in said


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkd.cli", "import-compose", *args], capture_output=True,
                          text=True, timeout=60)


def test_the_output_is_a_new_file_of_mode_0600_never_written_through_a_link(tmp_path: Path) -> None:
    path = tmp_path / "docker-compose.yml"
    path.write_text(COMPOSE)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "link.toml").symlink_to(victim)
    (tmp_path / "dangling.toml").symlink_to(tmp_path / "nowhere")
    for name in ("link.toml", "dangling.toml"):
        refused = run(str(path), "-o", str(tmp_path / name))
        assert refused.returncode == 2 and "is a symlink: never written through" in refused.stderr
        assert "Traceback" not in refused.stderr
    forced = run(str(path), "-o", str(tmp_path / "link.toml"), "--force")
    assert forced.returncode == 2 and "is a symlink: never written through, even with --force" in forced.stderr
    assert victim.read_text() == "untouched\n" and not (tmp_path / "nowhere").exists()
    out = tmp_path / "sparkd.toml"
    assert run(str(path), "-o", str(out)).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert run(str(path), "-o", str(out)).returncode == 2
    out.write_text("old\n")
    assert run(str(path), "-o", str(out), "--force").returncode == 0 and "[launch]" in out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
