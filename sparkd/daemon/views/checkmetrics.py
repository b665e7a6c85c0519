"""The metric families of the group's proofs (``sparkd.daemon.effects.groupchecks``): what the last fabric check
measured for each worker, the bandwidth where it was run, and the weights comparison. Read from status, like the
rest."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily


def families(keys: list[str], values: list[str], status: Mapping[str, Any]) -> Iterator[Any]:
    fabric = status.get("fabric")
    if fabric is not None:
        ok = GaugeMetricFamily("sparkd_fabric_ok", "1 when the last fabric check of the link to this worker held.",
                               labels=[*keys, "peer"])
        mtu = GaugeMetricFamily("sparkd_fabric_mtu_bytes", "The fabric interface's MTU at the last check, by end.",
                                labels=[*keys, "peer", "end", "interface"])
        speed = GaugeMetricFamily("sparkd_fabric_speed_mbps", "The fabric link's speed (Mb/s) at the last check.",
                                  labels=[*keys, "peer", "end", "interface"])
        bandwidth = GaugeMetricFamily("sparkd_fabric_bandwidth_gbps", "RDMA write bandwidth (Gb/s) to this worker "
                                      "measured by ib_write_bw at the last start ([fabric] bandwidth).",
                                      labels=[*keys, "peer"])
        for entry in fabric:
            peer = str(entry.get("peer"))
            if entry.get("ok") is not None:
                ok.add_metric([*values, peer], 1.0 if entry["ok"] else 0.0)
            for end in ("head", "worker"):
                link = entry.get(end) or {}
                if link.get("mtu") is not None:
                    mtu.add_metric([*values, peer, end, str(link.get("interface"))], float(link["mtu"]))
                if link.get("speed_mbps") is not None:
                    speed.add_metric([*values, peer, end, str(link.get("interface"))], float(link["speed_mbps"]))
            if entry.get("bandwidth_gbps") is not None:
                bandwidth.add_metric([*values, peer], float(entry["bandwidth_gbps"]))
        yield from (ok, mtu, speed, bandwidth)
    weights = status.get("weights") or {}
    group, local = weights.get("group"), weights.get("local")
    if group is not None and group.get("ok") is not None:
        family = GaugeMetricFamily("sparkd_weights_same", "1 when every node's model directory matched the head's at "
                                   "the last comparison.", labels=keys)
        family.add_metric(values, 1.0 if group["ok"] else 0.0)
        yield family
    if local is not None:
        pending = GaugeMetricFamily("sparkd_weights_hash_pending_files", "Shards of this node's model directory whose "
                                    "hash is pending (compared by size until hashed).", labels=keys)
        pending.add_metric(values, float(local.get("pending") or 0))
        yield pending
