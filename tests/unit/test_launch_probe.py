"""The step probe in the launch (sparkd.launch.probe, sparkd.runtime.probedir, the container's mounts, check-config):
the plugin on vLLM's PYTHONPATH, the user's VLLM_PLUGINS kept, the directory made and cleared, off with one key."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.launch.lint import lint
from sparkd.launch.probe import MIN_VLLM, too_old, version_of_tag
from sparkd.launch.rehearsal import rehearsal
from sparkd.launch.render import render, render_script
from sparkd.runtime.container_spec import container_options
from sparkd.runtime.probedir import prepare
from sparkd.vllm_probe import PLUGIN_DIR
from sparkd.vllm_probe.sparkd_vllm_probe.writer import StepWriter


def make(tmp_path: Path, *, probe: bool = True, runtime: str = "process", **more: Any) -> Config:
    data: dict[str, Any] = {"runtime": runtime, "node": {"role": "single"}, "launch": {"model": "/m"},
                            "paths": {"state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run")},
                            "health": {"step_probe": probe}, **more}
    return config_from_mapping(data, env={})


def run_script(tmp_path: Path, cfg: Config, env: dict[str, str]) -> dict[str, str]:
    """The rendered script run by bash with a fake ``vllm`` that records its environment."""
    record = tmp_path / "env.json"
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport json, os\njson.dump(dict(os.environ), open({str(record)!r}, 'w'))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    spec = render(cfg.model_copy(update={"launch": cfg.launch.model_copy(update={"executable": str(exe)})}))
    script = tmp_path / "launch.sh"
    script.write_text(render_script(spec))
    subprocess.run(["bash", str(script)], check=True, timeout=60, env={"PATH": os.environ["PATH"], **env})
    got: dict[str, str] = json.loads(record.read_text())
    return got


def test_the_launch_puts_the_plugin_first_on_pythonpath_and_names_the_directory(tmp_path: Path) -> None:
    cfg = make(tmp_path)
    spec = render(cfg)
    assert spec.env["SPARKD_PROBE_DIR"] == str(tmp_path / "run" / "probe") == spec.probe_dir
    got = run_script(tmp_path, cfg, {})
    assert got["PYTHONPATH"] == str(PLUGIN_DIR) and "VLLM_PLUGINS" not in got
    got = run_script(tmp_path, cfg, {"PYTHONPATH": "/image/lib:/x y"})  # the image's ENV, the container's env
    assert got["PYTHONPATH"] == f"{PLUGIN_DIR}:/image/lib:/x y"
    assert json.loads(json.dumps(spec.to_json()))["env_edits"][0] == {"name": "PYTHONPATH", "value": str(PLUGIN_DIR),
                                                                     "how": "prepend"}


@pytest.mark.parametrize(("given", "expected"), [("lora_filesystem_resolver", "lora_filesystem_resolver,sparkd_probe"),
                                                  ("", ",sparkd_probe")])
def test_a_users_vllm_plugins_list_is_kept_and_the_probe_added(tmp_path: Path, given: str, expected: str) -> None:
    assert run_script(tmp_path, make(tmp_path), {"VLLM_PLUGINS": given})["VLLM_PLUGINS"] == expected


def test_a_vllm_plugins_list_set_in_the_config_is_kept_too(tmp_path: Path) -> None:
    cfg = make(tmp_path, launch={"model": "/m", "env": {"VLLM_PLUGINS": "mine", "PYTHONPATH": "/cfg"}})
    got = run_script(tmp_path, cfg, {})
    assert got["VLLM_PLUGINS"] == "mine,sparkd_probe" and got["PYTHONPATH"] == f"{PLUGIN_DIR}:/cfg"


def test_a_launch_that_drains_asks_the_plugin_to_take_in_what_vllm_accepted(tmp_path: Path) -> None:
    assert render(make(tmp_path)).env["SPARKD_DRAIN_ADMIT"] == "1"  # the default drain, 120 s
    assert "SPARKD_DRAIN_ADMIT" not in render(make(tmp_path, stop={"drain_s": 0})).env  # vLLM aborts: nothing owed
    assert "SPARKD_DRAIN_ADMIT" not in render(make(tmp_path, probe=False)).env  # no plugin in vLLM to ask


def test_off_with_one_key(tmp_path: Path) -> None:
    cfg = make(tmp_path, probe=False)
    spec = render(cfg)
    assert "SPARKD_PROBE_DIR" not in spec.env and spec.env_edits == () and spec.probe_dir is None
    assert "env_edits" not in spec.to_json() and "PYTHONPATH" not in render_script(spec)
    assert "PYTHONPATH" not in run_script(tmp_path, cfg, {})


def test_a_rehearsal_keeps_the_probe(tmp_path: Path) -> None:
    spec = render(make(tmp_path))
    rehearsed = rehearsal(spec, executable="/usr/bin/sparkd-standin")
    assert (rehearsed.env_edits, rehearsed.probe_dir) == (spec.env_edits, spec.probe_dir)


def test_the_directory_is_made_and_only_the_probes_files_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "probe"
    assert prepare(str(folder)) is None and stat.S_IMODE(folder.stat().st_mode) == 0o750
    for name in ("worker-0.step", "engine-0.step", "worker-1.step.77.tmp", "keep.txt", "worker-2.step.78.tmp"):
        (folder / name).write_text("x")
    os.utime(folder / "worker-1.step.77.tmp", (time.time() - 120, time.time() - 120))  # a writer died making it
    live = StepWriter(str(folder), 1, 5)  # a writer that runs: a neighbour sharing the folder by mistake
    outside = tmp_path / "outside.step"
    outside.write_text("not ours")
    (folder / "link.step").symlink_to(outside)
    (folder / "dir.step").mkdir()
    assert prepare(str(folder)) is None
    assert sorted(p.name for p in folder.iterdir()) == ["dir.step", "keep.txt", "link.step", "worker-2.step.78.tmp",
                                                        "worker-5.step"]
    live.close()
    assert outside.read_text() == "not ours"
    assert prepare(None) is None
    (tmp_path / "file").write_text("")
    assert "File exists" in (prepare(str(tmp_path / "file")) or "")
    assert "cannot prepare" in (prepare(str(tmp_path / "file" / "sub")) or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root (CI runs as root)")
def test_a_container_user_given_as_a_uid_gets_the_directory(tmp_path: Path) -> None:
    folder = tmp_path / "probe"
    prepare(str(folder), user="1234:5678")
    assert (folder.stat().st_uid, folder.stat().st_gid) == (1234, 5678)


def test_a_container_gets_the_plugin_read_only_and_the_directory_writable(tmp_path: Path) -> None:
    container = {"image": "img", "name": "vllm"}
    cfg = make(tmp_path, runtime="docker-run", container=container)
    mounts = {m["Target"]: m for m in container_options(cfg, entrypoint=["x"], labels={}, rehearse=False, name="n")
              ["mounts"]}
    assert mounts[str(PLUGIN_DIR)]["ReadOnly"] is True
    assert str(tmp_path / "run" / "probe") not in mounts  # a bind mount needs its source: not made yet
    prepare(render(cfg).probe_dir)
    mounts = {m["Target"]: m for m in container_options(cfg, entrypoint=["x"], labels={}, rehearse=False, name="n")
              ["mounts"]}
    assert mounts[str(tmp_path / "run" / "probe")]["ReadOnly"] is False
    off = make(tmp_path, probe=False, runtime="docker-run", container=container)
    assert container_options(off, entrypoint=["x"], labels={}, rehearse=False, name="n")["mounts"] == []


@pytest.mark.parametrize(("image", "version"), [
    ("vllm/vllm-openai:v0.8.5", (0, 8, 5)), ("docker.io/vllm/vllm-openai:0.10.1.post1", (0, 10, 1)),
    ("vllm/vllm-openai:latest", None), ("nvcr.io/nvidia/vllm:25.09-py3", None), (None, None),
    ("myregistry/vllm-openai-fork:v0.1.0", None)])
def test_vllms_version_from_its_own_images_tag(image: str | None, version: tuple[int, int, int] | None) -> None:
    assert version_of_tag(image) == version


def test_check_config_says_when_the_images_vllm_is_too_old(tmp_path: Path) -> None:
    def findings(image: str, probe: bool = True) -> list[str]:
        cfg = make(tmp_path, probe=probe, runtime="docker-run", container={"image": image})
        return [f.message for f in lint(cfg) if f.rule == "probe-vllm-too-old"]

    (old,) = findings("vllm/vllm-openai:v0.8.5")
    assert old.startswith("vLLM 0.8.5 (its image's tag) is too old for the step probe: vLLM loads general plugins in "
                          "its engine core since 0.9.0")
    assert "health.step_probe = false" in old
    assert findings("vllm/vllm-openai:v0.9.0") == [] and findings("vllm/vllm-openai:v0.8.5", probe=False) == []
    assert too_old(MIN_VLLM, "x") is None


def test_check_config_reads_the_version_the_last_preflight_found(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "vllm-args.json").write_text(json.dumps({
        "k1": {"verdict": "ok", "found": "vllm 0.32.0 accepts the rendered argv on this host"},
        "k2": {"verdict": "ok", "found": "vllm 0.8.2 accepts the rendered argv on this host"},
        "k3": {"verdict": "fail", "found": "vLLM rejects the rendered argv"}}))
    done = subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(write(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "health.step_probe: vLLM 0.8.2 (the vLLM the last preflight found" in done.stderr
    assert "[probe-vllm-too-old]" in done.stderr


def write(tmp_path: Path) -> Path:
    path = tmp_path / "sparkd.toml"
    path.write_text(f'runtime = "process"\n[node]\nname = "n"\nrole = "single"\n[launch]\nmodel = "/m"\n[paths]\n'
                    f'state_dir = "{tmp_path / "state"}"\nrun_dir = "{tmp_path / "run"}"\n')
    return path
