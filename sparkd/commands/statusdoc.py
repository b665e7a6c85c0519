"""The status document: what ``GET /v1/status``, ``status.json`` and ``sparkctl status`` carry, typed once.

The daemon builds it (``sparkd.daemon.views.status``); the commands read it (``control.status()``), the head
reads its peers' (``sparkd.cluster``), sparkctl renders it. A peer's comes over the network: a key an older
sparkd does not send is read with ``.get``. Values this module leaves as ``dict[str, Any]`` are documents of
their own, built and read by one module each (the config's state, the start timing, the GPU view, …).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Breaker(TypedDict):
    open: bool
    reason: str | None


# "class" is a keyword, hence the functional form; read it as failure["class"] (a FailureClass value).
Failure = TypedDict("Failure", {"class": str, "message": str, "at": float | None, "exit_code": int | None,
                                "signal": int | None, "evidence": str | None})


class DaemonHealth(TypedDict):
    degraded: bool
    problems: list[str]


class PeerEntry(TypedDict):
    """One other rank of the group as this node sees it (``via`` "the head": as its head sees it)."""

    peer: str
    reachable: bool
    node: str | None
    rank: int | None
    state: str | None
    pid: int | None
    last_failure: str | None  # its class
    via: NotRequired[str]


class Extras(TypedDict, total=False):
    """What other parts of the daemon add: the flight recorder (and the memory settle's phase while it runs)."""

    recorder: dict[str, Any]
    phase: str | None


class Checks(TypedDict, total=False):
    """The group's proofs before a start (``sparkd.daemon.effects.groupchecks``)."""

    fabric: list[dict[str, Any]] | None
    weights: dict[str, Any]


class Status(Extras, total=False):
    """The status of one node. The daemon always sends every key below; ``recorder``, ``fabric`` and ``weights``
    too, but a status read from a peer or a file may lack any of them."""

    version: str
    node: str
    role: str
    rank: int
    gpus_per_node: int
    runtime: str
    state: str  # a lifecycle State value
    since: float | None
    ready: bool
    intent: str
    pid: int | None
    container_id: str | None
    restarts: int
    launches: int
    uptime_s: float | None
    shards: list[int | None] | None
    kv_cache_tokens: int | None
    max_concurrency: float | None
    last_start_s: float | None
    start_timing: dict[str, Any] | None
    health: str | None
    watch_note: str | None
    breaker: Breaker
    backoff_until: float | None
    last_failure: Failure | None
    config_hash: str
    daemon_pid: int
    updated_at: float
    daemon: DaemonHealth
    config: dict[str, Any]
    history: list[dict[str, Any]]
    pair: str | None
    shared: dict[str, Any]
    image: dict[str, Any] | None
    image_id: str | None
    drift: list[dict[str, Any]]
    peers: list[PeerEntry]
    memory: dict[str, Any]
    gpu: dict[str, Any] | None
    last_stop: dict[str, Any] | None
    # The acceptance gate (issue 37; Standing.view): "enabled", "running" ({kind, line}), the standing "verdict",
    # "refused", "kind", "at", "sentence", "seconds", "parts", "class", and "history" (the last runs).
    acceptance: dict[str, Any]
    fabric: list[dict[str, Any]] | None
    weights: dict[str, Any]
    runbook: str | None  # where the node serves its runbook: ``http://host:9479`` (no TCP port: None)
    notify: dict[str, Any] | None  # the notifier's targets and their state (sparkd.notify.sender.Notifier.status);
    # None: [notify] has no targets
    drain: dict[str, Any] | None  # the stop in progress drains vLLM's requests (sparkd.supervisor.drainlog.Drain)
    steps: dict[str, Any] | None  # the step probe: its warning and every rank's last step (sparkd.daemon.views.steps)
