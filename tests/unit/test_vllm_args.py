"""The vllm_args preflight check (sparkd/preflight/vllm_args.py): the serving vLLM parses the rendered argv.

Real vLLM is checked by ``make test-vllm`` (tests/vllm). Here the ``fake_vllm`` fixture (tests/conftest.py) stands
in: vLLM's command-line module layout over the vLLM stand-in's own parser (its 0.24 flags), which rejects unknown
flags with vLLM's own argparse errors.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sparkd.config import config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.vllm_args import check_vllm_args, judge, vllm_message
from sparkd.runtime.base import ExecResult
from sparkd.runtime.process import ProcessRuntime
from sparkd.supervisor.failures import FailureClass


def context(tmp_path: Path, exe: Path, lib: Path | None, **launch: Any) -> PreflightContext:
    (tmp_path / "state").mkdir(exist_ok=True)
    env = {"PYTHONPATH": str(lib)} if lib else {}
    data = {"runtime": "process", "launch": {"executable": str(exe), "model": "m", "env": env, **launch},
            "paths": {"state_dir": str(tmp_path / "state")}}
    cfg = config_from_mapping(data, env={})
    return PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path / "run"))


def test_a_misspelled_flag_fails_in_seconds_naming_it(tmp_path: Path, fake_vllm: tuple[Path, Path]) -> None:
    exe, lib = fake_vllm
    started = time.monotonic()
    result = anyio.run(check_vllm_args, context(tmp_path, exe, lib, max_num_seqs=4,
                                                extra_args=["--max-num-seqz", "8"]))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert "vLLM rejects the rendered argv on this host: " in result.found
    assert "vllm: error: unrecognized arguments: --max-num-seqz 8"  # vLLM 0.24's own words in result.found
    assert time.monotonic() - started < 60  # seconds, not a cold start (a generous bound)


def test_an_accepted_argv_is_ok_and_cached(tmp_path: Path, fake_vllm: tuple[Path, Path]) -> None:
    exe, lib = fake_vllm
    ctx = context(tmp_path, exe, lib, max_num_seqs=4, compilation_config={"cudagraph_mode": "PIECEWISE"})
    first = anyio.run(check_vllm_args, ctx)
    assert first.verdict is Verdict.ok and first.found == "vllm 0.0.0+standin-parser accepts the rendered argv on " \
                                                          "this host"
    (lib / "vllm" / "entrypoints" / "cli" / "main.py").write_text("raise SystemExit(3)\n")  # any parse now fails
    second = anyio.run(check_vllm_args, ctx)
    assert second.verdict is Verdict.ok and second.found.endswith("(cached)")
    changed = anyio.run(check_vllm_args, context(tmp_path, exe, lib, max_num_seqs=5))  # another argv: parsed
    assert changed.verdict is Verdict.fail


def test_not_checked_without_vllm_or_in_script_mode(tmp_path: Path, fake_vllm: tuple[Path, Path]) -> None:
    exe, _ = fake_vllm
    result = anyio.run(check_vllm_args, context(tmp_path, exe, None))  # no vllm importable by its interpreter
    assert result.verdict is Verdict.warn and "argv not checked on this host: cannot import vLLM" in result.found
    script = tmp_path / "serve.sh"
    script.write_text("exec vllm serve m\n")
    scripted = anyio.run(check_vllm_args, context(tmp_path, exe, None, script=str(script)))
    assert scripted.verdict is Verdict.ok and scripted.found.startswith("not checked: [launch] script")


@pytest.mark.parametrize(
    ("code", "stderr", "verdict", "words"),
    [
        (0, "", Verdict.ok, "accepts the rendered argv in container c"),
        (2, "usage: vllm [-h] [-v]\nvllm: error: unrecognized arguments: --enable-expert-paralel\n", Verdict.fail,
         "vLLM rejects the rendered argv in container c: vllm: error: unrecognized arguments: --enable-expert-paralel"),
        (2, "usage: vllm serve [model_tag] [options]\nvllm serve: error: argument --kv-cache-dtype: invalid choice: "
            "'nope' (choose from 'auto', 'fp8')\n", Verdict.fail, "invalid choice: 'nope'"),
        (1, "Traceback (most recent call last):\n  ...\nTypeError: Error: --enable-auto-tool-choice requires "
            "--tool-call-parser\n", Verdict.fail, "requires --tool-call-parser"),
        (90, "cannot import vLLM's command line with /usr/bin/python3: No module named 'vllm'\n", Verdict.warn,
         "argv not checked in container c: cannot import"),
        (92, "cannot import vLLM's command line: libcudart.so.13: cannot open shared object file\n", Verdict.fail,
         "vLLM cannot start in container c"),
        (124, "timed out after 180 s", Verdict.warn, "took too long"),
    ],
)
def test_judge(code: int, stderr: str, verdict: Verdict, words: str) -> None:
    got, found, _ = judge(ExecResult(code, "vllm 0.24.0\n" if code == 0 else "", stderr), "in container c")
    assert got is verdict and words in found, found


# vLLM 0.32's own output when its install is broken (the real-vLLM tier's venv, reviews/real-vllm.md §1): the parse
# fails before any argument is read, so it is the image's fault, named, and never "rejects the rendered argv".
BROKEN_TORCHVISION = """Traceback (most recent call last):
  File "<string>", line 5, in <module>
  File "/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/main.py", line 43, in main
    import vllm.entrypoints.cli.benchmark.main
  File "/venv/lib/python3.11/site-packages/transformers/image_utils.py", line 54, in <module>
    from torchvision.io import ImageReadMode, decode_image
  File "/venv/broken-image/torchvision/__init__.py", line 8, in <module>
    from torchvision import (
  File "/venv/broken-image/torchvision/_meta_registrations.py", line 163, in <module>
    @torch.library.register_fake("torchvision::nms")
  File "/venv/lib/python3.11/site-packages/torch/library.py", line 493, in impl
    if torch._C._dispatch_has_kernel_for_dispatch_key(
RuntimeError: operator torchvision::nms does not exist
"""
NO_METADATA = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/main.py", line 99, in main
    version=importlib.metadata.version("vllm"),
  File "/usr/lib/python3.11/importlib/metadata/__init__.py", line 565, in from_name
    raise PackageNotFoundError(name)
importlib.metadata.PackageNotFoundError: No package metadata was found for vllm
"""
CUDA_LIB = "OSError: libc10_cuda.so: cannot open shared object file: No such file or directory\n"


@pytest.mark.parametrize(("code", "stderr", "named"), [
    (92, BROKEN_TORCHVISION, "importing torchvision._meta_registrations failed with `RuntimeError: operator "
                             "torchvision::nms does not exist`"),
    (1, NO_METADATA, "no package metadata for vllm"),
    (92, CUDA_LIB, "cannot load the shared library libc10_cuda.so"),
], ids=["import raises", "metadata", "shared library"])
def test_a_broken_install_is_an_image_error_naming_what_is_missing(code: int, stderr: str, named: str) -> None:
    verdict, found, cls = judge(ExecResult(code, "", stderr), "on this host")
    assert verdict is Verdict.fail and cls is FailureClass.image_error, found
    assert found.startswith("vLLM cannot start on this host: ") and named in found, found
    assert "rejects the rendered argv" not in found


def test_vllm_message_keeps_the_error_line_not_the_usage() -> None:
    assert vllm_message("usage: vllm serve\nvllm serve: error: x\n") == "vllm serve: error: x"
