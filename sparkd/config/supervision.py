"""The sections of the sparkd config that steer supervision: the supervisor's budgets, the restart policy,
health checks, preflight and the memory guard. :mod:`sparkd.config` assembles them with
:mod:`sparkd.config.sections`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from sparkd.config.container import parse_size
from sparkd.config.sections import _Section


class SupervisorConfig(_Section):
    """Budgets of one vLLM instance's life: its start, its stop, its log, its incidents."""

    startup_timeout_s: float = Field(default=3600.0, gt=0, description=(
        "Startup budget from launch to ready (a cold start takes 8-10 minutes); extended while the log shows "
        "progress (`startup_extension_s`)."))
    startup_silence_s: float = Field(default=900.0, gt=0, description=(
        "A start fails after this long without a progress line, even inside the startup budget."))
    startup_extension_s: float = Field(default=300.0, ge=0, description=(
        "Past `startup_timeout_s` a start goes on while its log showed progress within this many seconds."))
    stop_grace_s: float = Field(default=90.0, ge=0, description=(
        "On stop: SIGTERM, this grace, then SIGKILL: how long vLLM may take to end once its requests are done (vLLM "
        "ignores SIGTERM while loading). A drained stop's grace is `[stop] drain_s` plus this "
        "(sparkd.supervisor.graces); `sparkd check-config` refuses a unit `TimeoutStopSec` shorter than both and the "
        "sweep."))
    hung_stop_grace_s: float = Field(default=5.0, ge=0, description=(
        "The stop of a vLLM known to be wedged (a hang or stall verdict, a lost peer): SIGTERM, this grace, then "
        "SIGKILL. A rank spinning in a collective whose peer died ignores SIGTERM, so the drain grace "
        "`stop_grace_s` would only delay the restart."))
    gpu_release_timeout_s: float = Field(default=30.0, ge=0, description=(
        "After a stop, how long sparkd waits for the GPU memory of the stopped processes to come back (NVML) "
        "before the next preflight; past it the node is not launched into (`gpu_error`, a reboot frees it)."))
    leave_running: bool = Field(default=False, description=(
        "On SIGTERM leave vLLM running, so a daemon restart adopts it instead of a cold start. False: "
        "`systemctl stop sparkd` stops vLLM."))
    log_max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096, description=(
        "`vllm.log` is rotated at this size (bytes)."))
    log_backups: int = Field(default=3, ge=0, description="Rotated `vllm.log.N` files kept.")
    incidents_keep: int = Field(default=50, ge=1, description="Incident folders kept; the oldest are removed.")


class RestartConfig(_Section):
    """Backoff between failed starts and the budget that opens the breaker (`sparkctl reset` closes it)."""

    backoff_initial_s: float = Field(default=10.0, ge=0, description="Delay before the first restart after a failure.")
    backoff_factor: float = Field(default=2.0, ge=1.0, description=(
        "Each consecutive failure multiplies the delay by this."))
    backoff_max_s: float = Field(default=300.0, ge=0, description="The delay's cap (before jitter).")
    jitter: float = Field(default=0.1, ge=0, le=1, description=(
        "Random spread of the delay, as a fraction (0.1: +/-10%)."))
    stable_after_s: float = Field(default=600.0, ge=0, description=(
        "A run ready this long counts as stable: the consecutive count starts over."))
    budget_failures: int = Field(default=5, ge=1, description=(
        "This many (weighted) failures within `budget_window_s` open the breaker."))
    budget_window_s: float = Field(default=1800.0, gt=0, description="The restart budget's window.")
    consecutive_limit: int = Field(default=6, ge=0, description=(
        "This many failures in a row without a stable run also open the breaker; waits (a lost peer, the Docker "
        "engine, memory headroom) between them do not count (0: no such limit)."))
    guard_kill_weight: int = Field(default=2, ge=1, description="A memory-guard kill counts this many failures.")


class HealthConfig(_Section):
    """How a running vLLM is probed: `/health`, a generation canary and a progress-stall check."""

    interval_s: float = Field(default=5.0, gt=0, description="Seconds between `/health` probes.")
    timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one `/health` probe.")
    failure_threshold: int = Field(default=3, ge=1, description="Failed `/health` probes in a row that fail vLLM.")
    success_threshold: int = Field(default=1, ge=1, description="Good `/health` probes in a row that clear degraded.")
    canary: bool = Field(default=True, description="Send a one-token generation now and then: proves the engine works.")
    canary_interval_s: float = Field(default=15.0, gt=0, description=(
        "Seconds between test generations. A wedge that begins on an idle engine shows only to a canary (vLLM's "
        "gauges move only when an engine step completes), so this bounds how late it is seen. While the step probe "
        "reads vLLM's ranks the canary runs at least every 8 s: the probe names a wedged step 5 s after it began."))
    canary_timeout_s: float = Field(default=30.0, gt=0, description=(
        "A test generation with no answer after this long is busy; on an idle engine that completed no step "
        "meanwhile it is a hang."))
    busy_grace_s: float = Field(default=600.0, ge=0, description=(
        "Only when no engine step is observable (vLLM runs with --disable-log-stats, and on one GPU, where no executor "
        "wait line is logged either): how long canary timeouts while /health is 200 count as busy before they are "
        "a hang."))
    stall_after_s: float = Field(default=45.0, gt=0, description=(
        "Requests running, a canary unanswered and no engine step completed for this long is a stall (raised to "
        "twice the longest step seen while busy, e.g. during a 1M-token prefill)."))
    execute_timeout_s: float | None = Field(default=None, gt=0, description=(
        "How long vLLM lets one engine step run before it kills the engine (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS). "
        "After a JIT-compile line the stall check waits this long before it calls a wedge, so a compile vLLM "
        "would survive is not restarted. Unset: the launch environment's value (sparkd's default env sets 1800), "
        "else vLLM's own default, 300."))
    step_probe: bool = Field(default=True, description=(
        "Load sparkd's step probe into vLLM (`sparkd-vllm-probe`, a vLLM general plugin shipped with sparkd): its "
        "engine core and each rank record their engine steps in a small file under `<run_dir>/probe`, which tells "
        "which rank is stuck in which step. The launch puts the plugin on vLLM's `PYTHONPATH` (a container gets it "
        "mounted read-only) and appends it to `VLLM_PLUGINS` when that is set. With a drain (`[stop] drain_s` above "
        "0) the plugin also makes vLLM's drain take in the requests it accepted before its SIGTERM, which vLLM "
        "0.32 drops. Needs vLLM 0.9 or later; false: launch vLLM without it."))


# The preflight checks, in the order they run: each id is its module, sparkd/preflight/<id>.py (the runner loads
# them from this list; `[preflight] skip` takes these ids). A new check is its module and one line here.
PREFLIGHT_CHECKS: tuple[str, ...] = (
    "container",
    "launch_target",
    "vllm_args",
    "builds",
    "stale_processes",
    "ports",
    "dev_shm",
    "page_cache",
    "memory",
    "host",
    "image",
    "rdma",
    "gpu",
)
if TYPE_CHECKING:
    PreflightCheckId = str
else:
    PreflightCheckId = Literal[PREFLIGHT_CHECKS]


class ImageAssert(_Section):
    """One integrity assertion on a file where vLLM runs (inside the container for docker runtimes): the
    number of lines of ``path`` matching the regular expression ``pattern`` must be ``count`` (``grep -c``).
    The field's double-applied mxfp4.py patch: ``pattern = "empty_cache"``, ``count = 2`` (3 when re-applied)."""

    path: str = Field(description="Absolute path of the file where vLLM runs.")
    pattern: str = Field(description="A regular expression.")
    count: int = Field(ge=0, description="How many lines must match it.")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path")
        return value

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


class PreflightConfig(_Section):
    """What preflight checks and fixes before every launch (``sparkd preflight`` runs it alone)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)  # `assert` or `asserts`

    skip: list[PreflightCheckId] = Field(default_factory=list, description=(
        f"Check ids not to run (reported as skipped): {', '.join(PREFLIGHT_CHECKS)}."))
    kill_grace_s: float = Field(default=5.0, ge=0, description=(
        "Stale vLLM processes (orphaned, or of the previous launch): SIGTERM, this grace, SIGKILL."))
    shm_min_free_mib: int = Field(default=256, ge=0, description=(
        "/dev/shm must have this much free space (MiB) after the sweep (vLLM's rings need ~200 MiB)."))
    drop_caches: bool = Field(default=True, description=(
        "`sync` and write 3 to /proc/sys/vm/drop_caches before the memory check."))
    memory_margin_gib: float = Field(default=2.0, ge=0, description=(
        "MemFree must cover `gpu_memory_utilization` x MemTotal plus this margin (GiB)."))
    swap_off: bool = Field(default=True, description="Host hardening: warn while swap is on.")
    min_free_kbytes: int = Field(default=1572864, ge=0, description=(
        "Host hardening: warn while vm.min_free_kbytes is below this (0: not checked; the field uses 1.5-3 GiB)."))
    overcommit_memory: int | None = Field(default=0, ge=0, le=2, description=(
        "Host hardening: the vm.overcommit_memory wanted (the field sets 0); false: not checked."))
    apply_host: bool = Field(default=False, description=(
        "Apply the host hardening (swapoff -a, write the sysctls) instead of only reporting it."))
    asserts: list[ImageAssert] = Field(default_factory=list, alias="assert", description=(
        "`[[preflight.assert]]` tables `{ path, pattern, count }`: file contents checked where vLLM runs."))
    drift: Literal["fail", "warn", "off"] = Field(default="fail", description=(
        "An existing container (docker-exec adopts one by name) that differs from `[container]` (image, mounts, "
        "devices, privileged, ulimits, env, shm size, network and IPC mode, ...): `fail` refuses the launch "
        "until `sparkctl recreate` or the config matches, `warn` reports it and launches, `off` skips it."))
    rdma_min_memlock: int | None = Field(default=None, gt=0, description=(
        "The locked-memory limit (ulimit -l) vLLM needs where it runs when NCCL uses RDMA, unless it holds "
        "CAP_IPC_LOCK; unset: unlimited (`container.ulimits = { memlock = -1 }`)." + " Bytes, or a size such as "
        "`\"64g\"`."))
    vllm_args_timeout_s: float = Field(default=180.0, gt=0, description=(
        "How long vLLM may take to parse the rendered argv (the `vllm_args` check imports vLLM where it runs: "
        "seconds, not a cold start)."))

    @field_validator("rdma_min_memlock", mode="before")
    @classmethod
    def _memlock_size(cls, value: Any) -> Any:
        return parse_size(value)


_SIZE = " Bytes, or a size such as `\"4 GiB\"`."


class GuardConfig(_Section):
    """The unified-memory guard (sparkd/guard). Sizes are bytes; strings such as ``"4 GiB"`` or ``"512MiB"``
    are accepted. Floors are absolute, never percentages: on GB10 the driver's memory hides from every
    percentage base. Rules and their order: ``sparkd/guard/policy.py``."""

    enabled: bool = Field(default=True, description="Run the memory guard.")
    dry_run: bool = Field(default=False, description=(
        "Decide and log as usual, but never stop, kill or refuse anything."))
    warn_below: int = Field(default=8 * 1024**3, description="MemAvailable under this: warn." + _SIZE)
    refuse_start_below: int = Field(default=16 * 1024**3, description=(
        "MemAvailable under this: refuse a start." + _SIZE))
    stop_below: int = Field(default=4 * 1024**3, description=(
        "MemAvailable under this: stop vLLM (SIGTERM, `stop_grace_s`, SIGKILL)." + _SIZE))
    kill_below: int = Field(default=2 * 1024**3, description="MemAvailable under this: SIGKILL the vLLM tree." + _SIZE)
    recover_margin: int = Field(default=1024**3, description=(
        "A level holds until MemAvailable (or MemFree) is back above its floor plus this." + _SIZE))
    debounce_samples: int = Field(default=3, ge=1, description=(
        "Consecutive samples past a floor before the guard acts."))
    free_below: int = Field(default=2 * 1024**3, description=(
        "MemFree under this counts as a stop, while MemAvailable is under `free_gate_below`." + _SIZE))
    free_gate_below: int = Field(default=8 * 1024**3, description=(
        "The MemFree trigger applies only under this MemAvailable (MemFree sits near zero whenever the page "
        "cache is full)." + _SIZE))
    psi_full_avg10_escalate: float | None = Field(default=40.0, gt=0, le=100, description=(
        "PSI `full avg10` (percent) at or above this lifts a warn/stop level one stage; false: off."))
    nvrm_escalate_s: float = Field(default=10.0, ge=0, description=(
        "NV_ERR_NO_MEMORY in the kernel log within this many seconds lifts a warn/stop level one stage (0: off)."))
    stop_grace_s: float = Field(default=30.0, ge=0, description="A guard stop: SIGTERM, this grace, then SIGKILL.")
    cooldown_s: float = Field(default=15.0, ge=0, description=(
        "After a kill (after a stop: its grace plus this) no repeat and no start: memory takes time to return."))
    min_interval_s: float = Field(default=0.005, gt=0, description="Shortest sampling interval.")
    max_interval_s: float = Field(default=1.0, gt=0, description=(
        "Longest sampling interval; between the two it is the distance to the next floor over `fill_rate`."))
    starting_interval_s: float = Field(default=0.025, gt=0, description="Sampling interval while vLLM starts.")
    fill_rate: int = Field(default=16 * 1024**3, gt=0, description=(
        "Bytes per second the pool can plausibly drain at (sets the adaptive interval)." + _SIZE))
    psi_trigger: str | None = Field(default="some 150000 1000000", description=(
        "Kernel PSI trigger (`<some|full> <stall us> <window us>`) that wakes the sampler; false: polling only."))
    kernel_log: bool = Field(default=True, description="Read the kernel log (/dev/kmsg) for NVRM and OOM lines.")
    trend_window_s: float = Field(default=600.0, gt=0, description=(
        "Leak trend: Theil-Sen slope of MemAvailable over this."))
    trend_step_s: float = Field(default=10.0, gt=0, description="Leak trend: one point per this many seconds.")
    trend_min_span_s: float = Field(default=120.0, gt=0, description="Leak trend: no prediction from a shorter span.")
    trend_warn_s: float = Field(default=3600.0, ge=0, description=(
        "Warn when the stop floor is predicted closer than this (seconds)."))
    trend_restart_s: float | None = Field(default=None, gt=0, description=(
        "Ask for a planned restart at the next idle moment when the floor is closer than this; unset: never."))
    meminfo_path: Path = Field(default=Path("/proc/meminfo"), description="Source of memory figures.")
    pressure_path: Path = Field(default=Path("/proc/pressure/memory"), description="Source of PSI figures.")
    kmsg_path: Path = Field(default=Path("/dev/kmsg"), description="Source of kernel log lines.")

    @field_validator(
        "warn_below", "refuse_start_below", "stop_below", "kill_below", "recover_margin", "free_below",
        "free_gate_below", "fill_rate", mode="before",
    )
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)

    @field_validator(
        "warn_below", "refuse_start_below", "stop_below", "kill_below", "recover_margin", "free_below",
        "free_gate_below",
    )
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    @field_validator("psi_trigger")
    @classmethod
    def _trigger(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(some|full) \d+ \d+", value):
            raise ValueError(f"{value!r} is not a PSI trigger like 'some 150000 1000000'")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> GuardConfig:
        if not self.kill_below < self.stop_below < self.warn_below:
            raise ValueError("need kill_below < stop_below < warn_below")
        if self.refuse_start_below < self.stop_below:
            raise ValueError("refuse_start_below must be >= stop_below (a start under it would be stopped)")
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s must be <= max_interval_s")
        return self
