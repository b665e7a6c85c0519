"""The runbook a live sparkd serves on its own HTTP port (``/runbook``, open like ``/metrics``), and every alert's
runbook_url followed to an anchor of it: a real Prometheus scrapes the daemon and renders each shipped alert's own
runbook_url template with the labels of that scrape (one always-firing copy of each alert, its annotation unchanged),
and each rendered link is fetched from the daemon and its anchor found in the page."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag

import pytest
import yaml
from daemon_harness import Sparkd, base_config, peer_token
from freeport import free_port
from waiting import until

from sparkd.supervisor.runbook import anchor

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "packaging" / "prometheus" / "sparkd-alerts.yml"


class Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ident = dict(attrs).get("id")
        if ident:
            self.ids.add(ident)


def fetch(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def anchors(page: bytes) -> set[str]:
    parser = Ids()
    parser.feed(page.decode())
    return parser.ids


def shipped_alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Sparkd]:
    cfg = base_config(tmp_path, free_port(),
                      api={"port": free_port(), "listen": "127.0.0.1", "token_file": str(peer_token(tmp_path / "t"))})
    d = Sparkd(tmp_path, cfg)
    d.start()
    port = cfg["api"]["port"]
    until(lambda: fetch(f"http://127.0.0.1:{port}/metrics")[0] == 200, "sparkd's TCP port", 60, tolerate=(OSError,))
    yield d
    d.end()


def test_the_runbook_is_served_open_read_only_with_an_anchor_per_alert_and_failure_class(daemon: Sparkd) -> None:
    base = f"http://127.0.0.1:{daemon.config['api']['port']}"
    code, headers, page = fetch(f"{base}/runbook")
    assert code == 200 and headers["content-type"] == "text/html; charset=utf-8"
    ids = anchors(page)
    assert {anchor(rule["alert"]) for rule in shipped_alerts()} <= ids
    assert {"oom", "nccl", "config_error", "reboot_needed", "killed_by_guard", "the-host-froze"} <= ids
    code, _, body = fetch(f"{base}/runbook", "HEAD")
    assert code == 200 and body == b""
    assert fetch(f"{base}/runbook", "POST")[0] == 405
    assert fetch(f"{base}/v1/status")[0] in (401, 403)  # the rest of the port stays the peers' alone


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus is missing (tests/infra/ensure-tools.sh installs it)")
def test_every_alerts_runbook_url_resolves_to_an_anchor_through_sparkds_own_port(daemon: Sparkd,
                                                                                    tmp_path: Path) -> None:
    port, target = free_port(), f"127.0.0.1:{daemon.config['api']['port']}"
    folder = tmp_path / "prometheus"
    folder.mkdir()
    alerts = shipped_alerts()
    # Each shipped alert's runbook_url, unchanged, on an alert that fires for the scraped daemon at once.
    copies = [{"alert": f"Link{rule['alert']}", "expr": 'sparkd_build_info{job="sparkd"}', "for": "0m",
               "annotations": {"runbook_url": rule["annotations"]["runbook_url"]}} for rule in alerts]
    (folder / "links.yml").write_text(json.dumps({"groups": [{"name": "links", "rules": copies}]}))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["links.yml"],
              "scrape_configs": [{"job_name": "sparkd", "static_configs": [{"targets": [target]}]}]}
    (folder / "prometheus.yml").write_text(json.dumps(config))
    with open(folder / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
        try:
            def links() -> dict[str, str] | None:
                status, _, body = fetch(f"http://127.0.0.1:{port}/api/v1/alerts")
                found = {a["labels"]["alertname"].removeprefix("Link"): a["annotations"].get("runbook_url", "")
                         for a in json.loads(body)["data"]["alerts"] if a["state"] == "firing"} if status == 200 else {}
                return found if len(found) == len(alerts) else None

            rendered = until(links, "every link alert firing", 120, tolerate=(OSError,))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    pages: dict[str, set[str]] = {}
    for name, url in sorted(rendered.items()):
        page_url, fragment = urldefrag(url)
        assert page_url == f"http://{target}/runbook" and fragment == anchor(name), (name, url)
        if page_url not in pages:
            code, _, page = fetch(page_url)
            assert code == 200, (name, url, code)
            pages[page_url] = anchors(page)
        assert fragment in pages[page_url], f"{name}: {url} names no anchor of the served runbook"
