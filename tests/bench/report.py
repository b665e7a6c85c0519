"""What ``make bench`` prints: one summary table (a row per figure, beside its peer, with issue 18's (and 17's)
target and a verdict), then the memory guard's own table. Each function takes one benchmark's JSON."""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchkit import fmt, median, ratio

COLUMNS = (("n", "#"), ("figure", "figure"), ("sparkd", "sparkd"), ("peer", "peer, same run"),
           ("ratio", "ratio sparkd/peer"), ("target", "target"), ("verdict", "verdict"))
Row = dict[str, str]


def row(n: str, figure: str, sparkd: str, peer: str = "–", ratios: str = "–", target: str = "–",
        verdict: str = "–") -> Row:
    return {"n": n, "figure": figure, "sparkd": sparkd, "peer": peer, "ratio": ratios, "target": target,
            "verdict": verdict}


def verdict(value: float | None, limit: float, unit: str) -> str:
    """Targets are upper bounds: met with the margin, or missed by how much."""
    if value is None:
        return "not measured"
    if value < limit:
        return f"met ({fmt(limit - value, '.3g')} {unit} to spare)"
    return f"**missed by {fmt(value - limit, '.3g')} {unit}**"


def at_most(value: float | None, limit: float | None, unit: str) -> str:
    """Targets that allow equality ("at or below", "no more than")."""
    if value is None or limit is None:
        return "not measured"
    if value <= limit:
        return f"met ({fmt(limit - value, '.3g')} {unit} to spare)"
    return f"**missed by {fmt(value - limit, '.3g')} {unit}**"


def _cell(x: dict[str, Any]) -> str:
    return (f"{fmt(x['median_s'])} ({fmt(x['over_startup_s'], '+.2f')}), p90 {fmt(x.get('p90_s'))}, "
            f"{x['healthy']}/{x['trials']}")


STEPS = (("detect", None, "exit_seen"), ("classify", "exit_seen", "exited"), ("stop", "exited", "stopped"),
         ("sweep", "stopped", "to_backoff"), ("backoff", "to_backoff", "to_preflight"),
         ("preflight", "to_preflight", "to_starting"), ("launch", "to_starting", "launched"))


def recovery_steps(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median ms of each step from the kill to vLLM's exec, from sparkd's own log and start_timing."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in STEPS}
    checks: dict[str, list[float]] = {}
    for t in runs:
        path = dict(t.get("path_ms") or {})
        if t.get("detection_ms") is None or not path:
            continue
        path["exit_seen"] = 0.0
        for name, start, end in STEPS:
            if name == "detect":
                out[name].append(t["detection_ms"])
            elif start in path and end in path:
                out[name].append(path[end] - path[start])
        for step, seconds in ((t.get("start_timing") or {}).get("steps_s") or {}).items():
            if step.startswith("preflight."):
                checks.setdefault(step, []).append(seconds * 1000)
    medians: dict[str, float | None] = {name: median(v) for name, v in out.items()}
    for step, values in checks.items():
        medians[step] = median(values)
    return medians


def steps_cell(steps: dict[str, float | None]) -> str:
    parts = [f"{name} {fmt(steps.get(name), '.1f')}" for name, _, _ in STEPS]
    checks = {k: v for k, v in steps.items() if k.startswith("preflight.") and v is not None}
    slowest = max(checks, key=lambda k: checks[k], default=None)
    main = {k: v for k, v in steps.items() if not k.startswith("preflight.") and v is not None}
    top = max(main, key=lambda k: main[k], default=None)
    tail = f"; slowest step: {top}" if top else ""
    if slowest:
        tail += f"; slowest preflight check: {slowest.split('.', 1)[1]} {fmt(checks[slowest], '.1f')}"
    return " → ".join(parts) + " ms" + tail


def overhead_rows(n: str, label: str, rs: dict[str, Any]) -> list[Row]:
    """Recovery, its overhead against supervisord's + 50 ms, and where sparkd's goes."""
    s, sv, u = rs["sparkd"], rs["supervisord"], rs.get("unit")
    peers = f"supervisord {_cell(sv)}" + (f"; unit (real systemd) {_cell(u)}" if u else "")
    ratios = fmt(ratio(s["median_s"], sv["median_s"])) + (f"; {fmt(ratio(s['median_s'], u['median_s']))}" if u
                                                         else "")
    limit = None if sv["over_startup_s"] is None else sv["over_startup_s"] + 0.05
    rows = [row(n, f"{label}: recovery after SIGKILL, median s (+ over the stand-in's own startup), p90, "
                "healthy/trials", _cell(s), peers, ratios, "overhead ≤ supervisord's + 0.05 s",
                at_most(s["over_startup_s"], limit, "s"))]
    rows.append(row(n, f"{label}: where sparkd's recovery goes, median ms from the kill (its log and "
                    "start_timing)", steps_cell(recovery_steps(s["runs"]))))
    return rows


def detection_row(n: str, label: str, det: dict[str, Any]) -> Row:
    ds, dsv, du = det["sparkd"], det["supervisord"], det.get("unit")
    peer = f"supervisord {fmt(dsv['p50_ms'], '.1f')} / {fmt(dsv['p99_ms'], '.1f')}"
    if du:
        peer += f"; unit (journal) {fmt(du['p50_ms'], '.1f')} / {fmt(du['p99_ms'], '.1f')}"
    r50, r99 = ratio(ds["p50_ms"], dsv["p50_ms"]), ratio(ds["p99_ms"], dsv["p99_ms"])
    ok = r50 is not None and r99 is not None and r50 <= 1 and r99 <= 1
    worse = max(x for x in (r50, r99, 0.0) if x is not None)
    verdict_text = "met" if ok else ("not measured" if r50 is None else f"**missed (×{worse:.2f})**")
    classified = [t for t in det["sparkd"].get("classified_ms", []) if t is not None]
    extra = f" (classified: p50 {fmt(median(classified), '.1f')})" if classified else ""
    return row(n, f"{label}: detection, death → the supervisor's own record of it: p50 / p99 ms (n = "
               f"{ds['samples']} / {dsv['samples']})", f"{fmt(ds['p50_ms'], '.1f')} / {fmt(ds['p99_ms'], '.1f')}"
               + extra, peer, f"{fmt(r50)} / {fmt(r99)}", "p50 and p99 ≤ supervisord's", verdict_text)


def recovery_rows(rec: dict[str, Any]) -> list[Row]:
    own = rec["startup"]["median_s"]
    rs, lit = rec["recovery"], rec["litter"]
    rows = overhead_rows("1", f"process runtime (own startup {fmt(own)} s)", rs)
    if "sparkd_defaults" in rs:
        rows.append(row("1", "Recovery, sparkd's shipped restart defaults (first failure: 10 s ± 10 % backoff)",
                        _cell(rs["sparkd_defaults"]), verdict="slower by design"))
    ls, lsv, lu = lit["sparkd"], lit["supervisord"], lit["unit"]
    healthy = ls["healthy"] == ls["trials"] and not lsv["healthy"]
    rows.append(row("1", "Deaths that leave a stale VLLM::Worker on the master port and psm_* files: ended "
                    "healthy", f"{ls['healthy']}/{ls['trials']} (litter left after: {ls['stale_left']} processes, "
                    f"{ls['shm_left']} files)",
                    f"supervisord {lsv['healthy']}/{lsv['trials']} in {lsv['window_s']:.0f} s; unit (real systemd, "
                    f"process: its cgroup ends the litter) {lu['healthy']}/{lu['trials']} in {lu['window_s']:.0f} s",
                    target="all, where supervisord never recovers", verdict="met" if healthy else "**missed**"))
    rows.append(row("1", "Recovery from that litter: median s beyond the own startup",
                    f"{fmt(ls['over_startup_s'], '+.2f')} ({fmt(ls['median_s'])} s)",
                    f"supervisord never; unit {fmt(lu['over_startup_s'], '+.2f')}", target="≤ +0.3 s",
                    verdict=at_most(ls["over_startup_s"], 0.3, "s")))
    rows.append(detection_row("2", "process runtime", rec["detection"]))
    return rows


def docker_rows(dock: dict[str, Any]) -> list[Row]:
    own = dock["startup"]["median_s"]
    label = f"docker-exec runtime, one container (own startup by `docker exec` {fmt(own)} s)"
    return [*overhead_rows("8", label, dock["recovery"]), detection_row("8", "docker-exec runtime",
                                                                        dock["detection"])]


def guard_rows(guard: dict[str, Any] | None) -> list[Row]:
    title = "Memory guard: floor crossed → SIGTERM, and overshoot under the floor"
    if guard is None:
        return [row("3", title, "not run (--skip guard)")]
    if guard.get("missing"):
        return [row("3", title, f"placeholder: {guard['missing']}")]
    if guard.get("failed") or not guard.get("summary"):
        return [row("3", title, "bench_guard.py failed or measured nothing (its output is above)")]
    summary = guard["summary"]

    def cells(who: str, key: str, spec: str) -> str:
        return " / ".join(fmt(r[who][key], spec) for r in summary)

    def ratios(key: str) -> str:
        return " / ".join(fmt(r[f"ratio_{key}"], ".2f") for r in summary)

    rates = "/".join(f"{r['rate_target_gib_s']:g}" for r in summary)
    below = " / ".join(f"{r.get('overshoot_below_runs', 0)}/{r.get('paired_runs', 0)}" for r in summary)
    ok = all(r.get("paired_runs") and r.get("overshoot_below_runs") == r.get("paired_runs") for r in summary)
    runs = guard.get("meta", {}).get("runs")
    at_signal = ""
    if all("at_signal_below_runs" in r for r in summary):
        below_then = " / ".join(f"{r['at_signal_below_runs']}/{r['paired_runs']}" for r in summary)
        at_signal = (f"; under the floor when the SIGTERM arrived {cells('sparkd', 'at_signal_mib', '.0f')}, "
                     f"below earlyoom's in {below_then}")
    return [row("3", f"Memory guard at {rates} GiB/s: reaction ms (floor crossed → SIGTERM); overshoot MiB "
                f"(medians); runs where sparkd's overshoot was below earlyoom's ({runs} runs)",
                f"{cells('sparkd', 'reaction_ms', '.0f')}; {cells('sparkd', 'overshoot_mib', '.0f')}; below in "
                f"{below}{at_signal}",
                f"earlyoom {cells('earlyoom', 'reaction_ms', '.0f')}; {cells('earlyoom', 'overshoot_mib', '.0f')}"
                + (f"; at the SIGTERM {cells('earlyoom', 'at_signal_mib', '.0f')}" if at_signal else ""),
                f"{ratios('reaction_ms')}; {ratios('overshoot_mib')}",
                "overshoot below earlyoom's at every rate, in every one of 5 runs",
                "met" if ok and runs and runs >= 5 else "**missed**" if not ok else f"met in {runs} runs (need 5)")]


def wedge_rows(wedge: dict[str, Any] | None) -> list[Row]:
    """bench_wedge.py: a replay through the pure tracker on an injected clock (decision latency, not I/O), without the
    step probe and with it, through the daemon's own combination (issue 38)."""
    title = "Wedge detection (replay through the pure health tracker, injected clock: decision latency, not I/O)"
    if wedge is None:
        return [row("7", title, "not run (--skip wedge)", target="– (issue 14)")]
    if wedge.get("missing") or wedge.get("failed") or not wedge.get("scenarios"):
        return [row("7", title, "bench_wedge.py failed or measured nothing (its output is above)",
                    target="– (issue 14)")]
    rows, target = [], wedge["target_s"]
    for sc in wedge["scenarios"]:
        s, b, n = sc["sparkd"], sc["before"], sc["trials"]
        if sc["wedge"]:
            ok = verdict(s["max_s"], target + 1e-9, "s") if s["caught"] == n else "**missed (not caught)**"
            rows.append(row("7", f"Wedge: {sc['name']}: caught/trials, median (max) s after it began",
                            f"{s['caught']}/{n}, {fmt(s['median_s'], '.0f')} ({fmt(s['max_s'], '.0f')})",
                            f"before issue 14: {b['caught']}/{n}, {fmt(b['median_s'], '.0f')} "
                            f"({fmt(b['max_s'], '.0f')})", fmt(ratio(s["max_s"], b["max_s"])),
                            f"all within {target:.0f} s", ok))
        else:
            rows.append(row("7", f"False positives: {sc['name']}", f"{s['false_positives']}/{n}",
                            f"before issue 14: {b['false_positives']}/{n}", target="0",
                            verdict="met" if s["false_positives"] == 0 else "**missed**"))
        rows += _probe_rows(sc, wedge)
    cost = wedge.get("probe_cost")
    if cost:
        hooks = "; ".join(f"{who} {cost['vllm'][who]['median_ns']:.0f} ns" for who in ("engine", "worker")
                          if who in cost.get("vllm", {}))
        worst = max([cost["writer"]["median_ns"], *(cost["vllm"][w]["median_ns"] for w in ("engine", "worker")
                                                    if w in cost.get("vllm", {}))])
        rows.append(row("7", f"Step probe: its cost per step, CPU time (load {cost['load']:.1f})",
                        f"writer {cost['writer']['median_ns']:.0f} ns; in vLLM's hooks: {hooks or 'not measured'}",
                        target="≤ 1 µs median (issue 38)", verdict=at_most(worst / 1000, 1.0, "µs")))
    return rows


def _probe_rows(sc: dict[str, Any], wedge: dict[str, Any]) -> list[Row]:
    p, s, n = sc.get("with_probe"), sc["sparkd"], sc["trials"]
    if p is None:
        return []
    goal = wedge.get("probe_target_s", 15.0)
    label = "sparkd with the step probe, the daemon's combination"
    if sc["wedge"]:
        ok = verdict(p["max_s"], goal + 1e-9, "s") if p["caught"] == n else "**missed (not caught)**"
        return [row("7", f"{label}: {sc['name']}", f"{p['caught']}/{n}, {fmt(p['median_s'], '.0f')} "
                    f"({fmt(p['max_s'], '.0f')})", f"without the probe: {s['caught']}/{n}, "
                    f"{fmt(s['median_s'], '.0f')} ({fmt(s['max_s'], '.0f')})", fmt(ratio(p["max_s"], s["max_s"])),
                    target=f"within {goal:.0f} s (issue 38)", verdict=ok)]
    return [row("7", f"False positives ({label}): {sc['name']}", f"{p['false_positives']}/{n}",
                f"without the probe: {s['false_positives']}/{n}", target="0",
                verdict="met" if p["false_positives"] == 0 else "**missed**")]


def footprint_rows(fp: dict[str, Any]) -> list[Row]:
    f = fp["footprint"]
    s, sv, e = f["sparkd"], f["supervisord"], f["earlyoom"]
    rows = [
        row("4", f"Idle CPU over {s['window_s']:.0f} s, % of one core (guard on)", fmt(s["cpu_pct"]),
            f"supervisord {fmt(sv['cpu_pct'])}; earlyoom {fmt(e['cpu_pct'])}",
            f"{fmt(ratio(s['cpu_pct'], sv['cpu_pct']), '.1f')}; {fmt(ratio(s['cpu_pct'], e['cpu_pct']), '.1f')}",
            "≤ 0.2 %", at_most(s["cpu_pct"], 0.2, "% of a core")),
        row("4", "RSS: median MiB (max)", f"{fmt(s['rss_mib_median'], '.1f')} ({fmt(s['rss_mib_max'], '.1f')})",
            f"supervisord {fmt(sv['rss_mib_median'], '.1f')}; earlyoom {fmt(e['rss_mib_median'], '.1f')}",
            f"{fmt(ratio(s['rss_mib_median'], sv['rss_mib_median']))}; "
            f"{fmt(ratio(s['rss_mib_median'], e['rss_mib_median']), '.1f')}",
            "≤ 35 MiB", at_most(s["rss_mib_max"], 35.0, "MiB")),
    ]
    imports = fp.get("imports")
    if imports:
        rows.append(_dependency_row(imports))
    rec = fp.get("recorder")
    if rec:
        rows.append(row("29", f"The flight recorder's cost over {rec['on']['window_s']:.0f} s ({rec['records']} "
                        "records): CPU % of one core as it counts itself (with − without, schedstat) / RSS MiB, "
                        "with − without it",
                        f"{fmt(rec['own_cpu_pct'], '.3f')} ({fmt(rec['cpu_pct_cost'], '+.3f')}) / "
                        f"{fmt(rec['rss_mib_cost'], '+.2f')}",
                        f"without it {fmt(rec['off']['cpu_pct'], '.3f')} / {fmt(rec['off']['rss_mib_median'], '.1f')}",
                        f"{fmt(ratio(rec['on']['cpu_pct'], rec['off']['cpu_pct']), '.2f')} / "
                        f"{fmt(ratio(rec['on']['rss_mib_median'], rec['off']['rss_mib_median']), '.3f')}",
                        "≤ 0.05 % and ≤ 1 MiB",
                        f"{at_most(rec['own_cpu_pct'], 0.05, '% of a core')}; "
                        f"{at_most(rec['rss_mib_cost'], 1.0, 'MiB')}"))
    sc = fp["scrape"]
    s, p = sc["targets"]["sparkd"], sc["targets"]["prometheus_client"]
    rows.append(row("5", f"/metrics at 20/s, connect → last byte: p50 / p99 ms (n = {s['scrapes']}; sparkd's "
                    f"guard sampling every {sc['guard_interval_s'] * 1000:.0f} ms)",
                    f"{fmt(s['p50_ms'])} / {fmt(s['p99_ms'])}",
                    f"prometheus_client {fmt(p['p50_ms'])} / {fmt(p['p99_ms'])}",
                    f"{fmt(ratio(s['p50_ms'], p['p50_ms']))} / {fmt(ratio(s['p99_ms'], p['p99_ms']))}",
                    "p99 ≤ 5 ms", at_most(s["p99_ms"], 5.0, "ms")))
    return rows


def _dependency_row(imports: dict[str, Any]) -> Row:
    each = ", ".join(f"{name} +{fmt(x['rss_mib'], '.1f')}" + ("" if x.get("in_daemon", True) else " (not imported)")
                     for name, x in imports["each"].items())
    together = ""
    if "deps_mib" in imports:
        floor = imports["bare_mib"] + imports["deps_mib"]
        together = (f"; all it imports but sparkd's own modules +{fmt(imports['deps_mib'], '.1f')} (a floor of "
                    f"{fmt(floor, '.1f')} MiB before any sparkd code)")
    return row("4", "What each dependency costs: RSS MiB it adds to a fresh interpreter "
               f"({fmt(imports['bare_mib'], '.1f')} MiB bare); what the daemon's imports add",
               f"{each}{together}; `sparkd run`'s imports +{fmt(imports['daemon_mib'], '.1f')} "
               f"({imports['daemon_modules']} modules)", verdict="(explains the RSS row)")


def group_rows(group: dict[str, Any]) -> list[Row]:
    rows = []
    for size in group["sizes"]:
        g = group["groups"][str(size)]
        total, own, over = g["restart"]["median_s"], g["bare"]["median_s"], g["overhead_s"]
        runs = g["restart"]["runs"]
        ok = sum(1 for x in runs if x["exit"] == 0)
        target = "overhead < 3 s" if size == 4 else "–"
        rows.append(row("6", f"Group of {size} nodes: `sparkctl restart --wait` ({ok}/{len(runs)} ok), total s − "
                        "slowest rank's own startup s = overhead s", f"{fmt(total)} − {fmt(own)} = {fmt(over)}",
                        f"all ranks by hand {fmt(own)}", fmt(ratio(total, own)), target,
                        verdict(over, 3.0, "s") if size == 4 else "–"))
    return rows


def cli_rows(cli: dict[str, Any]) -> list[Row]:
    """Issue 28's row: sparkctl status and a TAB completion, spawn to exit, beside supervisorctl status."""
    peer, start = cli["supervisorctl_status"], cli["python_start"]
    rows = []
    for key, figure in (("sparkctl_status", "`sparkctl status` (a ready daemon), spawn → exit: median / p90 ms"),
                        ("sparkctl_complete", "TAB completion `sparkctl re<TAB>`, spawn → exit: median / p90 ms"),
                        ("sparkctl_status_config", "`sparkctl --config FILE status` (the daemon's own file): "
                                                   "median / p90 ms"),
                        ("sparkctl_complete_incident", "TAB completion `sparkctl incidents <TAB>` (ids from the "
                                                       "daemon): median / p90 ms"),
                        ("sparkd_complete_profile", "TAB completion `sparkd check-config --profile <TAB>`: "
                                                    "median / p90 ms")):
        x = cli.get(key)
        if x is None:  # a run from before these rows
            continue
        rows.append(row("9", f"{figure} (n = {cli['runs']}; `python -c pass` {fmt(start['median_ms'], '.0f')} ms)",
                        f"{fmt(x['median_ms'], '.0f')} / {fmt(x['p90_ms'], '.0f')}",
                        f"`supervisorctl status` {fmt(peer['median_ms'], '.0f')} / {fmt(peer['p90_ms'], '.0f')}",
                        fmt(ratio(x["median_ms"], peer["median_ms"])), f"≤ {cli['target_ms']:.0f} ms",
                        at_most(x["median_ms"], cli["target_ms"], "ms")))
    return rows


def summary_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, build in (("recovery", recovery_rows), ("docker", docker_rows), ("footprint", footprint_rows),
                        ("group", group_rows), ("cli", cli_rows)):
        part = r.get(name)
        if part is None:
            rows.append(row("–", f"{name}: not run (--skip)", "–"))
        elif part.get("failed") or part.get("missing"):
            rows.append(row("–", f"{name}: not measured", part.get("missing", "the run failed (see its output)")))
        else:
            rows += build(part)
    return rows


def table(rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda x: x["n"]):
        lines.append("| " + " | ".join(str(r.get(key, "")).replace("|", "/") for key, _ in COLUMNS) + " |")
    return lines


def render(rows: list[Row], r: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in r["load_before"])
    lines = [
        f"## sparkd benchmarks — {r['when']}",
        "",
        f"{r['host']}, Linux {r['kernel']}, {r['cpus']} CPUs (shared; load average before: {load}), Python "
        f"{r['python']}; {r['seconds'] / 60:.1f} min in all. Ratios are sparkd / peer, medians unless a "
        "percentile is named; tests/bench/README.md explains each figure.",
    ]
    if r.get("quick"):
        lines += ["", "**--quick: a few trials each, to check the benchmarks; these are not the figures to quote.**"]
    lines += ["", *table(rows)]
    rec = r.get("recovery") or {}
    if rec.get("recovery"):
        rs, lit = rec["recovery"], rec["litter"]
        finals = Counter(str(t.get("final")).replace(f"standin{i}", "<program>")
                         for i, t in enumerate(lit["supervisord"]["runs"]))
        last_words = "; ".join(f"“{text}” ×{n}" for text, n in finals.items())
        lines += ["", f"Recovery: {rs['sparkd']['trials']} kills each for sparkd and supervisord, "
                  f"{rs['unit']['trials']} for the unit (each waits RestartSec=30); litter: "
                  f"{lit['sparkd']['trials']} deaths each. sparkd runs its shipped defaults but `backoff_initial_s "
                  "= 0` and no restart budget; the shipped-defaults row keeps them. supervisord's last word on "
                  f"each program with litter: {last_words}."]
    fp = r.get("footprint") or {}
    if fp.get("scrape"):
        sc = fp["scrape"]
        lines += ["", f"sparkd's CPU while scraped at 20/s with its guard sampling every "
                  f"{sc['guard_interval_s'] * 1000:.0f} ms: {fmt(sc['sparkd_cpu_pct_during'])} % of a core; guard "
                  f"metrics exported: {sc['guard_metrics_present']}."]
    guard = r.get("guard") or {}
    if guard.get("table"):
        lines += ["", "### 3. Memory guard against earlyoom (tests/bench/bench_guard.py)", "", guard["table"]]
    return "\n".join(lines)
