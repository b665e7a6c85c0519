"""Hand-made mutants of the daemon shell and the tests that must kill them (tests/MUTATION.md has the results).

Usage: ``.venv/bin/python tests/mutants.py [--list] [ID ...]`` (no ID: every mutant, which takes a while).

Each mutant replaces one exact text in one file (it must occur exactly once), runs its tests with ``pytest -q -x``,
and writes the file back byte for byte, also when interrupted (SIGINT, SIGTERM). A mutant is killed when pytest
fails; "no tests ran" is an error, never a kill. Run it on a clean tree (``git diff --quiet sparkd/``): it refuses
to mutate a file with changes of its own.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-x", "-p", "no:cacheprovider"]
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, ``file::test`` or ``-k`` expressions
    what: str


def m(id: str, path: str, old: str, new: str, what: str, *tests: str) -> Mutant:
    return Mutant(id, path, old, new, tests, what)


LOOP = "tests/unit/test_daemon_loop.py"
LIFECYCLE = "tests/unit/test_lifecycle.py"
PROCESS = "tests/integration/test_daemon_process.py"
REMEMBERED = "tests/unit/test_daemon_remembered.py"
EFFECTS = "tests/unit/test_daemon_effects.py"
COORDINATOR = "tests/unit/test_coordinator.py"
SHM_KILLED = PROCESS + "::test_a_launch_killed_while_loading_leaves_no_segment_behind"
D = "sparkd/daemon/"
API = "tests/unit/test_control_api.py"
FILES = "tests/unit/test_file_safety.py"
STARTUP = "tests/unit/test_startup_checks.py"
SECRETS = "tests/unit/test_redact.py"

MUTANTS = [
    # ---- the survivors of ../shared/reviews/mutation.md, in today's code --------------------------------------
    m("M06a", D + "effects/node.py", "self.post(v.StopDone(reports[0], rand=self.rand()))",
      "self.post(v.StopDone(reports[0]))",
      "the stop's backoff gets no draw", LOOP),
    m("M06b", D + "effects/node.py", "v.PreflightDone(failure, rand=self.rand(), timing=timing)",
      "v.PreflightDone(failure, timing=timing)",
      "a failed preflight's backoff gets no draw", LOOP),
    m("M06c", D + "adapters.py", "rand: Callable[[], float] = random.random", "rand: Callable[[], float] = lambda: 0.5",
      "the daemon's draw is a constant", LOOP),
    m("M08", D + "watch/instance.py", "if self.state() is State.stopping or self._head_stop_seen:",
      "if self.state() is State.stopping or self._head_stop_seen or info.exit_code == 0:",
      "an exit 0 is taken for a requested end", LOOP),
    m("M08i", D + "watch/instance.py", "if self.state() is State.stopping or self._head_stop_seen:",
      "if self.state() is State.stopping or self._head_stop_seen or info.exit_code == 0:",
      "the same, against the process-level test",
      "tests/integration/test_daemon_process.py::test_an_exit_0_is_a_failure_seen_by_the_exit_not_the_health_probe"),
    m("M11", "sparkd/runtime/proctree.py", "if abs(proc.create_time() - create_time) > CREATE_TIME_SLACK_S or",
      "if", "a reused PID (another create time) is taken for the process", "tests/unit/test_proctree.py"),
    m("M12", "sparkd/preflight/shmholders.py",
      '_fd_inodes(proc / name / "fd", dev, usable) | _mapped_inodes(proc / name / "maps", device)',
      '_fd_inodes(proc / name / "fd", dev, usable)', "a segment held only by a mapping counts as unheld",
      "tests/integration/test_shm_sweep.py"),
    m("M12p", "sparkd/preflight/shmholders.py",
      '_fd_inodes(proc / name / "fd", dev, usable) | _mapped_inodes(proc / name / "maps", device)',
      '_fd_inodes(proc / name / "fd", dev, usable)', "the same, against the preflight check's test",
      "tests/integration/test_preflight_node.py::test_shm_leaks_removed_live_owners_and_decoys_kept"),
    m("M26", D + "app.py", "self.notifier.pet(self.sup.alive_at, self.clock.now())",
      "self.notifier.pet(self.clock.now(), self.clock.now())", "the watchdog is petted with the time, not progress",
      LOOP),
    m("M30a", "sparkd/supervisor/lifecycle.py",
      'm = replace(m, intent=Intent.run, restart_state=policy.reset(m.restart_state), restart_reason="operator")',
      'm = replace(m, intent=Intent.run, restart_reason="operator")', "an operator restart keeps the spent budget",
      LIFECYCLE, LOOP),
    m("M30b", "sparkd/supervisor/moves.py", 'changes.setdefault("breaker_reason", None)', "pass",
      "leaving failed keeps the breaker's reason", LIFECYCLE, LOOP),
    m("M30c", "sparkd/supervisor/lifecycle.py",
      "if isinstance(obs, v.ResetRequested) else _restart(m, obs, now, limits)",
      "if isinstance(obs, v.ResetRequested) else (m, [])", "restart from failed leaves the breaker open",
      LIFECYCLE, LOOP),
    m("M28u", "sparkd/cluster/peersign.py", "    if not hmac.compare_digest(expected, signed.mac):\n",
      "    if False:\n", "the TCP API takes any signature", "tests/unit/test_control_api.py"),
    m("M32", "sparkd/runtime/proctree.py", "    signal_all(leftover, signal.SIGKILL)\n", "",
      "no SIGKILL after the stop's grace", "tests/unit/test_proctree.py"),
    # ---- the tests mutation.md found unable to fail, each against a mutant it must now kill ------------------
    m("W1", "sparkd/supervisor/policy.py", "delay *= policy.backoff_factor", "delay *= 1.0",
      "the backoff never grows", PROCESS + "::test_repeated_crashes_back_off_open_the_breaker_and_reset_closes_it"),
    m("W3", "sparkd/supervisor/lifecycle.py", "    return replace(m, intent=Intent.stop), []\n",
      "    return _to(m, State.stopped, now, intent=Intent.stop), []\n", "stop closes the breaker",
      LIFECYCLE + "::test_every_edge_leads_where_the_table_says_and_keeps_the_invariants"),
    m("W7", "sparkd/state/lock.py", "fcntl.LOCK_EX | fcntl.LOCK_NB", "fcntl.LOCK_SH | fcntl.LOCK_NB",
      "a second daemon shares the node lock (its teardown must still end what it started)",
      PROCESS + "::test_second_daemon_on_the_node_is_refused"),
    m("W8", "sparkd/supervisor/policy.py", "if not 0.0 <= rand < 1.0:", "if not 0.0 <= rand <= 1.0:",
      "a draw of 1.0 is accepted", "tests/unit/test_policy.py"),
    # ---- fresh mutants of the shell: daemon/, commands/, api/, cluster/ ----------------------------------------
    m("F01", D + "loop/supervisor.py", "            self.remember(memory)\n", "",
      "what the lifecycle must remember is never written", REMEMBERED),
    m("F02", D + "loop/supervisor.py", "        return v.StopDone()\n    return None",
      "        return None\n    return None",
      "a stop that raised leaves the lifecycle in stopping", LOOP, REMEMBERED, EFFECTS),
    m("F03", D + "loop/supervisor.py", "self._tick_sleep.cancel()  # the ticker", "pass  # the ticker",
      "a new deadline does not re-arm the ticker's sleep", LOOP, EFFECTS),
    m("F04", D + "loop/supervisor.py", "            self._preflight.cancel()\n", "            pass\n",
      "leaving preflight does not cancel the running preflight", LOOP, REMEMBERED, EFFECTS),
    m("F05", D + "loop/supervisor.py", "if self.shutting_down and self.idle():", "if self.shutting_down:",
      "a shutdown exits without waiting for vLLM's stop", REMEMBERED, LOOP),
    m("F06", "sparkd/supervisor/graces.py", "    if guard_grace_s is not None:\n", "    if False:\n",
      "the guard's stop grace is ignored", LOOP),
    m("F07", D + "effects/stopping.py",
      "            self.record.remove()\n        await self.leftovers.sweep(cfg)",
      "        await self.leftovers.sweep(cfg)", "the instance record outlives the stop", LOOP, REMEMBERED, EFFECTS),
    m("F08", D + "effects/stopping.py",
      "await self.leftovers.note_shm(instance)  # what it holds now is provably ours once it is gone", "pass",
      "what vLLM holds in /dev/shm is not noted before the stop",
      PROCESS + "::test_starts_serves_and_stops_clean", SHM_KILLED),
    m("F09", "sparkd/supervisor/launchfailure.py", "NOT_RUNNABLE = (126, 127)", "NOT_RUNNABLE = (126,)",
      "a launch that exits 127 (not found) is not a config error", LOOP, EFFECTS, "tests/unit/test_shell_decisions.py"),
    m("F10", D + "effects/preflighting.py", "failure = start_refusal(self.guard) or failures[0] or failures[1]",
      "failure = failures[0] or failures[1]", "the guard's start gate is ignored", LOOP),
    m("F11", "sparkd/supervisor/peerloss.py", "if failure.cls not in WEDGES or not unreachable:", "if True:",
      "a wedge while the peer is unreachable is blamed on vLLM, not the peer",
      "tests/integration/test_pair.py::test_cutting_the_link_stops_both_ranks_and_the_pair_recovers_when_it_returns",
      EFFECTS, "tests/unit/test_shell_decisions.py"),
    m("F12", D + "effects/output.py", "        line = self.redaction()(line)\n", "",
      "vLLM's lines reach the log unredacted", LOOP),
    m("F13", D + "watch/instance.py", "            await self.logs_drained.wait()\n", "            pass\n",
      "the exit is classified before vLLM's last lines arrive", LOOP,
      PROCESS + "::test_fault_is_detected_classified_and_recovered", EFFECTS),
    m("F14", "sparkd/commands/act.py", "    if why:\n", "    if False:\n",
      "a command the lifecycle refuses is accepted", LOOP),
    m("F15", "sparkd/commands/restart.py", "        if problems:\n", "        if False:\n",
      "restart launches an invalid config on disk", "tests/unit/test_daemon_reload.py"),
    m("F16", "sparkd/commands/base.py", 'return value in ("1", "true", "yes")', 'return value in ("1",)',
      "a flag given as true/yes reads as false", "tests/unit/test_control_api.py"),
    m("F17", "sparkd/api/gates.py", "        if self.secret is None:\n", "        if False:\n",
      "no token_file: the TCP API opens", "tests/unit/test_control_api.py"),
    m("F18", "sparkd/api/accepting.py", "        if ticket is None:\n            _close_now(conn)\n",
      "        if False:\n            _close_now(conn)\n", "no connection cap", "tests/unit/test_bounded_listener.py"),
    m("F19", "sparkd/api/server.py", "            if not isinstance(body, dict):\n", "            if False:\n",
      "a JSON body that is not an object reaches the command", "tests/unit/test_control_api.py"),
    m("F20", "sparkd/cluster/coordinator.py", "lost = not view.reachable and lost_for >= grace",
      "lost = not view.reachable", "one missed peer poll is a lost peer (no grace)",
      "tests/integration/test_pair.py::test_killing_the_worker_rank_restarts_the_pair", COORDINATOR),
    m("F21", "sparkd/cluster/shared.py", '(*RUNNING_STATES, "preflight", "adopting")', "RUNNING_STATES",
      "a worker in preflight counts as a gone rank", "tests/unit/test_pair_shared.py",
      "tests/integration/test_pair.py::test_cold_start_starts_the_worker_before_the_head"),
    m("F22", "sparkd/cluster/addresses.py", "found.setdefault(normalise(address), peer)",
      "found.setdefault(normalise(address), address)", "a worker's report is not matched to its host:port peer",
      "tests/unit/test_coordinator.py"),
    m("F23", D + "effects/evidence.py", "self.kernel_mark = kernel.kept if kernel is not None else 0",
      "self.kernel_mark = 0",
      "kernel lines from earlier launches are blamed on this one", LOOP, "tests/unit/test_classify_this_launch.py",
      "tests/unit/test_guard_loop.py", EFFECTS),
    m("F24", D + "watch/instance.py", "        if self.state() not in SERVING:\n            return False\n", "",
      "a peer-lost line while starting is taken for a lost peer", LOOP),
    m("F25", D + "boot/sighandler.py", "            await self.hurry(self.sup.instance())\n", "            pass\n",
      "a second SIGTERM does not force the stop",
      "tests/integration/test_daemon_operator.py::test_a_second_sigterm_ends_vllm_without_waiting_out_the_grace"),
    m("F26", D + "effects/leftovers.py", "for check in self.sweep_checks:", "for check in ():",
      "no sweep after a stop", SHM_KILLED),
    m("F27", D + "loop/remembered.py", "backoff_until=None if backoff is None else float(backoff) - offset,",
      "backoff_until=None,", "the remaining backoff is forgotten by a daemon restart", REMEMBERED),
    m("F28", D + "loop/remembered.py", "except (ValueError, RecursionError) as exc:", "except RecursionError as exc:",
      "a lifecycle file with a bad value crashes the boot", "tests/unit/test_daemon_loop_gaps.py"),
    m("F29", "sparkd/launch/diff.py", '"node.name", "node.role", "node.rank", "runtime", "paths.",',
      '"node.name", "node.role", "node.rank", "paths.",',
      "a reload switches the runtime under a running instance", "tests/unit/test_daemon_reload.py"),
    m("F30", D + "views/status.py", '"breaker": {"open": m.breaker_open,', '"breaker": {"open": False,',
      "status never shows the breaker open", LOOP),
    # Issue 24 (security review): each protection, removed, and the test that notices.
    m("S01", "sparkd/api/gates.py", "if caller is None or caller.peer is None:", "if caller is None:",
      "/v1/* over TCP from any address", API),
    m("S02", "sparkd/cluster/peersign.py", "        if nonce in self._seen:\n", "        if False:\n",
      "a signed request may be replayed", API),
    m("S03", "sparkd/cluster/peersign.py", "    if abs(off) > window_s:\n", "    if False:\n",
      "a signed request never expires", API),
    m("S04", "sparkd/api/server.py", "if caller is None or caller.uid != 0:", "if caller is None:",
      "a group member may hand over or recreate", API),
    m("S05", "sparkd/api/messages.py", "            if size > limit:\n                raise TooLarge\n", "",
      "a body without Content-Length is read whole, however large", API),
    m("S06", "sparkd/api/admission.py", "    if trusted:\n        return held < limits.per_trusted\n", "",
      "no slots kept for the peers", "tests/unit/test_bounded_listener.py"),
    m("S07", "sparkd/api/http11.py", "self._arm(self.listener.first_request_s)", "self._arm(3600.0)",
      "a connection may wait an hour before its first request", "tests/unit/test_bounded_listener.py"),
    m("S08", "sparkd/cluster/coordinator.py", 'said = claim(failure.get("message") or "no reason given")',
      'said = str(failure.get("message") or "no reason given")', "a worker's words reach the sentence unbounded",
      "tests/unit/test_coordinator.py"),
    m("S09", "sparkd/cluster/coordinator.py", "        if named is None:\n", "        if False:\n",
      "a report from an address that is no peer is taken", "tests/unit/test_coordinator.py"),
    m("S10", "sparkd/host/safefile.py", "os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK",
      "os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK", "vllm.log is appended through a link",
      FILES),
    m("S11", "sparkd/host/safefile.py", "    tmp = temp_name(path)\n",
      '    tmp = path.with_name(f".{path.name}.tmp")\n',
      "the launch script's temp file has a name anyone can plant", FILES),
    m("S12", "sparkd/state/incidents.py", "    if not stat.S_ISDIR(st.st_mode):\n", "    if False:\n",
      "incidents are written under a link", FILES),
    m("S13", "sparkd/state/incidents.py", "if FOLDER.match(entry.name) and entry.is_dir(follow_symlinks=False):",
      "if entry.is_dir(follow_symlinks=False):", "the pruner removes folders that are not its own", FILES),
    m("S14", "sparkd/runtime/inroot.py", "                           RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)",
      "                           0)", "a container's log link is followed out of the container", FILES),
    m("S15", "sparkd/host/trustedpaths.py", "    if st.st_uid not in owners:\n", "    if False:\n",
      "a directory another user owns is trusted", STARTUP),
    m("S16", "sparkd/daemon/boot/startup.py", "    why = first_unsafe(directories(cfg))\n", "    why = None\n",
      "sparkd run checks no directory", STARTUP),
    m("S17", "sparkd/config/secretfile.py", "        if st.st_mode & 0o077:\n", "        if False:\n",
      "a token file others may read is used", STARTUP, "tests/unit/test_check_config_files.py"),
    m("S18", "sparkd/config/secretfile.py", 'read_secret_file(path, "[api] token_file", min_bytes=MIN_TOKEN_BYTES)',
      'read_secret_file(path, "[api] token_file")', "a short token is used", STARTUP),
    m("S19", "sparkd/launch/render.py", "if is_secret_name(name, launch.secret_env)}", 'if name == "VLLM_API_KEY"}',
      "only VLLM_API_KEY counts as a secret", SECRETS),
    m("S20", "sparkd/config/secretrule.py", "_URL.sub(lambda m: m.group(\"lead\") + MASK, _NAMED.sub(named, text))",
      "_URL.sub(lambda m: m.group(\"lead\") + MASK, text)",
      "HF_TOKEN=… in a container inspect is not masked", SECRETS),
    m("S21", "sparkd/launch/redact.py", "    _for_logs = redactor\n", "    _for_logs = Redactor()\n",
      "the log redactor never learns the secrets (nor a reload's)", SECRETS),
    m("S22", "sparkd/launch/diff.py", 'if ".env." in key and is_secret_name(', 'if False and is_secret_name(',
      "a reload shows a secret's old and new values", "tests/unit/test_config_diff.py"),
    m("S23", "sparkd/config/model.py", ' and not _secret_key(loc):\n', ":\n",
      "an invalid secret is echoed in the error", SECRETS),
    m("S24", "sparkd/cluster/shared.py", "(digest(value, key) if key else MASK) if secret else value", "value",
      "status and the peers see a shared secret itself", SECRETS),
    # Issue 23: the one definition of stale (sparkd/preflight/neighbours.py) and what hangs on it.
    m("N23a", "sparkd/preflight/neighbours.py",
      '    if proc.zombie:\n        return Judgement(pid, None, "a zombie (already dead; its parent reaps it)")\n',
      '    if proc.zombie:\n        return Judgement(pid, None, "a zombie (already dead; its parent reaps it)")\n'
      '    if is_titled(proc.argv, scope.prefix):\n        return Judgement(pid, Stale.orphaned, "title")\n',
      "any process titled with the prefix is stale (the rule before issue 23)",
      "tests/integration/test_preflight_node.py::test_stale_a_live_trees_titled_processes_are_neighbours",
      "tests/integration/test_neighbours_host.py"),
    m("N23b", "sparkd/preflight/neighbours.py", "    if scope.places is not None and not in_place(proc, scope.places):",
      "    if False:", "another user's or another container's orphan is the launch's",
      "tests/integration/test_preflight_node.py::test_stale_orphans_are_ended_neighbours_decoys_and_the_watched_instance_survive"),
    m("N23c", "sparkd/preflight/processes.py", "others=other_launches(ctx),", "others=(),",
      "the instance registry is not read: another sparkd's launch is not known as its",
      "tests/integration/test_neighbours_host.py::test_a_neighbour_holding_the_port_is_named_and_left_alone"),
    m("N23d", "sparkd/preflight/shmholders.py", "if usable and opened_as_path(", "if False and opened_as_path(",
      "an O_PATH descriptor makes a file the launch's in the ledger",
      "tests/integration/test_preflight_node.py::test_shm_another_users_segments_are_never_the_launchs"),
    m("N23e", "sparkd/preflight/shm.py", "and (uids is None or entry.uid in uids)):", "):",
      "another user's psm_* is removed by its naming",
      "tests/integration/test_preflight_node.py::test_shm_another_users_segments_are_never_the_launchs"),
    m("N23f", "sparkd/preflight/gpu.py", "    if devices.every or not gpus:\n        return apps, 0",
      "    if True:\n        return apps, 0", "a compute process on another GPU counts as the launch's leftover",
      "tests/integration/test_preflight_node.py::test_gpu_a_compute_process_on_another_gpu_is_not_a_leftover"),
    m("N23g", "sparkd/preflight/neighbours.py",
      "        if by_marker and launch.pid > 1 and members and members[0].sid == launch.pid:", "        if False:",
      "a live instance's titled orphan (its marker overwritten by the title) is known only by its marker",
      "tests/integration/test_neighbours_host.py::test_a_live_instances_orphans_are_left_to_it_until_its_sparkd_is_gone"),
    m("N23h", "sparkd/daemon/effects/registry.py",
      "        return [self.folder, *([user] if user is not None and user != self.folder else [])]",
      "        return [self.folder]", "a daemon that may not write [paths] instances_dir registers nowhere",
      "tests/integration/test_instances_user.py"),
    m("N23i", "sparkd/preflight/instances.py", "    speaks_for = None if st.st_uid == 0 else st.st_uid",
      "    speaks_for = None", "a user's registration speaks for any uid's processes (root's litter too)",
      "tests/unit/test_instances.py"),
    m("N23j", "sparkd/launch/render.py", "        inherited = os.environ if host_env is None else host_env",
      "        inherited = {}", "the process runtime's GPUs and title prefix ignore sparkd's own environment",
      "tests/unit/test_gpu_decisions.py"),
]


def apply(mutant: Mutant) -> bytes:
    path = ROOT / mutant.path
    if subprocess.run(["git", "diff", "--quiet", "--", mutant.path], cwd=ROOT).returncode != 0:
        raise SystemExit(f"{mutant.path} has uncommitted changes: commit or stash them before mutating it")
    original = path.read_bytes()
    text = original.decode()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.id}: the text to replace occurs {count} times in {mutant.path}, not once")
    path.write_text(text.replace(mutant.old, mutant.new))
    return original


def run(mutant: Mutant) -> dict[str, Any]:
    original = apply(mutant)
    begun = time.monotonic()
    try:
        env = {**os.environ, "SPARKD_TESTS_NO_DOCKER": os.environ.get("SPARKD_TESTS_NO_DOCKER", "1")}
        done = subprocess.run([*PYTEST, *mutant.tests], cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S)
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        rc, out = -1, f"timed out after {TIMEOUT_S} s"
    finally:
        (ROOT / mutant.path).write_bytes(original)
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)
    verdict = {0: "survived", 5: "error: no tests ran"}.get(rc, "killed" if failed or rc == -1 else f"error rc={rc}")
    return {"id": mutant.id, "verdict": verdict, "by": failed[:1], "s": round(time.monotonic() - begun),
            "tail": out[-1500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's last lines for each mutant")
    args = parser.parse_args()
    known = {mu.id: mu for mu in MUTANTS}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(unknown)}; --list shows them")
    chosen = [known[i] for i in args.ids] or MUTANTS
    if args.list:
        for mu in chosen:
            print(f"{mu.id:6} {mu.path}: {mu.what}  [{' '.join(mu.tests)}]")
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # restore the file on SIGTERM too
    survived = 0
    for mu in chosen:
        result = run(mu)
        survived += result["verdict"] != "killed"
        print(f"{mu.id:6} {result['verdict']:9} {result['s']:4} s  {' '.join(result['by'])}", flush=True)
        if args.verbose or result["verdict"] != "killed":
            print(result["tail"], flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
