"""The acceptance gate against the real vLLM 0.32 (issue 37), without a daemon (tests/realvllm/gateworld.py): the
golden recorded on a first pass; restarts of the same launch match it exactly; the same model directory with its
weights replaced by others of the same shape (tests/realvllm/make_tinyllm.py --weights, another seed) is
``answers_changed`` naming the weights' manifest as what changed; ``accept`` records them and the next start passes;
a smaller KV budget is ``capacity_lost`` with its size; the random-weight model's own answers are garbled.

Every start is one ``vllm serve`` on 2 shared cores (45-160 s). ``SPARKD_REALVLLM_RESTARTS`` sets the restarts
(default 2; the evidence in tests/realvllm/README.md ran 10). The starts' and the gates' seconds are printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateworld import Vllm, run, tiny_config

from sparkd.supervisor.acceptance.gate import GateResult, Part, Verdict

pytestmark = pytest.mark.timeout(3600)
RESTARTS = int(os.environ.get("SPARKD_REALVLLM_RESTARTS", "2"))
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def model(realvllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model the test may change (the shared one is never touched)."""
    copy = tmp_path_factory.mktemp("gate") / "tinyllm"
    shutil.copytree(realvllm[1], copy)
    return copy


@pytest.fixture
def served(realvllm: tuple[Path, Path], tmp_path: Path) -> Iterator[list[Vllm]]:
    started: list[Vllm] = []
    yield started
    for vllm in started:
        vllm.stop()


def start(served: list[Vllm], venv: Path, model: Path, folder: Path, name: str, **kw: object) -> Vllm:
    vllm = Vllm(venv, model, folder / f"{name}.log", **kw)  # type: ignore[arg-type]
    served.append(vllm)
    vllm.wait_ready()
    return vllm


def test_golden_restarts_new_weights_accept_and_capacity(realvllm: tuple[Path, Path], model: Path,
                                                         served: list[Vllm], tmp_path: Path) -> None:
    venv = realvllm[0]
    state = tmp_path / "state"
    timings: dict[str, list[float]] = {"start": [], "gate": []}

    def gate(name: str, **kw: object) -> GateResult:
        vllm = start(served, venv, model, tmp_path, name, **kw)
        result = run(tiny_config(), vllm, model, state)
        vllm.stop()
        timings["start"].append(round(vllm.ready_s or 0.0, 1))
        timings["gate"].append(round(result.seconds, 2))
        return result

    first = gate("first")
    assert first.verdict is Verdict.passed, first.sentence
    assert "6 answers recorded as the golden (no golden yet)" in first.parts[1].sentence
    for n in range(RESTARTS):
        again = gate(f"restart-{n}")
        fingerprint = again.parts[1]
        assert again.verdict is Verdict.passed and fingerprint.sentence == "6 answers match the golden exactly.", \
            again.sentence

    subprocess.run([str(venv / "bin" / "python"), str(HERE / "make_tinyllm.py"), "--weights", str(model), "26"],
                   check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, timeout=600)
    changed = gate("other-seed")
    assert changed.verdict is Verdict.answers_changed and changed.refuse, changed.sentence
    assert "since the golden, the weights (the model directory's manifest) " in changed.sentence
    assert "the image" not in changed.sentence and "flags" not in changed.sentence

    vllm = start(served, venv, model, tmp_path, "accept")
    accepted = run(tiny_config(), vllm, model, state, accept=True)
    assert accepted.verdict is Verdict.passed, accepted.sentence
    assert "by `sparkctl accept`; since the old golden the weights" in accepted.parts[1].sentence
    vllm.stop()
    after = gate("after-accept")
    assert after.verdict is Verdict.passed, after.sentence

    # vLLM's CPU build lets VLLM_CPU_KVCACHE_SPACE override --kv-cache-memory-bytes (platforms/cpu.py), and an
    # empty value is an error in its workers: the variable is removed
    smaller = gate("smaller-kv", extra_args=("--kv-cache-memory-bytes", str(768 * 1024**2)),
                   env={"VLLM_CPU_KVCACHE_SPACE": None})
    assert smaller.verdict is Verdict.capacity_lost and not smaller.refuse, smaller.sentence
    capacity = smaller.parts[0]
    assert capacity.part is Part.capacity and capacity.facts["lost_share"] == pytest.approx(0.25, abs=0.01)
    assert "fewer than the golden's" in capacity.sentence and "GiB of KV cache" in capacity.sentence
    print(f"\nacceptance on real vLLM: starts {timings['start']} s, gates {timings['gate']} s; "
          f"load {os.getloadavg()[0]:.1f}\nnew weights: {changed.sentence}\n"
          f"smaller KV cache: {smaller.sentence}", file=sys.stderr)


def test_the_random_weight_models_answers_are_garbled(realvllm: tuple[Path, Path], served: list[Vllm],
                                                      tmp_path: Path) -> None:
    venv, model = realvllm
    vllm = start(served, venv, model, tmp_path, "garble")
    result = run(tiny_config(garble_levels=[1, 2], fingerprint=False), vllm, model, tmp_path / "state")
    assert result.verdict is Verdict.garbled and result.refuse, result.sentence
    assert "answers garbled (concurrency: " in result.sentence  # noise need not trip a check in every answer
