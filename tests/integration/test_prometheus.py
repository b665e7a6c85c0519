"""A real Prometheus (Debian's) scrapes a live sparkd with the shipped alert rules loaded: after repeated vLLM
kills, SparkdRestartingOften fires in Prometheus's own API. Also: every metric the rules and the dashboard
name is one sparkd exports (or is listed here, with the reason it is absent from a single node)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Sparkd, base_config
from freeport import free_port
from waiting import until

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "packaging" / "prometheus" / "sparkd-alerts.yml"
DASHBOARD = REPO / "packaging" / "grafana" / "sparkd-dashboard.json"

# Named by the rules or the dashboard but not exported by a lone node's daemon, and why.
ABSENT_HERE = {
    "sparkd_peer_up": "a node with [cluster] peers exports it",
    "sparkd_guard_seconds_to_floor": "the guard's trend needs minutes of samples",
}
# The GPU families: exported by a node with NVIDIA GPUs, as a real H100 node's daemon did (tests/data/gpu).
ABSENT_HERE |= {name: "a node with NVIDIA GPUs exports it (tests/data/gpu/h100x2-metrics-ready.txt)" for name in
                re.findall(r"^(sparkd_gpu_\w+)\{", (REPO / "tests" / "data" / "gpu" / "h100x2-metrics-ready.txt")
                           .read_text(), re.M)}
OWN_RUNBOOK = "https://wiki.example/ops/sparkd-runbook"
# The rules use these before the daemon exports them (SparkdStartStuck); the daemon shell adds them.
PENDING: set[str] = set()

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="Debian's prometheus is missing (tests/infra/ensure-tools.sh installs it)")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bsparkd_\w+", expr))


def loaded_rules(base: str) -> dict[str, dict[str, Any]]:
    groups = get_json(f"{base}/api/v1/rules")["data"]["groups"]
    return {rule["name"]: rule for group in groups for rule in group["rules"]}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Sparkd]:
    cfg = base_config(tmp_path, free_port(), api={"port": free_port(), "listen": "127.0.0.1"},
                      acceptance={"enabled": True})  # its families, the gate's seconds and bad outputs too
    d = Sparkd(tmp_path, cfg)
    d.start()
    d.wait_state("ready", timeout=90)
    yield d
    d.end()


@pytest.fixture
def prometheus(tmp_path: Path, daemon: Sparkd) -> Iterator[str]:
    port = free_port()
    folder = tmp_path / "prometheus"
    folder.mkdir()
    shutil.copy(RULES, folder / RULES.name)  # the shipped rules, unchanged
    config = {
        # The operator's own runbook (the rules' header says how): every alert's runbook_url follows it.
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "external_labels": {"sparkd_runbook_base": OWN_RUNBOOK}},
        "rule_files": [RULES.name],
        "scrape_configs": [{"job_name": "sparkd",
                            "static_configs": [{"targets": [f"127.0.0.1:{daemon.config['api']['port']}"]}]}],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _ready(base), "Prometheus ready", 60, log=folder / "prometheus.log")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def firing(base: str, name: str) -> list[dict[str, Any]]:
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_restart_alert_fires_in_prometheus_after_repeated_vllm_kills(daemon: Sparkd, prometheus: str) -> None:
    target = f"127.0.0.1:{daemon.config['api']['port']}"
    loaded = loaded_rules(prometheus)
    assert len(loaded) == RULES.read_text().count("- alert: ")
    assert {"SparkdRestartingOften", "SparkdBreakerOpen", "SparkdGuardKilled"} <= loaded.keys()
    until(lambda: any(t["health"] == "up" for t in get_json(f"{prometheus}/api/v1/targets")["data"]
                         ["activeTargets"]), "the sparkd target up", 60)
    until(lambda: all(r["health"] == "ok" for r in loaded_rules(prometheus).values()), "every rule evaluated", 60)
    assert firing(prometheus, "SparkdRestartingOften") == []
    for n in range(5):
        pid = daemon.wait_state("ready", timeout=90)["pid"]
        time.sleep(1.5)  # a scrape (every 1 s) sees each count
        os.kill(pid, signal.SIGKILL)
        daemon.wait_for(lambda s, pid=pid: s.get("state") == "ready" and s.get("pid") != pid, 90,
                        f"ready again after kill {n + 1}")
    alerts = until(lambda: firing(prometheus, "SparkdRestartingOften"), "SparkdRestartingOften firing", 120)
    (alert,) = alerts
    assert alert["labels"]["instance"] == target and alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"] == f"{OWN_RUNBOOK}#sparkdrestartingoften"
    assert alert["annotations"]["runbook_file"] == "file:///usr/share/doc/sparkd/runbook.md#sparkdrestartingoften"
    assert float(alert["value"]) > 3
    assert firing(prometheus, "SparkdBreakerOpen") == []  # the budget in this config is 50


def test_rules_and_dashboard_name_only_exported_metrics(daemon: Sparkd, prometheus: str) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.config['api']['port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    exported = set(re.findall(r"^# TYPE (\w+)", text, re.M))
    exported |= {f"{name}_{suffix}" for name in exported for suffix in ("total", "bucket", "count", "sum")}
    dashboard = json.loads(DASHBOARD.read_text())
    used = {m for rule in loaded_rules(prometheus).values() for m in metric_names(rule["query"])}
    used |= {m for p in dashboard["panels"] for t in p["targets"] for m in metric_names(t["expr"])}
    unknown = used - exported - ABSENT_HERE.keys() - PENDING
    assert not unknown, f"named by the rules or the dashboard, exported by no sparkd: {unknown}"
    landed = PENDING & exported
    assert not landed, f"{landed} are exported now: remove them from PENDING"


AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|stddev|stdvar|quantile|group)\s+by\s*\(([^)]*)\)")


def test_alerts_and_dashboard_work_per_group() -> None:
    """A rank of a group labels its metrics with ``group`` and ``rank``: no rule aggregates them away, and
    SparkdDown (``up`` has no sparkd labels) takes them from the rank's last build info — promtool's cases in
    sparkd-alerts.test.yml (test_observe) show each alert carrying them. The dashboard selects a group, its node
    selector then lists that group's nodes, every panel follows the node selector, and one panel shows the ranks."""
    rules = RULES.read_text()
    clauses = AGGREGATION.findall(rules)
    assert clauses, "the rules aggregate somewhere"
    for op, labels in clauses:
        kept = {label.strip() for label in labels.split(",")}
        assert {"instance", "group", "rank"} <= kept, f"{op} by ({labels}) drops a group's labels"
    assert "group_left(group, rank)" in rules.split("- alert: SparkdDown")[1].split("- alert:")[0]

    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    group = variables["group"]
    assert group["query"]["query"] == 'label_values(sparkd_build_info{job="sparkd"}, group)'
    assert group["includeAll"] and group["allValue"] == ".*"  # All matches lone nodes too (no group label)
    assert 'group=~"$group"' in variables["instance"]["query"]["query"]
    names = list(variables)
    assert names.index("group") < names.index("instance"), "the node selector depends on the group"
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # vLLM's own metrics (job="vllm") follow the node selector through its hosts (test_dashboard)
    follows = ('instance=~"$instance"', 'instance=~"${host:regex}:[0-9]+"')
    assert all(any(f in e for f in follows) for e in exprs), [e for e in exprs if not any(f in e for f in follows)]
    assert 'instance=~"$instance"' in variables["host"]["query"]["query"]
    assert any('group=~"$group"' in e and "by (group, rank" in e for e in exprs), "a panel of the group's ranks"
