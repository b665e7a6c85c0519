"""The runbook that ships in the package (sparkd/api/runbook.md, docs/runbook.md a link to it): one section per alert
and per failure class, the failure sections generated from the failure table (``python tests/unit/test_runbook.py``
rewrites them), rendered to HTML with the anchor each link names. Served by sparkd: tests/integration/
test_runbook_served.py."""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import yaml

from sparkd.api.runbook import headings, source, to_html
from sparkd.config.acceptance import AcceptanceConfig
from sparkd.supervisor.failures import TREATMENT, Budget, FailureClass, Scope
from sparkd.supervisor.runbook import anchor, failure_ref

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "sparkd" / "api" / "runbook.md"
RULES = REPO / "packaging" / "prometheus" / "sparkd-alerts.yml"
BEGIN, END = "<!-- failures:begin -->", "<!-- failures:end -->"

_DOES = {
    (True, Budget.one): "restarts vLLM with backoff; each failure counts once toward `[restart] budget_failures`, and "
                        "past the budget the breaker opens (SparkdBreakerOpen)",
    (True, Budget.guard_kill): "restarts vLLM once the guard's cool-down is over; each counts "
                               "`[restart] guard_kill_weight` failures toward the budget, so repeated kills open the "
                               "breaker sooner",
    (True, Budget.none): "waits and tries again with backoff without spending the restart budget: this class never "
                         "opens the breaker",
    (False, Budget.one): "opens the restart breaker at once: the same launch would fail the same way again",
}


def _held(policy: str) -> str:
    """What sparkd does about an acceptance gate verdict (sparkd/supervisor/lifecycle.py rules 7 to 9)."""
    default = AcceptanceConfig.model_fields[policy].default
    return (f"never stops or restarts vLLM for it: a restart gives the same answers. After a start, `[acceptance] "
            f"{policy}` decides (default `{default}`): `refuse` keeps vLLM running but not ready (the state "
            "`accepting`, `sparkd_ready` 0) until `sparkctl accept` passes, or a restart or a stop; `warn` serves "
            "with the verdict said (the state `degraded`); so after an adoption (a new sparkd over a running vLLM). "
            "Found by a replay while vLLM serves (idle, at `[acceptance] replay_interval_s`, or after a wake), it is "
            "`degraded` whatever the policy, until `sparkctl accept` passes or vLLM restarts. Either way the verdict "
            "is in `sparkctl status` and an incident, written once per verdict"
            + (", and SparkdAnswersChanged pages" if policy == "on_wrong_answers" else ""))


_EVIDENCE = {"meminfo": "`/proc/meminfo` at the time", "container": "the container's inspect (when there is one)",
             "kernel_log": "the kernel log's tail (OOM kills, NVRM, Xid, AER)",
             "guard": "the memory guard's last samples and trend"}


def failure_sections() -> str:
    out = []
    for cls, t in TREATMENT.items():
        evidence = ", ".join(_EVIDENCE[e] for e in sorted(e.value for e in t.evidence))
        group = (" On a group the cause lies between the ranks, and the group restarts as one unit, workers first."
                 if t.scope is Scope.pair else "")
        does = _held(t.policy) if t.policy else _DOES[(t.restartable, t.budget)]
        out.append(f"### {cls.value}\n\n**What it means.** {t.what}.\n\n**What sparkd does.** It "
                   f"{does}.{group}\n\n**What to do.** {t.do[0].upper()}{t.do[1:]}.\n\n"
                   "**Where to look.** The incident folder of the failure (`sparkctl incidents`) holds vLLM's log "
                   f"tail, {evidence}; `sparkd explain` on its `log-tail.txt` says the class again.")
    return "\n\n".join(out)


def rendered(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{failure_sections()}\n{END}{tail}"


class Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(str(found["id"]))
        if tag == "a" and found.get("href"):
            self.hrefs.append(str(found["href"]))


def parsed(page: str) -> Ids:
    ids = Ids()
    ids.feed(page)
    return ids


def test_the_failure_sections_are_the_failure_table() -> None:
    text = RUNBOOK.read_text()
    assert text == rendered(text), "stale: run `python tests/unit/test_runbook.py`"


def test_docs_runbook_is_the_packaged_one() -> None:
    docs = REPO / "docs" / "runbook.md"
    assert docs.is_symlink() and docs.resolve() == RUNBOOK.resolve()
    assert source() == RUNBOOK.read_text()


def test_every_alert_and_every_failure_class_has_its_anchor_in_the_page() -> None:
    ids = set(parsed(to_html(source())).ids)
    alerts = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert len(alerts) >= 14 and {anchor(a) for a in alerts} <= ids
    assert {failure_ref(cls.value).removeprefix("/runbook#") for cls in FailureClass} <= ids
    assert failure_ref("oom") == "/runbook#oom" and failure_ref("oom", "http://h:9479/") == "http://h:9479/runbook#oom"


def test_the_page_links_every_section_and_every_anchor_is_unique() -> None:
    page = parsed(to_html(source()))
    assert len(page.ids) == len(set(page.ids))
    sections = {ident for level, _, ident in headings(source()) if level in (2, 3)}
    assert {h.removeprefix("#") for h in page.hrefs if h.startswith("#")} >= sections


def test_the_renderer_escapes_and_keeps_code_apart() -> None:
    page = to_html("## A <b> & `x <y>` **bold**\n\npara `**not bold**` and [a link](http://x/#y)\n\n"
                   "```sh\nsparkctl status <n>\n## not a heading\n```\n\n- one\n  more\n- two\n\n"
                   "## A <b> & `x <y>` **bold**\n")
    assert '<h2 id="a-b--x-y-bold">A &lt;b&gt; &amp; <code>x &lt;y&gt;</code> <strong>bold</strong>' in page
    assert '<h2 id="a-b--x-y-bold-1">' in page  # a repeated heading gets its own anchor
    assert "<code>**not bold**</code>" in page and '<a href="http://x/#y">a link</a>' in page
    assert "<pre><code>sparkctl status &lt;n&gt;\n## not a heading</code></pre>" in page
    assert "<ul><li>one more</li><li>two</li></ul>" in page and 'id="not-a-heading"' not in page
    assert re.search(r"<title>sparkd \S+ runbook</title>", page)





def test_the_dashboards_failure_panel_links_each_class_to_its_section() -> None:
    import json

    dashboard = json.loads((REPO / "packaging" / "grafana" / "sparkd-dashboard.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith("Failures by class")]
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    assert link["url"] == "http://${__field.labels.instance}/runbook#${__field.labels.class}"
    ids = set(parsed(to_html(source())).ids)
    assert {cls.value for cls in FailureClass} <= ids  # every value of the class label is an anchor

if __name__ == "__main__":
    RUNBOOK.write_text(rendered(RUNBOOK.read_text()))
    sys.exit(0)
