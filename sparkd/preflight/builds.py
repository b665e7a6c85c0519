"""Check: which vLLM, torch, CUDA and NCCL builds the launch will run, so that a group's head can refuse ranks whose
builds differ (``build-parity``: the same NCCL version built twice hung a pair, vllm #42354; NCCL 2.28.9 against
2.30.4 broke CUDA graphs across nodes, vllm #52504).

Where vLLM runs (its container, or the host), the interpreter of the launch's executable (found as the ``vllm_args``
check finds it) reads, without importing torch or vLLM: the distributions' versions (``vllm``, ``torch``,
``nvidia-nccl-cu*``), the CUDA torch was built for (``torch/version.py``), and the NCCL library torch would load (the
pip wheel's, else the system's): its version from ``ncclGetVersion`` and the sha256 of the file, since two builds of
one version differ only there. Cheap once: cached per image id (on the host, per the executable's path, size and
mtime) in ``<state_dir>/builds.json``, whose ``last`` is what this node's status reports. Never a failure: what
cannot be read is said, and the head compares only what both ranks know (:func:`sparkd.cluster.shared.
build_differences`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.vllm_args import RESOLVE_SCRIPT, launch_identity
from sparkd.runtime.base import TargetUnavailable
from sparkd.state.files import read_json, write_json

__all__ = ["BUILDS_FILE", "BUILDS_SNIPPET", "describe", "last_builds", "parse_builds"]

BUILDS_FILE = "builds.json"
TIMEOUT_S = 120.0  # hashing a 300 MiB libnccl on a slow disk
CACHE_KEEP = 16
FIELDS = ("vllm", "torch", "cuda", "nccl", "nccl_sha256")

BUILDS_SNIPPET = r'''
import ctypes, glob, hashlib, importlib.util, json, os, re, sys
from importlib import metadata
out = {}
def version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
out["vllm"], out["torch"] = version("vllm"), version("torch")
out["nccl_wheel"] = version("nvidia-nccl-cu13") or version("nvidia-nccl-cu12")
def package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        return None
    places = list(spec.submodule_search_locations or []) if spec else []
    return places[0] if places else None
torch_dir = package_dir("torch")
try:
    text = open(os.path.join(torch_dir, "version.py")).read() if torch_dir else ""
    found = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    out["cuda"] = found.group(1) if found else None
except OSError:
    out["cuda"] = None
libs = []
nccl_dir = package_dir("nvidia.nccl") or package_dir("nvidia")
if nccl_dir:
    libs += sorted(glob.glob(os.path.join(nccl_dir, "**", "libnccl.so*"), recursive=True))
for pattern in ("/usr/lib/*-linux-gnu/libnccl.so.2*", "/usr/local/cuda*/lib*/libnccl.so.2*"):
    libs += sorted(glob.glob(pattern))
lib = next((p for p in libs if os.path.isfile(p)), None)
out["nccl_lib"] = lib
if lib:
    digest = hashlib.sha256()
    try:
        with open(lib, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out["nccl_sha256"] = digest.hexdigest()
    except OSError:
        out["nccl_sha256"] = None
    try:
        code = ctypes.c_int()
        if ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(code)) == 0:
            v = code.value
            # major*10000+minor*100+patch since NCCL 2.9, major*1000+minor*100+patch before
            major, minor = (v // 10000, v // 100 % 100) if v >= 20900 else (v // 1000, v // 100 % 10)
            out["nccl"] = f"{major}.{minor}.{v % 100}"
    except OSError:
        pass
out.setdefault("nccl", out["nccl_wheel"])
print("SPARKD-BUILDS " + json.dumps(out))
'''


def parse_builds(stdout: str) -> dict[str, Any] | None:
    """The probe's facts from its output (the last ``SPARKD-BUILDS`` line), or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("SPARKD-BUILDS "):
            try:
                data = json.loads(line.removeprefix("SPARKD-BUILDS "))
            except ValueError:
                return None
            if not isinstance(data, dict):
                return None
            return {k: (str(v) if v is not None else None) for k, v in data.items() if isinstance(k, str)}
    return None


def describe(builds: dict[str, Any]) -> str:
    """``vLLM 0.34.0, torch 2.9.1 (CUDA 13.0), NCCL 2.28.9 (libnccl sha256 1a2b3c4d5e6f)``."""
    parts = [f"vLLM {builds.get('vllm') or 'unknown'}",
             f"torch {builds.get('torch') or 'unknown'}" + (f" (CUDA {builds['cuda']})" if builds.get("cuda") else ""),
             f"NCCL {builds.get('nccl') or 'unknown'}" + (f" (libnccl sha256 {builds['nccl_sha256'][:12]})"
                                                         if builds.get("nccl_sha256") else "")]
    return ", ".join(parts)


def last_builds(state_dir: Path, identity: str | None = None) -> dict[str, Any] | None:
    """The builds the last preflight read (what the node's status reports), or None; with ``identity``, only when
    they were read for it (an image id)."""
    data = read_json(state_dir / BUILDS_FILE) or {}
    last = data.get("last")
    entry = (data.get("entries") or {}).get(last) if isinstance(last, str) else None
    if not isinstance(entry, dict) or (identity is not None and last != identity):
        return None
    return {**{k: entry.get(k) for k in FIELDS}, "identity": last}


def _remember(ctx: PreflightContext, identity: str, builds: dict[str, Any]) -> None:
    path = ctx.cfg.paths.state_dir / BUILDS_FILE
    if ctx.dry_run or not path.parent.is_dir():
        return
    data = read_json(path) or {}
    entries = {k: v for k, v in (data.get("entries") or {}).items() if k != identity}
    entries[identity] = builds
    with contextlib.suppress(OSError):  # a cache that cannot be written costs the next preflight one probe
        write_json(path, {"entries": dict(list(entries.items())[-CACHE_KEEP:]), "last": identity})


@check
async def check_builds(ctx: PreflightContext) -> CheckResult:
    if ctx.cfg.launch.script:
        return CheckResult(Verdict.ok, "not read: [launch] script runs the user's own command")
    identity = await launch_identity(ctx)
    cached = (read_json(ctx.cfg.paths.state_dir / BUILDS_FILE) or {}).get("entries", {}).get(identity) \
        if identity else None
    if isinstance(cached, dict):
        _remember(ctx, str(identity), cached)
        return CheckResult(Verdict.ok, f"{describe(cached)} {ctx.runtime.where} (cached)")
    try:
        result = await ctx.runtime.exec(["sh", "-c", RESOLVE_SCRIPT, "sparkd-builds", ctx.spec.argv[0]],
                                        env={**ctx.spec.env, "SPARKD_PARSE_SNIPPET": BUILDS_SNIPPET},
                                        timeout_s=TIMEOUT_S)
    except TargetUnavailable as exc:
        return CheckResult(Verdict.ok, f"not read: {exc}")
    builds = parse_builds(result.stdout) if result.exit_code == 0 else None
    if builds is None:
        return CheckResult(Verdict.ok, f"not read {ctx.runtime.where}: the probe said nothing "
                           f"(exit {result.exit_code}); the group compares no builds")
    if identity:
        _remember(ctx, identity, builds)
    return CheckResult(Verdict.ok, f"{describe(builds)} {ctx.runtime.where}")
