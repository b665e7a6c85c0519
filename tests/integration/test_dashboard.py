"""The Grafana dashboard against the metrics it reads, so that it cannot drift: every metric name in every
expression (panels, the restart annotations, the variables) is one a live sparkd exports on /metrics (or is
listed here with why a lone node lacks it), and every ``vllm:*`` name is on the page of the vLLM stand-in that
daemon supervises and on the real vLLM 0.32's page (tests/data/vllm-metrics-032.txt, from the real-vLLM tier)
where the checkout has it. The alert rules' names are held the same way."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon_harness import Sparkd, base_config
from freeport import free_port

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "packaging" / "grafana" / "sparkd-dashboard.json"
RULES = REPO / "packaging" / "prometheus" / "sparkd-alerts.yml"
REAL_VLLM_PAGE = REPO / "tests" / "data" / "vllm-metrics-032.txt"
GPU_PAGE = REPO / "tests" / "data" / "gpu" / "h100x2-metrics-ready.txt"

# sparkd names a lone node without GPUs does not export, and why.
ABSENT_HERE = {
    "sparkd_peer_up": "a node with [cluster] peers exports it",
    "sparkd_guard_seconds_to_floor": "the guard's trend needs minutes of samples",
}
PROMETHEUS_OWN = {"up"}  # Prometheus's own series about each target

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_CLAUSES = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_CALLS = re.compile(r"\b[a-zA-Z_]\w*\s*\(")
_TOKENS = re.compile(r"(?P<number>\d[\w.]*)|(?P<name>[a-zA-Z_:][\w:]*)")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "Inf", "NaN"}


def promql_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label names, functions, keywords and numbers left out)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _CLAUSES.sub(" ", text)
    text = _CALLS.sub("(", text)
    return {m["name"] for m in _TOKENS.finditer(text) if m["name"] and m["name"] not in _KEYWORDS}


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression the dashboard runs: panel targets, annotation queries, variable queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard.get("annotations", {}).get("list", []) if "expr" in a]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"])
            exprs.append(found.group(1) if found else query["query"])
    return exprs


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def page_names(text: str) -> set[str]:
    """The names a /metrics page offers: every sample's, and each family's with its suffixes."""
    names = {re.split(r"[{\s]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    families = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    return names | families | {f"{f}_{s}" for f in families for s in ("total", "bucket", "count", "sum")}


def used_names() -> set[str]:
    return {n for e in dashboard_expressions(json.loads(DASHBOARD.read_text())) for n in promql_names(e)}


def test_promql_names_reads_names_not_labels_functions_or_numbers() -> None:
    assert promql_names('sum by (instance, reason) (increase(sparkd_restarts_total{job="sparkd", '
                        'instance=~"$instance"}[2m])) > 0') == {"sparkd_restarts_total"}
    assert promql_names('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_'
                        'bucket{instance=~"${host:regex}:[0-9]+"}[$__rate_interval])))') == \
        {"vllm:time_to_first_token_seconds_bucket"}
    assert promql_names("(up == 0) * on(instance) group_left(group, rank) topk by (instance) "
                        "(1, last_over_time(sparkd_build_info[1d])) or up offset 1h > 1e9") == \
        {"up", "sparkd_build_info"}
    assert promql_names("a_metric unless on(instance) b_metric and c:metric") == {"a_metric", "b_metric", "c:metric"}


def test_dashboard_shows_vllm_and_marks_restarts() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    by_title = {p["title"]: p for p in dashboard["panels"]}
    wanted = {
        "vLLM tokens/s": {"vllm:generation_tokens_total", "vllm:prompt_tokens_total"},
        "vLLM requests running / waiting": {"vllm:num_requests_running", "vllm:num_requests_waiting"},
        "vLLM KV cache usage": {"vllm:kv_cache_usage_perc"},
        "vLLM time to first token": {"vllm:time_to_first_token_seconds_bucket"},
    }
    for title, names in wanted.items():
        exprs = [t["expr"] for t in by_title[title]["targets"]]
        assert {n for e in exprs for n in promql_names(e)} == names, title
        # vLLM is scraped as its own job on the hosts of the selected sparkd nodes
        assert all('job="vllm", instance=~"${host:regex}:[0-9]+"' in e for e in exprs), exprs
    assert "rate(vllm:generation_tokens_total" in by_title["vLLM tokens/s"]["targets"][0]["expr"]
    assert by_title["vLLM KV cache usage"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "histogram_quantile(0.95" in by_title["vLLM time to first token"]["targets"][1]["expr"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    host = variables["host"]
    assert 'instance=~"$instance"' in host["query"]["query"] and host["regex"] == "/^(.*):[0-9]+$/"
    assert re.fullmatch(host["regex"].strip("/"), "spark1.lan:9479").group(1) == "spark1.lan"  # type: ignore[union-attr]
    assert re.fullmatch(host["regex"].strip("/"), "[fd00::1]:9479").group(1) == "[fd00::1]"  # type: ignore[union-attr]
    names = list(variables)
    assert names.index("instance") < names.index("host"), "the hosts follow the node selector"
    (restarts,) = [a for a in dashboard["annotations"]["list"] if a["name"] == "vLLM restarts"]
    assert restarts["enable"] and promql_names(restarts["expr"]) == {"sparkd_restarts_total"}
    assert 'instance=~"$instance"' in restarts["expr"] and restarts["expr"].endswith("> 0")
    assert "{{reason}}" in restarts["titleFormat"] and "reason" in restarts["tagKeys"]
    # the GPU panels stay
    assert {"GPU memory", "GPU power", "GPU utilization", "GPU temperature and ECC"} <= by_title.keys()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_vllm_names_are_on_the_real_vllm_page() -> None:
    if not REAL_VLLM_PAGE.exists():
        pytest.skip(f"{REAL_VLLM_PAGE.relative_to(REPO)} is not in this checkout (the real-vLLM tier writes it)")
    wanted = {n for n in used_names() if n.startswith("vllm:")}
    assert wanted, "the dashboard reads vLLM's own metrics"
    missing = wanted - page_names(REAL_VLLM_PAGE.read_text())
    assert not missing, f"not on the real vLLM 0.32 page: {missing}"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Sparkd]:
    # the acceptance gate on: its families, the gate's seconds and bad outputs too
    d = Sparkd(tmp_path, base_config(tmp_path, free_port(), api={"port": free_port(), "listen": "127.0.0.1"},
                                     acceptance={"enabled": True}))
    d.start()
    d.wait_state("ready", timeout=90)
    yield d
    d.end()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_every_name_the_dashboard_and_rules_use_is_exported(daemon: Sparkd) -> None:
    sparkd_page = page_names(get(f"http://127.0.0.1:{daemon.config['api']['port']}/metrics"))
    vllm_page = page_names(get(f"http://127.0.0.1:{daemon.config['launch']['port']}/metrics"))
    gpu_only = page_names(GPU_PAGE.read_text()) - sparkd_page  # exported by a node with NVIDIA GPUs (tests/data/gpu)
    dashboard = used_names()
    rules = {n for e in rule_expressions() for n in promql_names(e)}
    assert {n for n in dashboard if n.startswith("vllm:")} and {n for n in dashboard if n.startswith("sparkd_")}
    unknown = {n for n in dashboard | rules if not n.startswith("vllm:")} - sparkd_page - gpu_only \
        - ABSENT_HERE.keys() - PROMETHEUS_OWN
    assert not unknown, f"named by the dashboard or the rules, exported by no sparkd: {unknown}"
    missing = {n for n in dashboard if n.startswith("vllm:")} - vllm_page
    assert not missing, f"the dashboard reads vLLM metrics the stand-in does not export: {missing}"
    landed = ABSENT_HERE.keys() & sparkd_page
    assert not landed, f"{landed} are exported by a lone node now: take them out of ABSENT_HERE"
