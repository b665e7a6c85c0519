"""Files that hold a secret (``[api] token_file``, ``[launch] api_key_file``): read only when they are
root's (or the running user's) alone, and never through a symlink.

A token file someone else owns could be swapped for one they know; one that group or others may read is a
secret shared with them; a short token can be guessed (security review §8). The daemon refuses to start on any
of these, with one sentence naming the key, the file and the fix; ``sparkd check-config`` says the same.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MIN_TOKEN_BYTES = 32
MAX_SECRET_BYTES = 64 * 1024


class SecretFileProblem(Exception):
    """One sentence: the key, the file, what is wrong and how to fix it."""


def read_secret_file(path: Path, key: str, *, min_bytes: int = 1) -> str:
    """The file's content, stripped. Raises :class:`SecretFileProblem` unless it is a regular file (not a
    symlink) owned by root or this user, with no permission for group or others, holding ``min_bytes`` or more."""
    make = f"(umask 077; openssl rand -hex 32 > {path})"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise SecretFileProblem(f"{key} {path} does not exist; create it with the same secret on every node: "
                                f"{make}") from None
    except OSError as exc:
        why = "is a symlink (a secret file must be the file itself)" if exc.errno == 40 else \
            f"cannot be read: {exc.strerror or exc}"
        raise SecretFileProblem(f"{key} {path} {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileProblem(f"{key} {path} is not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise SecretFileProblem(f"{key} {path} is owned by uid {st.st_uid}, who could replace the secret: "
                                    f"chown root:root {path}")
        if st.st_mode & 0o077:
            raise SecretFileProblem(f"{key} {path} is open to group or others (mode "
                                    f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretFileProblem(f"{key} {path} is not UTF-8 text") from None
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileProblem(f"{key} {path} is larger than {MAX_SECRET_BYTES} bytes: not a secret file")
    if len(text.encode()) < min_bytes:
        raise SecretFileProblem(f"{key} {path} holds {len(text.encode())} bytes; at least {min_bytes} are "
                                f"needed: {make}")
    return text


def read_token(path: Path | None) -> str | None:
    """The peers' shared secret (``[api] token_file``), checked; None when none is configured."""
    if path is None:
        return None
    return read_secret_file(path, "[api] token_file", min_bytes=MIN_TOKEN_BYTES)
