"""The config sections of the group's two pre-start proofs: ``[fabric]`` (the link between the nodes, measured
by the head before every start of a group) and ``[weights]`` (the model directory identical on every node).
What the checks do: ``sparkd/cluster/fabric_check.py`` and ``sparkd/cluster/weights.py``.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from sparkd.config.sections import _Section

ALWAYS_HASHED = (
    "config.json", "*.index.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
    "added_tokens.json", "vocab*", "merges.txt", "*.tiktoken", "chat_template*",
)


class FabricConfig(_Section):
    """The active fabric check: link state, speed and MTU of both ends, a don't-fragment ping at the MTU each
    way, the RoCE GID, the master port; optionally a short RDMA bandwidth run."""

    check: bool = Field(default=True, description=(
        "On a group's head: measure the fabric to every worker before each start (a few seconds)."))
    interface: str | None = Field(default=None, description=(
        "This node's fabric interface (e.g. `enp1s0f0np0`). Default: the interface holding `[node] address`."))
    mtu: int | None = Field(default=None, ge=68, le=65535, description=(
        "The MTU the fabric must have on both ends, proven by a don't-fragment ping of this size each way (9000 "
        "for jumbo frames). Unset: both ends must agree, and the ping is sent at their MTU."))
    min_speed_mbps: int | None = Field(default=None, gt=0, description=(
        "The lowest link speed (Mb/s) either end may report (200000 for a DGX Spark's CX7). Unset: both ends "
        "must agree."))
    timeout_s: float = Field(default=4.0, gt=0, le=60, description=(
        "The whole fabric check's bound (every peer in parallel), bandwidth run aside."))
    bandwidth: bool = Field(default=False, description=(
        "Also run `ib_write_bw` between the nodes where vLLM runs (when the image has it): about "
        "`bandwidth_s` + 3 s per start; the figure is in status and metrics."))
    bandwidth_s: int = Field(default=2, ge=1, le=30, description="Duration of the bandwidth run (`ib_write_bw -D`).")
    min_bandwidth_gbps: float | None = Field(default=None, gt=0, description=(
        "Refuse a start when the measured bandwidth (Gb/s) is below this. Unset: only reported."))
    bandwidth_port: int = Field(default=18515, ge=1, le=65535, description=(
        "The TCP port `ib_write_bw` exchanges its connection data on (on the worker)."))


class WeightsConfig(_Section):
    """Weights parity: a manifest of the model directory on every node, compared by the head before a start."""

    parity: bool = Field(default=True, description=(
        "On a group's head: compare every node's manifest of the model directory before each start and refuse "
        "when a file differs."))
    path: str | None = Field(default=None, description=(
        "The model directory on the host. Default: `[launch] model` (a local path), read through the "
        "`[container] mounts` that hold it."))
    always_hash: list[str] = Field(default_factory=lambda: list(ALWAYS_HASHED), description=(
        "Files hashed (sha256) at every start, whatever their size and mtime (fnmatch over the name)."))
    ignore: list[str] = Field(default_factory=lambda: [".*", "*.md", "LICENSE*", "*.png", "*.jpg"], description=(
        "Files and directories left out of the manifest (fnmatch over each path component)."))
    hash_budget_s: float = Field(default=20.0, ge=0, description=(
        "The longest a start spends hashing shards that are new or whose size or mtime changed; the rest are "
        "hashed after it, in the background, and compared by size until then (a warning)."))

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path")
        return value
