"""Check: the host is hardened the way the field runs unified-memory nodes.

- Swap off: on unified memory swap turns memory pressure into a death spiral instead of a clean failure.
- ``vm.min_free_kbytes`` at least ``[preflight] min_free_kbytes`` (the field reserves 1.5-3 GiB so the kernel
  keeps room to work when vLLM takes the rest).
- ``vm.overcommit_memory`` as configured (the field sets 0).

Reported as warnings. With ``[preflight] apply_host = true`` preflight applies them (``swapoff -a``, writes
to ``<proc>/sys/vm/*``), re-reads them, and fails when the node still differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio

from sparkd.config import PreflightConfig
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check, human_bytes, read_text
from sparkd.supervisor.failures import FailureClass


@dataclass(frozen=True)
class Observed:
    swaps: list[str]  # active swap areas (device or file, size)
    min_free_kbytes: int | None
    overcommit_memory: int | None


@dataclass(frozen=True)
class Finding:
    key: str  # "swap", "vm.min_free_kbytes", "vm.overcommit_memory"
    have: str
    want: str
    value: str | None = None  # what to write to fix a sysctl; None for swap


# ---- pure parts -----------------------------------------------------------------------------------------


def parse_swaps(text: str) -> list[str]:
    """Active swap areas from /proc/swaps: ``/dev/nvme0n1p3 (8.0 GiB)``."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            size = int(fields[2]) * 1024 if fields[2].isdigit() else 0
            out.append(f"{fields[0]} ({human_bytes(size)})")
    return out


def findings(seen: Observed, pf: PreflightConfig) -> list[Finding]:
    """Pure: how the host differs from the configured hardening."""
    out = []
    if pf.swap_off and seen.swaps:
        out.append(Finding("swap", "on: " + ", ".join(seen.swaps), "off"))
    floor = pf.min_free_kbytes
    if floor and seen.min_free_kbytes is not None and seen.min_free_kbytes < floor:
        out.append(Finding("vm.min_free_kbytes", f"{seen.min_free_kbytes} ({human_bytes(seen.min_free_kbytes * 1024)})",
                           f">= {floor} ({human_bytes(floor * 1024)})", str(floor)))
    want = pf.overcommit_memory
    if want is not None and seen.overcommit_memory is not None and seen.overcommit_memory != want:
        out.append(Finding("vm.overcommit_memory", str(seen.overcommit_memory), str(want), str(want)))
    return out


def describe(items: list[Finding]) -> str:
    return "; ".join(f"{f.key} is {f.have}, want {f.want}" for f in items)


# ---- I/O --------------------------------------------------------------------------------------------------


def _int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def observe(proc_root: Path) -> Observed:
    vm = proc_root / "sys" / "vm"
    return Observed(parse_swaps(read_text(proc_root / "swaps") or ""), _int(vm / "min_free_kbytes"),
                    _int(vm / "overcommit_memory"))


async def apply(ctx: PreflightContext, items: list[Finding]) -> list[str]:
    """Apply each finding; the errors, one sentence each."""
    errors = []
    for item in items:
        if item.key == "swap":
            try:
                result = await anyio.run_process(list(ctx.swapoff), check=False)
            except OSError as exc:
                errors.append(f"{' '.join(ctx.swapoff)}: {exc.strerror or exc}")
                continue
            if result.returncode != 0:
                detail = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
                errors.append(f"{' '.join(ctx.swapoff)}: {detail}")
            continue
        path = ctx.proc_root / "sys" / Path(*item.key.split("."))
        try:
            path.write_text(f"{item.value}\n", encoding="ascii")
        except OSError as exc:
            errors.append(f"cannot set {item.key}: {exc.strerror or exc}")
    return errors


@check
async def check_host(ctx: PreflightContext) -> CheckResult:
    pf = ctx.cfg.preflight
    before = findings(observe(ctx.proc_root), pf)
    if not before:
        return CheckResult(Verdict.ok, "swap off, vm.min_free_kbytes and vm.overcommit_memory as "
                           "configured" if pf.swap_off else "vm settings as configured")
    text = describe(before)
    if not pf.apply_host:
        return CheckResult(Verdict.warn, text, "reported only ([preflight] apply_host is off)")
    if ctx.dry_run:
        return CheckResult(Verdict.warn, text, "would apply: " + ", ".join(f.key for f in before))
    errors = await apply(ctx, before)
    after = findings(observe(ctx.proc_root), pf)
    if after:
        reason = "; ".join(errors) if errors else "the values did not stick"
        return CheckResult(Verdict.fail, f"{describe(after)} after applying ({reason})",
                           f"tried: {', '.join(f.key for f in before)}", failure_class=FailureClass.unknown)
    return CheckResult(Verdict.fixed, text, "applied: " + ", ".join(f.key for f in before))
