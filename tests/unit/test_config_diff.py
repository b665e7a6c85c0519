"""What changed between two configs, as a reload reports it."""

from __future__ import annotations

import copy
import re
from typing import Any

from sparkd.config import config_from_mapping
from sparkd.daemon.boot.reload import keep_fixed
from sparkd.launch.diff import launch_changes, needs_restart, setting_changes

BASE: dict[str, Any] = {
    "runtime": "process", "node": {"name": "a", "role": "single"},
    "launch": {"executable": "/usr/bin/true", "model": "/m", "max_model_len": 8192,
               "env": {"NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "old-secret"}},
    "health": {"interval_s": 5}, "paths": {"state_dir": "/var/lib/a"},
}


def changed(**sections: dict[str, Any]) -> Any:
    data = copy.deepcopy(BASE)
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    return config_from_mapping(data, source="new")


OLD = config_from_mapping(copy.deepcopy(BASE), source="old")


def test_launch_changes_name_each_flag_with_its_values_and_hide_secrets() -> None:
    new = changed(launch={"max_model_len": 16384, "env": {"NCCL_SOCKET_IFNAME": "enp1", "HF_TOKEN": "new-secret"}})
    lines = launch_changes(OLD, new)
    assert lines[0] == "argv: removed --max-model-len 8192; added --max-model-len 16384"
    (token,) = [line for line in lines if line.startswith("env HF_TOKEN")]
    assert re.fullmatch(r"env HF_TOKEN: \(secret [0-9a-f]{12}\) → \(secret [0-9a-f]{12}\)", token)
    assert token.split(" → ")[0][-13:] != token.split(" → ")[1][-13:]  # a change shows as one
    assert "env NCCL_SOCKET_IFNAME: 'eth0' → 'enp1'" in lines
    assert not any("secret'" in line for line in lines)


def test_setting_changes_show_a_secret_only_as_its_digest() -> None:
    """Security review §4: a reload printed container.env.HUGGING_FACE_HUB_TOKEN: 'hf_…_old' → 'hf_…_new'."""
    docker = {**copy.deepcopy(BASE), "runtime": "docker-exec"}
    old = config_from_mapping({**docker, "container": {"image": "i", "env": {"HUGGING_FACE_HUB_TOKEN": "hf_old",
                                                                             "MY_PAT": "pat-old", "A": "1"}},
                               "launch": {**docker["launch"], "secret_env": ["MY_PAT"]}}, source="old")
    new = config_from_mapping({**docker, "container": {"image": "i", "env": {"HUGGING_FACE_HUB_TOKEN": "hf_new",
                                                                             "MY_PAT": "pat-new", "A": "2"}},
                               "launch": {**docker["launch"], "secret_env": ["MY_PAT"]}}, source="new")
    shown = "\n".join(f"{key}: {a!r} → {b!r}" for key, a, b in setting_changes(old, new))
    assert "hf_old" not in shown and "hf_new" not in shown and "pat-" not in shown, shown
    assert re.search(r"container.env.HUGGING_FACE_HUB_TOKEN: \(secret [0-9a-f]{12}\) → \(secret", shown)
    assert "container.env.MY_PAT: (secret" in shown and "container.env.A: '1' → '2'" in shown


def test_setting_changes_skip_the_launch_and_mark_what_waits_for_a_daemon_restart() -> None:
    new = changed(health={"interval_s": 2}, paths={"state_dir": "/var/lib/b"})
    changes = {key: (a, b) for key, a, b in setting_changes(OLD, new)}
    assert changes["health.interval_s"] == (5.0, 2.0)
    assert not any(key.startswith("launch.") for key in changes)
    assert needs_restart("paths.state_dir") and needs_restart("api.port") and not needs_restart("health.interval_s")
    assert keep_fixed(OLD, new).paths == OLD.paths and keep_fixed(OLD, new).health.interval_s == 2.0
