"""systemd/sparkd.service read as text: the exit statuses it does not retry are sparkd's, and every sandboxing
option systemd offers is either set or left out with a reason. (tests/integration/test_systemd.py runs it.)"""

from __future__ import annotations

import re
from pathlib import Path

from sparkd.host import exits

UNIT = (Path(__file__).resolve().parents[2] / "systemd" / "sparkd.service").read_text()

# Sandboxing options `systemd-analyze security` weighs; each must be set or named in a comment with its reason.
SANDBOXING = [
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateNetwork", "PrivateUsers",
    "ProtectClock", "ProtectHostname", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectProc", "ProcSubset", "RestrictNamespaces", "RestrictAddressFamilies",
    "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality", "MemoryDenyWriteExecute", "NoNewPrivileges",
    "SystemCallFilter", "SystemCallArchitectures", "CapabilityBoundingSet", "DevicePolicy", "IPAddressDeny",
    "DynamicUser", "UMask",
]


def settings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_restart_prevent_exit_status_lists_what_sparkd_says_a_restart_cannot_fix() -> None:
    (value,) = settings()["RestartPreventExitStatus"]
    assert sorted(int(v) for v in value.split()) == sorted(exits.NOT_RESTARTABLE)
    assert exits.FAILURE not in exits.NOT_RESTARTABLE  # a crash is restarted: the new daemon adopts vLLM


def test_every_sandboxing_option_is_set_or_explained() -> None:
    have = settings()
    left_out = set(re.findall(r"^# - ([A-Za-z]+)=", UNIT, re.M)) | set(re.findall(r", ([A-Za-z]+)=", UNIT))
    for option in SANDBOXING:
        assert option in have or option in left_out, f"{option}: set it, or say in a comment why not"


def test_kill_mode_and_exec_reload_carry_their_reasons() -> None:
    have = settings()
    assert have["KillMode"] == ["process"] and "trade-off" in UNIT
    assert have["ExecReload"] == ["/usr/bin/sparkctl reload"]
    assert "kill -HUP $MAINPID" in UNIT  # the alternative, and why not
    assert have["LogsDirectory"] == ["sparkd"] and have["StateDirectory"] == ["sparkd"]
