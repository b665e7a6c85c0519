"""systemd/sparkd.service under a real systemd 252 booted as PID 1 in a container (docs/design.md).

The container runs Debian's systemd from its own /usr and the repo's sparkd through read-only mounts:
``/usr/bin/sparkd`` is a symlink to ``<repo>/.venv/bin/sparkd``, so the shipped unit runs unmodified. The only
drop-in shortens ``WatchdogSec`` so the frozen-daemon case takes seconds. vLLM is the stand-in, run by the
``process`` runtime: it is sparkd's child and lives in the unit's cgroup, the hardest case for
``leave_running`` and for "nothing left behind". The tests run in file order on one booted container; each
first brings the unit to "active, vLLM ready".
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from systemd_infra import systemd_infra

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "sparkd.service"
VENV_BIN = REPO / ".venv" / "bin"
WATCHDOG_S = 8

# Generous: the first run also builds the systemd image (about a minute, more on a slow mirror).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


infra = systemd_infra()

CONFIG = f"""\
# A process-runtime node: the vLLM stand-in as sparkd's child, state and socket where the package puts them.
runtime = "process"

[node]
name = "systemd-test"
role = "single"

[launch]
executable = "{VENV_BIN / "sparkd-standin"}"
model = "deepseek-ai/DeepSeek-V4-Flash"
served_model_name = "deepseek-v4-flash"
host = "127.0.0.1"
port = 8000

[launch.env]
SPARKD_STANDIN_STARTUP_SECONDS = "1"

[preflight]
skip = ["memory", "page_cache"]  # the stand-in loads no weights

[paths]
state_dir = "/var/lib/sparkd"
run_dir = "/run/sparkd"

[supervisor]
stop_grace_s = 10
leave_running = true

[restart]
backoff_initial_s = 1
backoff_max_s = 5

[health]
interval_s = 1
"""

TEST_DROPIN = f"""\
# Test only: a short watchdog so a frozen daemon is caught in seconds.
[Service]
WatchdogSec={WATCHDOG_S}s
"""


@pytest.fixture(scope="module")
def node(docker_client: Any, docker_test_labels: dict[str, str]) -> Iterator[Any]:
    try:
        infra.ensure_image(docker_client)
    except Exception as exc:
        pytest.fail(f"could not build {infra.IMAGE}: {type(exc).__name__}: {exc}", pytrace=False)
    with infra.booted(docker_client, docker_test_labels, volumes=infra.python_mounts(REPO)) as n:
        code, out = n.sh(f"{VENV_BIN / 'python'} -c 'import sparkd, psutil, pydantic_core'", check=False)
        assert code == 0, f"the repo venv does not run inside the systemd image:\n{out}"
        n.sh(f"groupadd --system sparkd && ln -s {VENV_BIN / 'sparkd'} /usr/bin/sparkd"
             f" && ln -s {VENV_BIN / 'sparkctl'} /usr/bin/sparkctl")
        n.write("/lib/systemd/system/sparkd.service", UNIT.read_text())
        n.write("/etc/systemd/system/sparkd.service.d/10-test.conf", TEST_DROPIN)
        n.write("/etc/sparkd/sparkd.toml", CONFIG)
        n.sh("systemctl daemon-reload")
        yield n


def status(node: Any) -> dict[str, Any]:
    code, out = node.sh("sparkctl --json status", check=False)
    try:
        data: dict[str, Any] = json.loads(out)
    except ValueError:
        return {"state": "unparsable", "raw": out, "exit": code}
    return data


def start_time(node: Any, pid: int) -> str:
    """Field 22 of /proc/PID/stat: the process's start time, a PID's identity across reuse."""
    return node.out(f"cut -d')' -f2- /proc/{pid}/stat | awk '{{print $20}}'")


def ensure_ready(node: Any) -> tuple[int, int]:
    """Bring the unit to active with vLLM ready; returns (sparkd's MainPID, vLLM's PID)."""
    if node.prop("sparkd", "ActiveState") != "active":
        node.sh("systemctl start sparkd")
    ready = node.wait("sparkd ready with a vLLM pid",
                      lambda: (s := status(node)).get("state") == "ready" and s.get("pid") and s)
    return int(node.prop("sparkd", "MainPID")), int(ready["pid"])


def vllm_processes(node: Any) -> list[str]:
    """Every process in the container that is vLLM (the stand-in, its VLLM::* children) or sparkd."""
    lines = node.out("ps -eo pid=,args=").splitlines()
    return [line for line in lines if re.search(r"VLLM::|sparkd-standin|sparkd run|multiprocessing", line)]


def test_unit_passes_systemd_analyze_verify(node: Any) -> None:
    # --man=no: the man: pages come with the package (test_packaging verifies the unit with them installed).
    code, out = node.sh("systemd-analyze verify --man=no /lib/systemd/system/sparkd.service", check=False)
    assert code == 0 and out.strip() == "", out
    # The same check catches the field's day-long exit-127 loop before it starts: ExecStart at a missing file.
    node.write("/tmp/ghost.service", UNIT.read_text().replace("/usr/bin/sparkd run", "/usr/bin/ghost run"))
    code, out = node.sh("systemd-analyze verify --man=no /tmp/ghost.service", check=False)
    assert code != 0 and "/usr/bin/ghost" in out, out


def show(node: Any, *names: str) -> dict[str, str]:
    text = node.out("systemctl show sparkd " + " ".join(f"-p {name}" for name in names))
    return dict(line.split("=", 1) for line in text.splitlines())


def test_unit_settings_as_loaded_by_systemd(node: Any) -> None:
    from sparkd.config import config_from_mapping
    from sparkd.host import exits
    from sparkd.supervisor.graces import unit_stop_timeout_s

    props = show(node, "Type", "NotifyAccess", "Restart", "RestartUSec", "KillMode", "OOMScoreAdjust",
                 "TimeoutStopUSec", "StartLimitIntervalUSec", "RestartPreventExitStatus", "MemoryMin", "MemoryLow",
                 "After", "Wants", "RuntimeDirectory", "StateDirectory", "LogsDirectory", "ExecReload",
                 "LimitNOFILE", "LimitNOFILESoft", "LimitMEMLOCK")
    assert props["Type"] == "notify" and props["NotifyAccess"] == "main", props
    assert props["Restart"] == "on-failure" and props["RestartUSec"] == "5s", props
    assert props["KillMode"] == "process" and props["OOMScoreAdjust"] == "-900", props
    assert props["StartLimitIntervalUSec"] == "0", props  # never "start-limit-hit" for good
    # A config or host problem, or another sparkd, is not retried: the statuses sparkd.host.exits says so for.
    assert props["RestartPreventExitStatus"] == " ".join(map(str, sorted(exits.NOT_RESTARTABLE))), props
    assert int(props["MemoryMin"]) > 0 and int(props["MemoryLow"]) > int(props["MemoryMin"]), props
    assert {"docker.service", "network-online.target"} <= set(props["After"].split()), props
    assert {"docker.service", "network-online.target"} <= set(props["Wants"].split()), props
    assert props["RuntimeDirectory"] == "sparkd" and props["StateDirectory"] == "sparkd", props
    assert props["LogsDirectory"] == "sparkd", props
    assert "path=/usr/bin/sparkctl ; argv[]=/usr/bin/sparkctl reload" in props["ExecReload"], props
    assert int(props["LimitNOFILE"]) >= 65536 and props["LimitMEMLOCK"] == "infinity", props  # vLLM's hard limit
    assert int(props["LimitNOFILESoft"]) == 1024, props  # sparkd's own: its caps keep it far below
    stop_s = _seconds(props["TimeoutStopUSec"])
    # a drained stop of the default config, the GPU memory's release and the sweep fit (check-config's own rule)
    defaults = config_from_mapping({"runtime": "process", "launch": {"model": "m"}}, env={})
    assert stop_s >= unit_stop_timeout_s(defaults), props
    shipped = UNIT.read_text()
    assert re.search(r"^WatchdogSec=30s$", shipped, re.M) and re.search(r"^TimeoutStopSec=300s$", shipped, re.M)


def test_check_config_refuses_a_unit_that_would_kill_a_drain(node: Any) -> None:
    """Issue 36: the unit's TimeoutStopSec, as systemd has it loaded (drop-ins included), must outlast sparkd's own
    drained stop of vLLM; check-config reads it for the config the unit runs."""
    code, out = node.sh("sparkd check-config --config /etc/sparkd/sparkd.toml", check=False)
    assert code == 0 and "unit-stop-timeout-short" not in out, out
    node.write("/etc/systemd/system/sparkd.service.d/30-short-stop.conf", "[Service]\nTimeoutStopSec=100s\n")
    try:
        node.sh("systemctl daemon-reload")
        code, out = node.sh("sparkd check-config --config /etc/sparkd/sparkd.toml", check=False)
        assert code == 2 and "[unit-stop-timeout-short]" in out and "TimeoutStopSec=100s" in out, out
        assert "30-short-stop.conf" in out, "names where the value comes from"
    finally:
        node.sh("rm -f /etc/systemd/system/sparkd.service.d/30-short-stop.conf && systemctl daemon-reload")


def _seconds(span: str) -> float:
    """A systemd time span as `systemctl show` prints it ("3min", "1min 30s", "90s") in seconds."""
    units = {"min": 60.0, "s": 1.0, "ms": 0.001, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(min|ms|s|h)", span))


def test_start_reaches_active_with_ready_and_status_line(node: Any) -> None:
    started = time.monotonic()
    node.sh("systemctl start sparkd")  # Type=notify: returns only once sparkd has sent READY=1
    assert node.prop("sparkd", "ActiveState") == "active" and node.prop("sparkd", "SubState") == "running"
    assert time.monotonic() - started < 60
    main_pid, vllm_pid = ensure_ready(node)
    assert status(node)["daemon_pid"] == main_pid
    text = node.wait("STATUS= naming the ready vLLM", lambda: (t := node.prop("sparkd", "StatusText"))
                     .startswith(f"ready, pid {vllm_pid}") and t)
    shown = node.out("systemctl status sparkd --no-pager -n0", check=False)
    assert f'Status: "{text}"' in shown, shown
    # The watchdog is armed (the test drop-in's interval over the unit's 30s) and fed: a healthy daemon
    # outlives a full WatchdogSec.
    assert node.prop("sparkd", "WatchdogUSec") == f"{WATCHDOG_S}s"
    time.sleep(WATCHDOG_S + 2)
    assert node.prop("sparkd", "MainPID") == str(main_pid) and node.prop("sparkd", "NRestarts") == "0"
    assert status(node)["pid"] == vllm_pid


def test_restart_adopts_the_running_vllm(node: Any) -> None:
    old_main, vllm_pid = ensure_ready(node)
    born = start_time(node, vllm_pid)
    node.sh("systemctl restart sparkd")  # leave_running = true: the old daemon leaves vLLM serving
    new_main = int(node.prop("sparkd", "MainPID"))
    assert new_main not in (0, old_main)
    now = node.wait("the new daemon ready", lambda: (s := status(node)).get("daemon_pid") == new_main
                    and s.get("state") == "ready" and s)
    assert now["pid"] == vllm_pid and start_time(node, vllm_pid) == born, now  # the same vLLM, not a relaunch
    assert now.get("launches") == 0, now
    adopted = node.out(f"journalctl -u sparkd _PID={new_main} --no-pager -o cat | grep '\"event\": \"adopted\"'")
    assert f'"pid": {vllm_pid}' in adopted, adopted


def test_watchdog_kills_a_frozen_daemon_and_the_next_one_adopts(node: Any) -> None:
    frozen, vllm_pid = ensure_ready(node)
    born = start_time(node, vllm_pid)
    restarts = int(node.prop("sparkd", "NRestarts"))
    cursor = node.out("journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'")
    node.sh(f"kill -STOP {frozen}")
    new_main = node.wait("systemd to replace the frozen daemon", lambda: (
        (pid := int(node.prop("sparkd", "MainPID"))) not in (0, frozen) and pid), timeout=WATCHDOG_S * 6)
    assert int(node.prop("sparkd", "NRestarts")) == restarts + 1
    journal = node.out(f"journalctl -u sparkd --no-pager -o cat --after-cursor '{cursor}'")
    assert "Watchdog timeout" in journal and "Failed with result 'watchdog'" in journal, journal
    assert "Fatal Python error: Aborted" in journal, journal  # PYTHONFAULTHANDLER=1: where it was stuck
    now = node.wait("the new daemon ready", lambda: (s := status(node)).get("daemon_pid") == new_main
                    and s.get("state") == "ready" and s)
    assert now["pid"] == vllm_pid and start_time(node, vllm_pid) == born, now
    assert now.get("launches") == 0, now
    assert node.prop("sparkd", "ActiveState") == "active"


def test_oom_score_leaves_vllm_the_first_choice(node: Any) -> None:
    main_pid, vllm_pid = ensure_ready(node)
    assert node.prop("sparkd", "OOMScoreAdjust") == "-900"
    if node.out(f"cat /proc/{main_pid}/oom_score_adj") != "-900":
        pytest.skip("this container may not lower oom_score_adj (no CAP_SYS_RESOURCE), so systemd ignored "
                    "OOMScoreAdjust=-900 ('assuming containerized execution'); nothing to compare")
    # vLLM must not inherit sparkd's protection: the process runtime resets it for its child.
    assert int(node.out(f"cat /proc/{vllm_pid}/oom_score_adj")) >= 0


def test_sandbox_is_on_and_leaves_sparkd_what_it_needs(node: Any) -> None:
    props = show(node, "ProtectSystem", "NoNewPrivileges", "ProtectHostname", "ProtectControlGroups",
                 "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime", "SystemCallArchitectures",
                 "DevicePolicy", "DeviceAllow", "ProtectKernelTunables", "ProtectKernelLogs", "PrivateDevices",
                 "PrivateTmp", "ProtectHome", "ProtectClock", "CapabilityBoundingSet")
    assert props["ProtectSystem"] == "full" and props["SystemCallArchitectures"] == "native", props
    assert all(props[k] == "yes" for k in ("NoNewPrivileges", "ProtectHostname", "ProtectControlGroups",
                                           "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime")), props
    # What sparkd must keep: every device (/dev/kmsg, /dev/nvidia*), /proc/sys, the kernel log, /tmp, /home.
    assert props["DevicePolicy"] == "auto" and props.get("DeviceAllow", "") == "", props  # no device list
    assert all(props[k] == "no" for k in ("ProtectKernelTunables", "ProtectKernelLogs", "PrivateDevices",
                                          "PrivateTmp", "ProtectHome", "ProtectClock")), props
    caps = set(props["CapabilityBoundingSet"].split())
    assert {"cap_kill", "cap_sys_admin", "cap_syslog", "cap_sys_ptrace", "cap_ipc_lock"} <= caps, caps
    assert not {"cap_sys_time", "cap_sys_boot", "cap_mac_admin", "cap_bpf"} & caps, caps
    # Under that sandbox sparkd still ends a stale VLLM:: process of another unit and a leaked /dev/shm segment.
    ensure_ready(node)
    node.sh("systemd-run --unit decoy-stale bash -c 'exec -a VLLM::Worker_TP1 sleep 1000'"
            " && head -c 4096 /dev/zero > /dev/shm/psm_0ddba11")
    node.wait("the decoy running", lambda: "VLLM::Worker_TP1" in node.out("ps -eo args"))
    node.sh("sparkctl restart --wait", timeout=120)
    assert "VLLM::Worker_TP1" not in node.out("ps -eo args")
    assert "psm_0ddba11" not in node.out("ls /dev/shm")
    assert node.prop("decoy-stale", "ActiveState") != "active"


def test_security_score_is_the_one_the_readme_records(node: Any) -> None:
    out = node.out("systemd-analyze security sparkd --no-pager")
    measured = re.search(r"Overall exposure level for sparkd.service: (\d+\.\d) (\w+)", out)
    assert measured, out
    recorded = re.search(r"`systemd-analyze security sparkd` rates the unit \*\*(\d+\.\d) (\w+)\*\*",
                         (REPO / "README.md").read_text())
    assert recorded, "README.md must say: `systemd-analyze security sparkd` rates the unit **X.Y LEVEL**"
    assert measured.groups() == recorded.groups(), (measured.groups(), recorded.groups())


def test_journal_priorities_let_journalctl_filter_warnings(node: Any) -> None:
    _, vllm_pid = ensure_ready(node)
    cursor = node.out("journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'")
    node.sh(f"kill -KILL {vllm_pid}")  # a vLLM failure: sparkd logs the incident as a warning
    node.wait("the restarted vLLM ready", lambda: (s := status(node)).get("state") == "ready"
              and s.get("pid") != vllm_pid)
    after = f"--after-cursor '{cursor}'"
    # The whole unit's history (journalctl 252 returns nothing for -p combined with --after-cursor).
    warnings = node.wait("the incident in the journal", lambda: '"event": "incident"' in (o := node.out(
        "journalctl -u sparkd -p warning --no-pager -o cat", check=False)) and o, timeout=30)
    everything = node.out(f"journalctl -u sparkd --no-pager -o cat {after}")
    assert '"event": "incident"' in warnings, warnings
    assert '"event": "transition"' in everything and '"event": "transition"' not in warnings, warnings
    assert not re.search(r"^<\d>", everything, re.M), everything  # journald took the prefixes, none shown
    entries = node.out(f"journalctl -u sparkd _PID={node.prop('sparkd', 'MainPID')} -o json --no-pager {after}")
    priorities = {json.loads(line)["PRIORITY"] for line in entries.splitlines()}
    assert {"4", "6"} <= priorities, priorities


def test_journal_native_protocol_reaches_journald(node: Any) -> None:
    node.sh(f"{VENV_BIN / 'python'} -c 'from sparkd.host.journal import JournalSink; s = JournalSink(\"vllm-probe\");"
            " s.send(\"INFO 01-02 10:00:00 [a.py:1] an info line\");"
            " s.send(\"(EngineCore_DP0 pid=7) WARNING 01-02 10:00:01 [b.py:2] a warning line\")'")
    shown = node.wait("both lines in the journal", lambda: (o := node.out(
        "journalctl -t vllm-probe --no-pager -o cat")).count("line") == 2 and o)
    assert "an info line" in shown and "a warning line" in shown
    warnings = node.out("journalctl -t vllm-probe -p warning --no-pager -o cat")
    assert "a warning line" in warnings and "an info line" not in warnings, warnings


def test_vllm_output_in_the_journal_under_its_own_identifier(node: Any) -> None:
    node.write("/etc/systemd/system/sparkd.service.d/15-vllm-journal.conf",
               "[Service]\nEnvironment=SPARKD_LOG__VLLM_TO_JOURNAL=true\n")
    try:
        node.sh("systemctl daemon-reload && systemctl restart sparkd")
        ensure_ready(node)
        node.sh("sparkctl restart --wait", timeout=120)  # a launch whose every line flows through the new daemon
        shown = node.wait("vLLM's startup in the journal", lambda: "Application startup complete." in (
            o := node.out("journalctl -t vllm --no-pager -o cat", check=False)) and o, timeout=30)
        assert "Application startup complete." in shown
        # a start's burst the journal's socket queue (10 datagrams in this container) cannot take at once waits in
        # sparkd and arrives whole: nothing dropped
        main_pid = node.prop("sparkd", "MainPID")
        assert "vllm_journal_failed" not in node.out(f"journalctl -u sparkd _PID={main_pid} --no-pager -o cat")
    finally:
        node.sh("rm -f /etc/systemd/system/sparkd.service.d/15-vllm-journal.conf && systemctl daemon-reload")


def test_reload_reports_an_invalid_config_and_keeps_vllm(node: Any) -> None:
    main_pid, vllm_pid = ensure_ready(node)
    good = node.out("cat /etc/sparkd/sparkd.toml")
    try:
        node.write("/etc/sparkd/sparkd.toml", good.replace("port = 8000", 'port = "eight thousand"'))
        code, out = node.sh("systemctl reload sparkd", check=False)
        assert code != 0, out
        assert "launch.port" in node.out("journalctl -u sparkd --no-pager -o cat -n 30")
    finally:
        node.write("/etc/sparkd/sparkd.toml", good)
    assert node.prop("sparkd", "MainPID") == str(main_pid) and status(node)["pid"] == vllm_pid
    node.sh("systemctl reload sparkd")  # the valid config: reload succeeds
    assert node.prop("sparkd", "ActiveState") == "active" and status(node)["pid"] == vllm_pid


def test_stop_stops_vllm_and_leaves_nothing_behind(node: Any) -> None:
    # leave_running = false for this daemon, through the environment override a drop-in can set.
    node.write("/etc/systemd/system/sparkd.service.d/20-stop.conf",
               "[Service]\nEnvironment=SPARKD_SUPERVISOR__LEAVE_RUNNING=false\n")
    node.sh("systemctl daemon-reload")
    _, vllm_pid = ensure_ready(node)
    node.sh("systemctl restart sparkd")  # the old daemon (leave_running = true) hands vLLM over
    main_pid, adopted_pid = ensure_ready(node)
    assert adopted_pid == vllm_pid
    assert vllm_processes(node), "the stand-in should be running before the stop"
    started = time.monotonic()
    node.sh("systemctl stop sparkd")
    took = time.monotonic() - started
    assert node.prop("sparkd", "ActiveState") == "inactive"
    assert node.prop("sparkd", "Result") == "success", node.journal()  # sparkd exited by itself, no SIGKILL
    assert took < 60, took
    assert vllm_processes(node) == [], node.out("ps -eo pid,args")
    assert node.out("ls /dev/shm") == ""
    final = json.loads(node.out("cat /var/lib/sparkd/status.json"))
    assert final["state"] == "stopped", final
    assert node.sh("test -e /var/lib/sparkd/instance.json", check=False)[0] != 0
    journal = node.out(f"journalctl -u sparkd _PID={main_pid} --no-pager -o cat")
    assert '"event": "stopped"' in journal, journal
