"""The real vLLM 0.24 against what sparkd ships and what the stand-in accepts (``make test-vllm``, opt-in).

1. The vllm_args preflight check, unchanged, runs the real vLLM's parser on a rendered argv (process runtime, the
   cached virtualenv's ``vllm``): a good argv passes, a misspelled flag fails with vLLM's own message.
2. Every shipped config (config/, config/examples/, docs/examples/) with its own profile and with each profile
   renders an argv the real vLLM accepts, parsed as the check parses it (one process for all, batch_parse.py).
   A config written for a patched vLLM names what stock vLLM rejects in EXPECTED_REJECTIONS, exactly.
3. Every flag the stand-in accepts as vLLM 0.24 (``sparkd_standin.flags.ACCEPTED["0.24"]``) is a flag of the
   real ``vllm serve``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio

from sparkd.config import load_config
from sparkd.config.profiles import profile_names
from sparkd.launch.render import LaunchSpec, render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.vllm_args import check_vllm_args
from sparkd.runtime.process import ProcessRuntime
from sparkd_standin.flags import ACCEPTED

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SHIPPED = sorted([REPO / "config" / "sparkd.toml", *(REPO / "config" / "examples").glob("*.toml"),
                  *(REPO / "docs" / "examples").glob("*.toml")])
# Configs for a patched vLLM: what stock vLLM 0.24 says about them, exactly.
EXPECTED_REJECTIONS = {
    "field-004-dspark-1m-nvfp4.toml": "argument --kv-cache-dtype: invalid choice: 'nvfp4_ds_mla'",
}
def in_vllm(venv: Path, *args: str, stdin: str = "") -> object:
    result = subprocess.run([str(venv / "bin" / "python"), str(HERE / "batch_parse.py"), *args], input=stdin,
                            capture_output=True, text=True, timeout=900, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_preflight_check_runs_the_real_parser(vllm_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    cfg = load_config(REPO / "config" / "examples" / "head.toml", env={"SPARKD_PATHS__STATE_DIR": str(tmp_path)})
    spec = render(cfg)
    vllm = str(vllm_venv / "bin" / "vllm")

    def check(argv: tuple[str, ...]) -> object:
        ctx = PreflightContext(cfg=cfg, spec=LaunchSpec((vllm, *argv[1:]), spec.env, spec.config_hash),
                               runtime=ProcessRuntime(tmp_path / "run"))
        return anyio.run(check_vllm_args, ctx)

    good = check(spec.argv)
    assert good.verdict is Verdict.ok and good.found.startswith("vllm 0.24.0 accepts the rendered argv"), good.found
    bad = check((*spec.argv, "--enable-expert-paralel"))
    assert bad.verdict is Verdict.fail
    assert "unrecognized arguments: --enable-expert-paralel" in bad.found, bad.found


def argvs() -> list[tuple[str, list[str]]]:
    out = []
    for path in SHIPPED:
        for profile in (None, *profile_names()):
            cfg = load_config(path, env={}, profile=profile)
            spec = render(cfg)
            if cfg.launch.script is None and spec.argv[1:2] == ("serve",):
                out.append((f"{path.name} profile {profile or '(its own)'}", list(spec.argv[1:])))
    return out


def test_every_shipped_config_and_profile_parses(vllm_venv: Path) -> None:
    cases = argvs()
    assert len(cases) >= len(SHIPPED) * 5 - 5, "every shipped config renders a serve argv"
    results = in_vllm(vllm_venv, "parse", stdin=json.dumps([argv for _, argv in cases]))
    problems = []
    for (name, argv), result in zip(cases, results, strict=True):  # type: ignore[call-overload]
        expected = EXPECTED_REJECTIONS.get(name.split(" profile ")[0])
        if expected is None and result["code"] != 0:
            problems.append(f"{name}: {result['stderr'].strip().splitlines()[-1:]} for {argv}")
        elif expected is not None and (result["code"] == 0 or expected not in result["stderr"]):
            problems.append(f"{name}: expected vLLM to say {expected!r}, it said {result['stderr'][-300:]!r}")
    assert problems == []


def test_the_standins_flags_are_vllms(vllm_venv: Path) -> None:
    options = in_vllm(vllm_venv, "options")
    assert isinstance(options, dict) and "--max-num-seqs" in options
    assert not {name for name in ACCEPTED["0.24"] if name not in options}


def test_misspellings_are_refused(vllm_venv: Path) -> None:
    flags = ["--max-num-seqz", "--enable-expert-paralel", "--kv-cache-dtype=fp9", "--compilation-config={\"a\":"]
    results = in_vllm(vllm_venv, "parse", stdin=json.dumps([["serve", "m", flag] for flag in flags]))
    assert [r["code"] for r in results] == [2, 2, 2, 2]  # type: ignore[attr-defined]
