"""The soak itself: plant the decoys, start the neighbour and the pair, then fault → recovery until the time is up.

Closing line: ``soak: F faults, R recoveries, V violations``; the details go to a JSON file.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dockerd
from catalogue import AFTER, FAULTS, crashes_a_rank
from decoys import Decoys
from faults import API_BOUND_S, Skipped
from invariants import Ledger, Sampler, footprint_growth, orphans, read_status
from neighbour import Neighbour
from schedule import first_step_from_env, kinds_from_env, steps
from soakpair import RECOVERY_S, RESTART, SoakPair


def closing_line(report: dict[str, Any]) -> str:
    return (f"soak: {len(report['faults'])} faults, {report['recoveries']} recoveries, "
            f"{len(report['violations'])} violations")


def footprint_lines(report: dict[str, Any]) -> list[str]:
    """One line per node: its longest-running daemon's RSS and descriptors past start-up, first → last."""
    out = []
    for name, f in report.get("footprint", {}).items():
        if f:
            processes = f"{f['daemons']} daemon process" + ("es" if f["daemons"] != 1 else "")
            out.append(f"soak: {name} daemon RSS {f['rss_mib'][0]} → {f['rss_mib'][1]} MiB, descriptors "
                       f"{f['fds'][0]} → {f['fds'][1]} over {f['longest_run_s']} s ({processes} in all, at most "
                       f"{f['max_rss_mib']} MiB and {f['max_fds']} descriptors)")
    return out


def another(n: int, kinds: int, now: float, deadline: float) -> bool:
    """Run step ``n``? Until the deadline; and past it while the schedule's opening (each of the ``kinds``
    once) is not done, so that even a short soak meets every fault (one of 120 s ends about there)."""
    return now < deadline or n < kinds


def run_soak(tmp: Path, seed: int, seconds: float) -> dict[str, Any]:
    ledger = Ledger()
    kinds = kinds_from_env()
    report: dict[str, Any] = {"seed": seed, "seconds": seconds, "faults": [], "recoveries": 0, "crashes": [],
                              "skipped": [], "kinds": {k.name: k.what for k in kinds}, "restart_policy": RESTART,
                              "recovery_bound_s": RECOVERY_S}
    pair = SoakPair(tmp / "pair")
    try:
        pair.solo = dockerd.Solo(tmp) if dockerd.ENABLED else None
    except BaseException:
        pair.close()
        raise
    decoys = Decoys(tmp)
    nodes = pair.nodes()
    neighbour = Neighbour(tmp, nodes[0].prefix, Path(pair.head.config["paths"]["instances_dir"]))
    sampler = Sampler(nodes, ledger, decoys.touched, neighbours=neighbour.changed, foreign=neighbour.pids)
    try:
        decoys.plant(mention=f"{nodes[0].prefix}::Worker_TP0 VLLM::Worker_TP0 vllm serve /models/test")
        neighbour.start()  # first: the pair's first preflights run beside it
        first = start_all(pair)
        if first != "ready":
            ledger.add(f"the daemons never became ready: {first}")
            return finish(report, ledger, pair, sampler, decoys, None, neighbour)
        sampler.start()
        if pair.webhooks is not None:
            pair.webhooks.start_probing({name: d.socket for name, d in pair.daemons.items()}, ledger,
                                        lambda name: not pair.crashed().get(name), API_BOUND_S)
        since = time.monotonic()
        deadline = since + seconds
        for step in steps(seed, 100_000, kinds)[first_step_from_env():]:
            if not another(step.n, len(kinds), time.monotonic(), deadline):
                break
            try:
                report["faults"].append(one_fault(pair, ledger, report, step.n, step.kind, step.params,
                                                  foreign=neighbour.pids))
            except Skipped as skip:
                report["skipped"].append({"n": step.n, "kind": step.kind, "why": str(skip)})
        return finish(report, ledger, pair, sampler, decoys, since, neighbour)
    finally:
        sampler.halt.set()
        neighbour.close()
        decoys.close()
        pair.close()
        if pair.solo is not None:
            pair.solo.close()


def start_all(pair: SoakPair) -> str:
    pair.start()
    if pair.solo is not None:
        pair.solo.start()
        if pair.solo.ready() is None:
            return f"the docker-exec daemon: {pair.solo.daemon.status().get('last_failure')}"
    return pair.settle()


def one_fault(pair: SoakPair, ledger: Ledger, report: dict[str, Any], n: int, kind: str,
              params: dict[str, Any], foreign: Callable[[], set[int]] = set) -> dict[str, Any]:
    ledger.during = f"#{n} {kind}"
    if not pair.stable():  # every fault starts from a stable run (soakpair's docstring)
        ledger.add("the pair did not stay ready past stable_after_s after a recovery")
    begun = time.monotonic()
    before = {name: pair.rank_pid(name) for name in pair.daemons}
    pair.before_crash = None
    note = FAULTS[kind](pair, params, ledger)
    before = pair.before_crash or before  # a crash after other trouble (link_cut's crash_after): from then on
    if crashes_a_rank(kind, params) and not pair.replaced(before):
        ledger.add(f"{kind}: no new instance replaced the old one within the bound")
    outcome = pair.settle()
    if kind in AFTER:
        AFTER[kind](pair, ledger)
    outcome = recover_from_crashes(pair, ledger, report, kind, outcome)
    if outcome.startswith("failed"):
        for name in pair.daemons:
            pair.daemons[name].ctl("reset", timeout=120)
        outcome += " (reset)"
        outcome = pair.settle() if pair.settle(5) != "ready" else "ready"
    if outcome == "timeout":
        ledger.add(f"{kind}: the pair was neither ready nor failed with a sentence within the bound")
    if outcome == "ready":
        report["recoveries"] += 1
        for node in pair.nodes():
            for sentence, detail in orphans(node, read_status(node.status_path)[0] or {}, foreign()):
                ledger.add(sentence, detail)
    return {"n": n, "kind": kind, "params": params, "note": note, "outcome": outcome,
            "seconds": round(time.monotonic() - begun, 1)}


def recover_from_crashes(pair: SoakPair, ledger: Ledger, report: dict[str, Any], kind: str, outcome: str) -> str:
    crashed = pair.crashed()
    if not crashed:
        return outcome
    for name, code in crashed.items():
        ledger.add(f"the {name} daemon died (exit {code}) during {kind}")
        tail = pair.daemons[name].log().splitlines()[-25:]
        report["crashes"].append({"node": name, "exit": code, "during": kind, "log_tail": tail})
        pair.start(name)
    return pair.settle()


def finish(report: dict[str, Any], ledger: Ledger, pair: SoakPair, sampler: Sampler, decoys: Decoys,
           since: float | None, neighbour: Neighbour) -> dict[str, Any]:
    sampler.halt.set()
    if sampler.is_alive():
        sampler.join(10)
    ledger.during = "the end"
    for sentence, detail in neighbour.changed():
        ledger.add(sentence, detail)
    if not decoys.lock_still_opens_by_name():
        ledger.add("the decoy's multiprocessing lock no longer opens by its name")
    for sentence in decoys.touched():
        ledger.add(sentence)
    if pair.webhooks is not None:
        pair.webhooks.finish(ledger, {name: pair.status(name) for name in pair.daemons},
                             {name: {str(i.get("class")) for i in d.incidents()} for name, d in pair.daemons.items()})
    if since is not None:
        for name, series in sampler.footprint.items():
            for sentence in footprint_growth(series):
                ledger.add(f"the {name} daemon's {sentence}")
    report["violations"] = ledger.to_json()
    report["samples"] = sampler.samples
    report["faults_by_kind"] = dict(Counter(f["kind"] for f in report["faults"]).most_common())
    report["budget_seen"] = sampler.budget
    report["footprint"] = {name: footprint(series) for name, series in sampler.footprint.items()}
    report["api_latency_s"] = {"max": round(max(pair.latencies, default=0.0), 3), "count": len(pair.latencies)}
    return report


def footprint(series: list[tuple[float, int, int, int]], warmup_s: float = 15.0) -> dict[str, Any]:
    """RSS (MiB) and descriptors of the node's longest-running daemon process, from its first sample past its
    start-up (``warmup_s``, as the footprint check takes it) to its last, and the most any daemon process of
    this node reached."""
    if not series:
        return {}
    runs = [[s for s in series if s[1] == pid] for pid in dict.fromkeys(s[1] for s in series)]
    longest = max(runs, key=lambda run: run[-1][0] - run[0][0])
    steady = [s for s in longest if s[0] >= longest[0][0] + warmup_s] or longest
    return {"daemons": len(runs), "longest_run_s": round(longest[-1][0] - longest[0][0]),
            "rss_mib": [steady[0][2] >> 20, steady[-1][2] >> 20], "fds": [steady[0][3], steady[-1][3]],
            "max_rss_mib": max(s[2] for s in series) >> 20, "max_fds": max(s[3] for s in series)}


def write_report(report: dict[str, Any], path: Path, tmp: Path) -> None:
    """The report as JSON at ``path``; after a violation, the daemons' and vLLM's logs beside it, in
    ``<path>.logs/`` (the test's folder may be gone by the time someone looks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if not report["violations"]:
        return
    kept = path.with_name(path.name + ".logs")
    for log in [*tmp.rglob("sparkd.log"), *tmp.rglob("vllm.log*")]:
        target = kept / log.relative_to(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(log, target)
    report["logs"] = str(kept)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
