"""The secrets a compose service carries, out of vLLM's command line and named (security review 2, #32: the
imported config held ``--api-key sk-…`` in ``extra_args``, which ``check-config`` now refuses).

- ``--api-key VALUE`` becomes ``[launch] api_key_file`` (:data:`API_KEY_FILE`), the value left out, with a note
  saying where to put it;
- ``--hf-token VALUE`` becomes ``HF_TOKEN`` in ``[container] env``, where the hub client reads it;
- any other secret flag's value is left out, with a note;
- an environment value shaped like a token (``hf_…``, ``sk-…``, ``ghp_…``) under a name the secret rule does not
  know is listed in ``[launch] secret_env``, so that sparkd masks it too.

The file is written 0600 (:mod:`sparkd.cli.outputs`), and a note says the secrets it holds.
"""

from __future__ import annotations

import re
from typing import Any

from sparkd.config.secretrule import is_secret_name, secret_flag

API_KEY_FILE = "/etc/sparkd/api-key"
_TOKEN_SHAPE = re.compile(r"^(hf_|sk-|ghp_|github_pat_|gho_|glpat-|nvapi-|xox[abp]-)[A-Za-z0-9_-]{6,}")


def _take(extra: list[str], i: int) -> tuple[str | None, int]:
    """The value of the secret flag at ``extra[i]`` and the index after it (None: a bare flag)."""
    word = extra[i]
    if "=" in word:
        return word.split("=", 1)[1], i + 1
    if i + 1 < len(extra) and not extra[i + 1].startswith("-"):
        return extra[i + 1], i + 2
    return None, i + 1


def move_secrets(data: dict[str, Any], where: str, notes: list[str]) -> None:
    """Move the secrets of the imported ``data`` (``launch``, ``container`` tables) as the module says."""
    launch = data["launch"]
    env = data.setdefault("container", {}).setdefault("env", {})
    extra, kept, i = list(launch.get("extra_args", [])), [], 0
    while i < len(extra):
        flag = secret_flag(extra[i])
        value, after = _take(extra, i) if flag is not None else (None, i + 1)
        if value is None:
            kept.append(extra[i])
        elif flag == "--api-key":
            launch["api_key_file"] = API_KEY_FILE
            notes.append(f"{where}.command: --api-key's value is not written here: put that key in {API_KEY_FILE} "
                         f"(root's, mode 0600: sudo install -m 600 /dev/null {API_KEY_FILE}, then write it there); "
                         "sparkd gives it to vLLM as VLLM_API_KEY, never on its command line")
        elif flag == "--hf-token":
            env["HF_TOKEN"] = value
            notes.append(f"{where}.command: --hf-token is carried as HF_TOKEN in [container] env (the hub client "
                         "reads it there), not on vLLM's command line")
        else:
            notes.append(f"{where}.command: {flag}'s value is not carried: on vLLM's command line every user could "
                         "read it; set the environment variable vLLM reads for it in [container] env")
        i = after
    launch["extra_args"] = kept
    shaped = sorted(name for name, value in env.items()
                    if not is_secret_name(name) and _TOKEN_SHAPE.match(str(value)))
    if shaped:
        launch["secret_env"] = shaped
        notes.append(f"{where}: {', '.join(shaped)} look like secrets: listed in [launch] secret_env, so that sparkd "
                     "shows them as (secret)")
    held = sorted(name for name, value in env.items() if value and is_secret_name(name, shaped))
    if held:
        notes.append(f"{where}: this config holds the secrets {', '.join(held)} ([container] env): it is written "
                     "mode 0600; install it root's (0640 at most) and keep it out of version control")
    if not env:
        del data["container"]["env"]
