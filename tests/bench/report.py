"""What ``make bench`` prints: one summary table (a row per figure, beside its peer, with issue 9's target and
a verdict), then the memory guard's own table. Each function takes one benchmark's JSON."""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchkit import fmt, ratio

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


def recovery_rows(rec: dict[str, Any]) -> list[Row]:
    own = rec["startup"]["median_s"]
    rs, lit = rec["recovery"], rec["litter"]
    s, sv, u = rs["sparkd"], rs["supervisord"], rs["unit"]

    def cell(x: dict[str, Any]) -> str:
        return (f"{fmt(x['median_s'])} ({fmt(x['over_startup_s'], '+.2f')}), p90 {fmt(x.get('p90_s'))}, "
                f"{x['healthy']}/{x['trials']}")

    rows = [row("1", f"Recovery after SIGKILL: median s (+ over the stand-in's own startup, {fmt(own)} s), "
                "p90, healthy/trials", cell(s), f"supervisord {cell(sv)}; unit {cell(u)}",
                f"{fmt(ratio(s['median_s'], sv['median_s']))}; {fmt(ratio(s['median_s'], u['median_s']))}")]
    if "sparkd_defaults" in rs:
        rows.append(row("1", "Recovery, sparkd's shipped restart defaults (first failure: 10 s ± 10 % backoff)",
                        cell(rs["sparkd_defaults"]), verdict="slower by design"))
    ls, lsv, lu = lit["sparkd"], lit["supervisord"], lit["unit"]
    healthy = ls["healthy"] == ls["trials"] and not lsv["healthy"] and not lu["healthy"]
    rows.append(row("1", "Deaths that leave a stale VLLM::Worker on the master port and psm_* files: ended "
                    "healthy", f"{ls['healthy']}/{ls['trials']} (litter left after: {ls['stale_left']} processes, "
                    f"{ls['shm_left']} files)",
                    f"supervisord {lsv['healthy']}/{lsv['trials']} in {lsv['window_s']:.0f} s; unit "
                    f"{lu['healthy']}/{lu['trials']} in {lu['window_s']:.0f} s",
                    target="all, where the others never recover", verdict="met" if healthy else "**missed**"))
    rows.append(row("1", "Recovery from that litter: median s beyond the own startup",
                    f"{fmt(ls['over_startup_s'], '+.2f')} ({fmt(ls['median_s'])} s)", "never", target="< 2 s",
                    verdict=verdict(ls["over_startup_s"], 2.0, "s")))
    ds, dsv = rec["detection"]["sparkd"], rec["detection"]["supervisord"]
    rows.append(row("2", f"Detection, death → the supervisor's own log line: p50 / p99 ms (n = {ds['samples']} / "
                    f"{dsv['samples']})", f"{fmt(ds['p50_ms'], '.1f')} / {fmt(ds['p99_ms'], '.1f')}",
                    f"supervisord {fmt(dsv['p50_ms'], '.1f')} / {fmt(dsv['p99_ms'], '.1f')}",
                    f"{fmt(ratio(ds['p50_ms'], dsv['p50_ms']))} / {fmt(ratio(ds['p99_ms'], dsv['p99_ms']))}",
                    "p99 < 100 ms", verdict(ds["p99_ms"], 100.0, "ms")))
    return rows


def guard_rows(guard: dict[str, Any] | None) -> list[Row]:
    title = "Memory guard: floor crossed → SIGTERM, and overshoot under the floor"
    if guard is None:
        return [row("3", title, "not run (--skip guard)", target="– (issue 6)")]
    if guard.get("missing"):
        return [row("3", title, f"placeholder: {guard['missing']}", target="– (issue 6)")]
    if guard.get("failed") or not guard.get("summary"):
        return [row("3", title, "bench_guard.py failed or measured nothing (its output is above)",
                    target="– (issue 6)")]
    summary = guard["summary"]

    def cells(who: str, key: str, spec: str) -> str:
        return " / ".join(fmt(r[who][key], spec) for r in summary)

    def ratios(key: str) -> str:
        return " / ".join(fmt(r[f"ratio_{key}"], ".2f") for r in summary)

    rates = "/".join(f"{r['rate_target_gib_s']:g}" for r in summary)
    return [row("3", f"Memory guard at {rates} GiB/s: reaction ms (floor crossed → SIGTERM); overshoot MiB",
                f"{cells('sparkd', 'reaction_ms', '.0f')}; {cells('sparkd', 'overshoot_mib', '.0f')}",
                f"earlyoom {cells('earlyoom', 'reaction_ms', '.0f')}; {cells('earlyoom', 'overshoot_mib', '.0f')}",
                f"{ratios('reaction_ms')}; {ratios('overshoot_mib')}", "– (issue 6)")]


def wedge_rows(wedge: dict[str, Any] | None) -> list[Row]:
    """bench_wedge.py: a replay through the pure tracker on an injected clock (decision latency, not I/O)."""
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
    return rows


def footprint_rows(fp: dict[str, Any]) -> list[Row]:
    f = fp["footprint"]
    s, sv, e = f["sparkd"], f["supervisord"], f["earlyoom"]
    rows = [
        row("4", f"Idle CPU over {s['window_s']:.0f} s, % of one core", fmt(s["cpu_pct"]),
            f"supervisord {fmt(sv['cpu_pct'])}; earlyoom {fmt(e['cpu_pct'])}",
            f"{fmt(ratio(s['cpu_pct'], sv['cpu_pct']), '.1f')}; {fmt(ratio(s['cpu_pct'], e['cpu_pct']), '.1f')}",
            "< 1 %", verdict(s["cpu_pct"], 1.0, "% of a core")),
        row("4", "RSS: median MiB (max)", f"{fmt(s['rss_mib_median'], '.1f')} ({fmt(s['rss_mib_max'], '.1f')})",
            f"supervisord {fmt(sv['rss_mib_median'], '.1f')}; earlyoom {fmt(e['rss_mib_median'], '.1f')}",
            f"{fmt(ratio(s['rss_mib_median'], sv['rss_mib_median']))}; "
            f"{fmt(ratio(s['rss_mib_median'], e['rss_mib_median']), '.1f')}",
            "< 60 MiB", verdict(s["rss_mib_max"], 60.0, "MiB")),
    ]
    sc = fp["scrape"]
    s, p = sc["targets"]["sparkd"], sc["targets"]["prometheus_client"]
    rows.append(row("5", f"/metrics at 20/s, connect → last byte: p50 / p99 ms (n = {s['scrapes']}; sparkd's "
                    f"guard sampling every {sc['guard_interval_s'] * 1000:.0f} ms)",
                    f"{fmt(s['p50_ms'])} / {fmt(s['p99_ms'])}",
                    f"prometheus_client {fmt(p['p50_ms'])} / {fmt(p['p99_ms'])}",
                    f"{fmt(ratio(s['p50_ms'], p['p50_ms']))} / {fmt(ratio(s['p99_ms'], p['p99_ms']))}",
                    "p99 < 10 ms", verdict(s["p99_ms"], 10.0, "ms")))
    return rows


def pair_rows(pair: dict[str, Any]) -> list[Row]:
    total, own = pair["restart"]["median_s"], pair["bare"]["median_s"]
    runs = pair["restart"]["runs"]
    ok = sum(1 for x in runs if x["exit"] == 0)
    return [row("6", f"Pair `sparkctl restart --wait` ({ok}/{len(runs)} ok): total s − own startup s = overhead s",
                f"{fmt(total)} − {fmt(own)} = {fmt(pair['overhead_s'])}", f"both ranks by hand {fmt(own)}",
                fmt(ratio(total, own)), "overhead < 3 s", verdict(pair["overhead_s"], 3.0, "s"))]


def summary_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, build in (("recovery", recovery_rows), ("footprint", footprint_rows), ("pair", pair_rows)):
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
