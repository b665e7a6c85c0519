"""Instances know each other: every sparkd on a host registers its live launch where the others read it.

One JSON file per instance in ``[paths] instances_dir`` (default ``/run/sparkd/instances``, a tmpfs: a reboot
clears it), named after the instance's state directory. It names the daemon (PID and create time), its config
and state directory, and its launch: the root process (PID and create time; the process runtime's root leads a
session every process of the launch stays in), the launch marker every process of the launch inherits
(``SPARKD_LAUNCH_ID``), the container. The stale/neighbour decision (:mod:`sparkd.preflight.neighbours`) never
counts a process of a registered launch as stale.

A daemon that may not write there (a user's ``make run`` beside root's ``/run/sparkd``) registers in its user's
runtime folder, ``$XDG_RUNTIME_DIR/sparkd/instances`` (``/run/user/<uid>/…``). Every instance reads the
configured folder, its own user's and each ``/run/user/*/sparkd/instances`` it may read (root: all of them). A
registration in a folder that a user other than root owns speaks only for that user's processes: a user cannot
protect root's litter by registering it.

A registration whose daemon is gone (no process with that PID and create time) protects nothing: it is read as
absent and left for its owner to rewrite. Reading is defensive (regular files only, not through a symlink, at
most 64 KiB, the expected shape; anything else is skipped), and a registration is written only into a folder
that the daemon's user owns and no one else may write to.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from sparkd.preflight.neighbours import Launch
from sparkd.runtime import proctree
from sparkd.state.files import to_json

MAX_BYTES = 64 << 10
USER_RUNTIME_ROOT = Path("/run/user")  # where pam_systemd makes each logged-in user's XDG_RUNTIME_DIR
USER_SUBFOLDER = Path("sparkd", "instances")


@dataclass(frozen=True)
class Registration:
    daemon_pid: int
    daemon_start: float
    state_dir: str
    config: str | None = None
    node: str = ""
    launch_pid: int = 0  # 0: nothing launched now
    launch_start: float = 0.0
    marker: str | None = None
    container: str | None = None
    # Read, never written: the uid whose processes this registration may speak for (None: any — a folder of
    # root's); the owner of the folder it was read from.
    speaks_for: int | None = field(default=None, compare=False)

    @property
    def owner(self) -> str:
        """How a sentence names this instance."""
        where = f"config {self.config}, state {self.state_dir}" if self.config else f"state {self.state_dir}"
        return f"sparkd instance {self.node or '?'} ({where})"

    def launch(self) -> Launch | None:
        if self.launch_pid <= 1 and not self.marker:
            return None
        return Launch(self.launch_pid, self.launch_start, self.owner, self.marker, uid=self.speaks_for)

    @classmethod
    def from_json(cls, data: Any) -> Registration | None:
        """A registration from parsed JSON, or None when it is not one."""
        if not isinstance(data, dict):
            return None
        try:
            reg = cls(daemon_pid=int(data["daemon_pid"]), daemon_start=float(data["daemon_start"]),
                      state_dir=str(data["state_dir"]), config=_text(data.get("config")),
                      node=str(data.get("node") or "")[:200], launch_pid=int(data.get("launch_pid") or 0),
                      launch_start=float(data.get("launch_start") or 0.0), marker=_text(data.get("marker")),
                      container=_text(data.get("container")))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        return reg if reg.daemon_pid > 1 else None


def _text(value: Any) -> str | None:
    return str(value)[:4096] if value else None


def file_for(instances_dir: Path, state_dir: Path) -> Path:
    """The registration file of the instance whose state directory is ``state_dir``."""
    key = hashlib.sha256(str(state_dir.absolute()).encode()).hexdigest()[:16]
    return instances_dir / f"{key}.json"


def safe_folder(folder: Path) -> str | None:
    """Why sparkd will not write registrations into ``folder`` (made if missing), or None."""
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        return f"{folder} cannot be made: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a directory"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"{folder} is not owned by uid {os.geteuid()} alone (owner uid {st.st_uid}, mode {st.st_mode:o})"
    return None


def write(instances_dir: Path, reg: Registration) -> None:
    """Write (or replace) ``reg``. Raises OSError with a sentence when the folder is not safe or the write fails."""
    problem = safe_folder(instances_dir)
    if problem is not None:
        raise OSError(problem)
    path = file_for(instances_dir, Path(reg.state_dir))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(to_json({k: v for k, v in asdict(reg).items() if k != "speaks_for"}))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def remove(instances_dir: Path, state_dir: Path, daemon_pid: int) -> None:
    """Remove this instance's registration if it is still this daemon's."""
    path = file_for(instances_dir, state_dir)
    reg = read(path)
    if reg is not None and reg.daemon_pid == daemon_pid:
        with contextlib.suppress(OSError):
            path.unlink()


def read(path: Path) -> Registration | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return None
    try:
        return Registration.from_json(json.loads(raw))
    except ValueError:
        return None


def daemon_alive(reg: Registration) -> bool:
    proc = proctree.same_process(reg.daemon_pid, reg.daemon_start)
    return proc is not None


def user_folder(env: Mapping[str, str]) -> Path | None:
    """This user's registration folder, ``$XDG_RUNTIME_DIR/sparkd/instances``; None without an absolute
    XDG_RUNTIME_DIR."""
    runtime_dir = env.get("XDG_RUNTIME_DIR", "")
    return Path(runtime_dir) / USER_SUBFOLDER if runtime_dir.startswith("/") else None


def folders(configured: Path, env: Mapping[str, str], runtime_root: Path = USER_RUNTIME_ROOT) -> list[Path]:
    """Every folder registrations are read from, each once: the configured one, this user's, and every user's
    under ``runtime_root`` (root reads them all; a user only their own, the others' are 0700)."""
    found = [configured, *filter(None, [user_folder(env)])]
    with contextlib.suppress(OSError), os.scandir(runtime_root) as entries:
        found += sorted(Path(entry.path) / USER_SUBFOLDER for entry in entries)
    out: list[Path] = []
    for folder in found:
        if folder.absolute() not in out:
            out.append(folder.absolute())
    return out


def live(instances_dir: Path, *, besides: Path | None = None) -> list[Registration]:
    """The registrations in ``instances_dir`` whose daemon runs, except the one for state dir ``besides``; each
    speaks for the folder owner's processes only, unless root owns the folder. None from a folder that is a
    symlink or not a folder."""
    try:
        st = os.lstat(instances_dir)
        if not stat.S_ISDIR(st.st_mode):
            return []
        names = sorted(entry.name for entry in os.scandir(instances_dir) if entry.name.endswith(".json"))
    except OSError:
        return []
    speaks_for = None if st.st_uid == 0 else st.st_uid
    skip = file_for(instances_dir, besides).name if besides is not None else None
    found = []
    for name in names:
        if name == skip:
            continue
        reg = read(instances_dir / name)
        if reg is not None and reg.daemon_pid != os.getpid() and daemon_alive(reg):
            found.append(replace(reg, speaks_for=speaks_for))
    return found


def live_everywhere(configured: Path, *, besides: Path | None = None,
                    env: Mapping[str, str] | None = None) -> list[Registration]:
    """:func:`live` over every folder of :func:`folders`."""
    found: list[Registration] = []
    for folder in folders(configured, os.environ if env is None else env):
        found += live(folder, besides=besides)
    return found


def launches(regs: Iterable[Registration]) -> tuple[Launch, ...]:
    return tuple(launch for launch in (reg.launch() for reg in regs) if launch is not None)


def this_daemon(state_dir: Path, config: Path | None, node: str) -> Registration:
    """A registration of the calling daemon, with nothing launched."""
    return Registration(daemon_pid=os.getpid(), daemon_start=psutil.Process().create_time(),
                        state_dir=str(state_dir.absolute()), config=str(config.absolute()) if config else None,
                        node=node)
