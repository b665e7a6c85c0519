"""Build the sparkd test image, ``sparkd-test:latest``, with no registry.

The image is an almost empty root file system made by ``docker import``: the directories a container needs,
the merged-/usr symlinks ``bin lib lib64 sbin -> usr/...`` and a minimal ``/etc``. Containers run with the
host's ``/usr`` (and the host's Python, the repo's venv and the repo itself) bind-mounted read-only, so the
host's tools and the project's Python run inside; see :func:`python_mounts`.

The recipe's content hash is stored in the image label ``sparkd.test.recipe``: the image is rebuilt only
when the recipe changes (or with ``--force``).

Run with the venv's python (``.venv/bin/python tests/infra/build_image.py``) or import it:
``ensure_image(client) -> str`` and ``python_mounts() -> dict``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

IMAGE_REPOSITORY = "sparkd-test"
IMAGE_TAG = "latest"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"
RECIPE_LABEL = "sparkd.test.recipe"

REPO_ROOT = Path(__file__).resolve().parents[2]

# Bump to force a rebuild when something outside RECIPE changes how the image is made.
RECIPE_VERSION = 1

_PASSWD = """\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
_GROUP = """\
root:x:0:
daemon:x:1:
tty:x:5:
nogroup:x:65534:
"""
_HOSTS = """\
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""
_NSSWITCH = """\
passwd:   files
group:    files
shadow:   files
hosts:    files dns
networks: files
protocols: files
services: files
"""

RECIPE: dict[str, Any] = {
    "version": RECIPE_VERSION,
    # (path, mode); /tmp and /var/tmp sticky and world-writable like a real system.
    "dirs": [
        ("usr", 0o755),
        ("etc", 0o755),
        ("tmp", 0o1777),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("root", 0o700),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/log", 0o755),
        ("var/lib", 0o755),
    ],
    # Merged /usr, as on Debian 12 hosts: the host's /usr provides everything.
    "symlinks": [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ],
    "files": [
        ("etc/passwd", 0o644, _PASSWD),
        ("etc/group", 0o644, _GROUP),
        ("etc/hosts", 0o644, _HOSTS),
        ("etc/nsswitch.conf", 0o644, _NSSWITCH),
    ],
    # Dockerfile instructions applied by `docker import --change`.
    "changes": [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "ENV PYTHONDONTWRITEBYTECODE=1",
        "ENV PYTHONUNBUFFERED=1",
        "WORKDIR /",
        'CMD ["sleep", "infinity"]',
    ],
}


def recipe_hash(recipe: dict[str, Any] = RECIPE) -> str:
    """A stable content hash of the recipe (first 16 hex digits of its SHA-256)."""
    canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def rootfs_tar(recipe: dict[str, Any] = RECIPE) -> bytes:
    """The root file system as an uncompressed, byte-for-byte reproducible tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for path, mode in sorted(recipe["dirs"]):
            info = tarfile.TarInfo(path)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            add(info)
        for path, target in sorted(recipe["symlinks"]):
            info = tarfile.TarInfo(path)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            info.mode = 0o777
            add(info)
        for path, mode, text in sorted(recipe["files"]):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = mode
            add(info, data)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------------
# Mounts


# Destinations that must never be bind-mounted over wholesale: the image's own skeleton.
_FORBIDDEN_DESTS = frozenset({"/", "/etc", "/proc", "/sys", "/dev", "/run", "/tmp", "/var", "/var/tmp"})


def _editable_paths(site_packages: Iterable[Path]) -> list[str]:
    """Source directories of editable installs and plain path entries of ``.pth`` files."""
    found: list[str] = []
    for sp in site_packages:
        if not sp.is_dir():
            continue
        for pth in sorted(sp.glob("*.pth")):
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                p = line if os.path.isabs(line) else str(sp / line)
                if os.path.isdir(p):
                    found.append(p)
        # setuptools' PEP 660 editable finders: MAPPING = {'pkg': '/path/to/pkg'}
        for finder in sorted(sp.glob("__editable__*finder.py")):
            try:
                text = finder.read_text(errors="replace")
            except OSError:
                continue
            m = re.search(r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$", text, re.MULTILINE)
            if not m:
                continue
            for value in re.findall(r"'([^']*)'\s*[,}]|\"([^\"]*)\"\s*[,}]", m.group(1)):
                p = value[0] or value[1]
                if os.path.isabs(p) and os.path.exists(p):
                    found.append(p)
    return found


def _venv_site_packages(prefix: str) -> list[Path]:
    return sorted(Path(prefix).glob("lib*/python*/site-packages"))


def python_mounts(
    repo_root: str | os.PathLike[str] | None = None,
    extra: Iterable[str | os.PathLike[str]] = (),
) -> dict[str, dict[str, str]]:
    """Read-only bind mounts (docker SDK ``volumes`` format) that let a container from the test image run
    the host's tools and this project's Python exactly as on the host:

    - ``/usr`` — the host's userland (shell, coreutils, libc, ...);
    - ``/etc/ld.so.cache`` when present — so libraries in ``/usr/local/lib`` etc. resolve as on the host;
    - ``sys.base_prefix`` / ``sys.base_exec_prefix`` — the interpreter the venv was made from (pyenv here);
    - ``sys.prefix`` — the venv, with its site-packages;
    - the repo root (the editable install of ``sparkd`` points there), plus any editable-install source
      directories and ``.pth`` path entries found in the venv's site-packages;
    - ``extra`` paths.

    Each path is mounted at itself (source = real path, destination = the path as given). Paths nested inside
    another mounted path are dropped, so ``/usr/local/...`` or ``<repo>/.venv`` are not mounted twice.
    """
    root = Path(repo_root) if repo_root is not None else REPO_ROOT
    candidates: list[str] = ["/usr"]
    for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, str(root)):
        candidates.append(p)
    # The interpreter binary the venv's python links to, wherever it lives.
    candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    candidates.extend(_editable_paths(_venv_site_packages(sys.prefix)))
    candidates.extend(os.fspath(p) for p in extra)

    # (destination, source) pairs, absolute and normalised; a symlinked path is mounted at its own name
    # from its real location.
    pairs: dict[str, str] = {}
    for c in candidates:
        if not c:
            continue
        dest = os.path.normpath(os.path.abspath(c))
        if dest in _FORBIDDEN_DESTS:
            raise ValueError(f"refusing to bind-mount {dest!r} over the test image's skeleton")
        if not os.path.exists(dest):
            continue
        pairs.setdefault(dest, os.path.realpath(dest))

    def nested(path: str, under: str) -> bool:
        return path != under and path.startswith(under.rstrip("/") + "/")

    kept = sorted(d for d in pairs if not any(nested(d, other) for other in pairs))
    volumes: dict[str, dict[str, str]] = {}
    for dest in kept:
        src = pairs[dest]
        if src in volumes:  # the same real directory reached by two names: mount it once
            continue
        volumes[src] = {"bind": dest, "mode": "ro"}
    if os.path.isfile("/etc/ld.so.cache"):
        volumes["/etc/ld.so.cache"] = {"bind": "/etc/ld.so.cache", "mode": "ro"}
    return volumes


def venv_python(repo_root: str | os.PathLike[str] | None = None) -> str:
    """The repo venv's python, as a path valid both on the host and inside a test container."""
    root = Path(repo_root) if repo_root is not None else REPO_ROOT
    return str(root / ".venv" / "bin" / "python")


# ---------------------------------------------------------------------------------------------------------
# Build


def _client(client: Any = None) -> Any:
    if client is not None:
        return client
    import docker  # the project's dependency; imported lazily so python_mounts() works without it

    return docker.from_env()


def image_status(client: Any = None, image: str = IMAGE) -> tuple[str | None, str | None]:
    """(image id, recipe hash label) of ``image``, or (None, None) if it does not exist."""
    import docker.errors

    client = _client(client)
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        return None, None
    labels = (img.attrs.get("Config") or {}).get("Labels") or {}
    return img.id, labels.get(RECIPE_LABEL)


def ensure_image(client: Any = None, *, force: bool = False, verbose: bool = False) -> str:
    """Build ``sparkd-test:latest`` unless an image with the current recipe hash is already there.

    Returns the image name. Safe to call from several processes at once (the last import wins the tag, and
    both results are identical).
    """
    client = _client(client)
    want = recipe_hash()
    old_id, have = image_status(client)
    if old_id is not None and have == want and not force:
        if verbose:
            print(f"{IMAGE} is up to date (recipe {want}, image {old_id[:19]})")
        return IMAGE

    changes = [*RECIPE["changes"], f"LABEL {RECIPE_LABEL}={want} sparkd.test=1"]
    out = client.api.import_image_from_data(rootfs_tar(), repository=IMAGE_REPOSITORY, tag=IMAGE_TAG, changes=changes)
    new_id, got = image_status(client)
    if new_id is None or got != want:
        raise RuntimeError(f"docker import did not produce {IMAGE} with recipe {want}: {out!r}")
    if verbose:
        why = "forced" if force and have == want else ("recipe changed" if old_id else "image missing")
        print(f"built {IMAGE} ({why}; recipe {want}, image {new_id[:19]})")
    if old_id is not None and old_id != new_id:
        # Drop the superseded image if nothing uses it any more; never forcibly.
        try:
            client.images.remove(old_id)
            if verbose:
                print(f"removed superseded image {old_id[:19]}")
        except Exception as exc:
            if verbose:
                print(f"kept superseded image {old_id[:19]}: {exc}")
    return IMAGE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the recipe hash matches")
    parser.add_argument("--print-mounts", action="store_true", help="print python_mounts() as JSON and the venv python")
    args = parser.parse_args(argv)
    if args.print_mounts:
        print(json.dumps(python_mounts(), indent=2))
        print(f"venv python: {venv_python()}")
        return 0
    try:
        ensure_image(force=args.force, verbose=True)
    except Exception as exc:
        print(f"build_image: failed to build {IMAGE}: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("build_image: is dockerd running? try: bash tests/infra/ensure-docker.sh", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
