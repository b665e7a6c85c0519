"""What a golden was recorded under: the image, the weights and the launch, each as a short digest.

- The launch: the rendered argv and environment, less what cannot change an answer — where vLLM listens
  (``--host``, ``--port``), what it calls the model (``--served-model-name``), its key, its log and access-log
  switches, a group's rendezvous address and rank, and the environment that only names or marks things
  (``VLLM_HOST_IP``, ``VLLM_PORT``, the process title prefix, ``SPARKD_*``). Everything else — dtype, the KV cache's
  dtype, ``max_num_seqs``, the attention backend, a kernel switch — counts.
- The weights: the model directory's manifest (:mod:`sparkd.preflight.manifest`): every file's path and size, the
  sha256 of the small files that change answers (``[weights] always_hash``: config, tokenizer, index) and the
  modification time of the others. A gate never reads a shard: a copy, a download or a conversion moves its mtime,
  and the digest stays the same from start to start (a shard the hash cache had not hashed yet would change it).
- The image: the container image's digest (the shell knows it), or on the process runtime the program's resolved
  path and modification time (a reinstall of vLLM moves it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a daemon loads the manifest's modules with its first gate
    from sparkd.preflight.manifest import Manifest

__all__ = ["NEUTRAL_ENV", "NEUTRAL_FLAGS", "answer_argv", "launch_identity", "program_identity", "weights_identity"]

# Flags whose value cannot change an answer: (flag, takes a value).
NEUTRAL_FLAGS: dict[str, bool] = {
    "--host": True, "--port": True, "--served-model-name": True, "--api-key": True, "--uvicorn-log-level": True,
    "--root-path": True, "--allowed-origins": True, "--allowed-methods": True, "--allowed-headers": True,
    "--ssl-keyfile": True, "--ssl-certfile": True, "--ssl-ca-certs": True, "--master-addr": True,
    "--master-port": True, "--node-rank": True, "--shutdown-timeout": True, "--disable-log-requests": False,
    "--enable-log-requests": False, "--disable-uvicorn-access-log": False, "--disable-log-stats": False,
}
NEUTRAL_ENV = frozenset({"VLLM_HOST_IP", "VLLM_PORT", "VLLM_PROCESS_NAME_PREFIX", "VLLM_LOGGING_LEVEL",
                         "VLLM_LOGGING_PREFIX", "VLLM_CONFIGURE_LOGGING", "VLLM_LOG_STATS_INTERVAL"})
NEUTRAL_ENV_PREFIXES = ("SPARKD_",)


def answer_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the flags that cannot change an answer (``--port 8000`` and ``--port=8000`` alike)."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in NEUTRAL_FLAGS:
            skip = NEUTRAL_FLAGS[name] and "=" not in word
            continue
        out.append(word)
    return out


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def launch_identity(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The digest of what in the launch can change an answer."""
    kept = {k: v for k, v in env.items() if k not in NEUTRAL_ENV and not k.startswith(NEUTRAL_ENV_PREFIXES)}
    return _digest({"argv": answer_argv(argv), "env": kept})


def weights_identity(manifest: Manifest) -> str | None:
    """The digest of the model directory's manifest; None when there is none (a hub id, an unreadable directory)."""
    if manifest.problem or manifest.skipped or not manifest.files:
        return None
    rows = sorted((rel, e.size, e.sha256 if e.always and e.sha256 else f"mtime:{e.mtime_ns}")
                  for rel, e in manifest.files.items())
    return "sha256:" + hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def program_identity(executable: str) -> str | None:
    """The process runtime's stand-in for an image digest: the program's resolved path and modification time."""
    try:
        path = Path(executable)
        resolved = path if path.is_absolute() else None
        if resolved is None:
            from shutil import which

            found = which(executable)
            resolved = Path(found) if found else None
        if resolved is None:
            return None
        real = resolved.resolve()
        return f"process:{real}@{os.stat(real).st_mtime_ns}"
    except OSError:
        return None
