"""Reload of a broken config: one node's config file is broken on disk, then a reload is asked for —
``sparkctl reload`` on that node, SIGHUP to its daemon, or ``sparkctl restart`` (which reloads first) on either
node. Each must refuse it and change nothing: the same daemons, the same ranks, still ready, the same launch
hash. Then the file is restored and a reload finds it valid with nothing changed.
"""

from __future__ import annotations

import copy
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
from daemon_harness import render_toml
from faults import ctl
from invariants import Ledger
from soakpair import SoakPair


def _set(section: str, key: str, value: Any) -> Callable[[dict[str, Any]], str]:
    def breaks(cfg: dict[str, Any]) -> str:
        broken = copy.deepcopy(cfg)
        broken[section][key] = value
        return render_toml(broken)
    return breaks


# name → (how the config is broken, a word the refusal must name)
BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], str], str]] = {
    "toml_syntax": (lambda cfg: render_toml(cfg) + "\n[restart\nbudget_failures = \n", "line"),
    "wrong_type": (_set("restart", "backoff_initial_s", "soon"), "backoff_initial_s"),
    "infinite": (_set("restart", "backoff_initial_s", float("inf")), "backoff_initial_s"),
    "unknown_key": (_set("health", "canary_intervall_s", 1), "canary_intervall_s"),
    "floors_out_of_order": (_set("guard", "stop_below", "64 GiB"), "stop_below"),
    "deep_nesting": (lambda cfg: render_toml(cfg).replace("[api]", "deep = " + "[" * 5000 + "]" * 5000 + "\n\n[api]"),
                     "deep"),
}


def broken_config(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    node, other = params["node"], "worker" if params["node"] == "head" else "head"
    daemon = pair.daemons[node]
    breaks, names = BREAKAGES[params["breakage"]]
    before = _snapshot(pair)
    original = daemon.config_path.read_text()
    daemon.config_path.write_text(breaks(daemon.config))
    try:
        answer = _ask(pair, params["ask"], node, other, names, ledger)
        live = _live_status(pair, node)
        if live is not None and (live.get("config") or {}).get("valid") is not False:
            ledger.add("status does not say that the config on disk is invalid", str(live.get("config"))[:200])
    finally:
        daemon.config_path.write_text(original)
    after = _snapshot(pair)
    if after != before:
        ledger.add("a refused config changed the pair", f"{before} → {after}")
    restored = ctl(pair, node, "reload")
    if restored.returncode != 0 or "nothing changed" not in restored.stdout:
        ledger.add("the config restored after a broken one is not reloaded with nothing changed",
                   (restored.stdout + restored.stderr)[-300:])
    return f"{params['breakage']} on the {node}, {params['ask']}: {answer}"


def _ask(pair: SoakPair, ask: str, node: str, other: str, names: str, ledger: Ledger) -> str:
    """Ask for the broken config to be taken on; anything but a clear refusal is a violation."""
    if ask == "sighup":
        pair.daemons[node].signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "config_reload_refused" not in pair.daemons[node].log()[-20000:]:
            time.sleep(0.2)
        if "config_reload_refused" not in pair.daemons[node].log()[-20000:]:
            ledger.add("SIGHUP with a broken config on disk logged no refusal")
        return "SIGHUP refused"
    command, where = ("reload", node) if ask == "reload" else ("restart", node if ask == "restart_here" else other)
    done = ctl(pair, where, command)
    text = done.stdout + done.stderr
    if "Traceback" in text:
        ledger.add(f"sparkctl {command} printed a traceback for a broken config", text[-300:])
    if done.returncode == 0:
        ledger.add(f"sparkctl {command} accepted a broken config", text[-300:])
    elif names.lower() not in text.lower():
        ledger.add(f"sparkctl {command} refused a broken config without naming what is wrong", text[-300:])
    return f"{command} on the {where} exit {done.returncode}"


def _snapshot(pair: SoakPair) -> dict[str, tuple[Any, ...]]:
    out = {}
    for name in pair.daemons:
        status = pair.status(name)
        # ready and degraded are one here: a slow probe on a loaded machine may flip them, a config never does
        state = "serving" if status.get("state") in ("ready", "degraded") else status.get("state")
        out[name] = (status.get("daemon_pid"), status.get("pid"), state, status.get("config_hash"),
                     status.get("launches"))
    return out


def _live_status(pair: SoakPair, node: str) -> dict[str, Any] | None:
    """The status as the control API computes it now (status.json is written only when something changes)."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(pair.daemons[node].socket)), timeout=30) as client:
            data: dict[str, Any] = client.get("http://sparkd/v1/status").json()
    except (httpx.HTTPError, ValueError):
        return None
    return data.get("result", data) if isinstance(data, dict) else None
