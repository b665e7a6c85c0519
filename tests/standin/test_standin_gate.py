"""sparkd's acceptance gate (sparkd/acceptance/runner.py, its real client) against a stand-in told, at run time, to
answer like a broken engine: each part catches what it is for. The pair tests will drive the same knobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
from freeport import free_port
from standin_helpers import Standins, serving

from sparkd.acceptance.client import AnswerClient, Target
from sparkd.acceptance.runner import GateFacts, run_gate
from sparkd.config.acceptance import AcceptanceConfig
from sparkd.state.golden import GoldenStore
from sparkd.supervisor.acceptance.answers import Capacity, Identity
from sparkd.supervisor.acceptance.gate import GateResult, Verdict


def test_each_part_catches_its_fault(launch: Standins, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.write_text("")
    port = free_port()
    env = {"SPARKD_STANDIN_TOKENS_PER_S": "2000", "SPARKD_STANDIN_CONTROL_FILE": str(control),
           "VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
    serving(launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m",
                         "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3}),
                         env=env), port)
    client = AnswerClient(Target(f"http://127.0.0.1:{port}", "m"), timeout_s=30)
    store = GoldenStore(tmp_path / "state")

    def gate(weights: str = "w1") -> GateResult:
        facts = GateFacts("m", Identity("image", weights, "launch"), Capacity(100_000, 3.0, 32768),
                          speculative=True, speculative_positions=3, nans_in_logits=True)
        return anyio.run(lambda: run_gate(AcceptanceConfig(), facts, client, store, clock=time.monotonic,
                                          wall=time.time))

    def tell(n: int, command: str) -> None:
        control.write_text(f"{n} {command}\n")
        time.sleep(1.0)  # polled every 0.2 s

    first = gate()
    assert first.verdict is Verdict.passed, first.sentence
    assert [p.ok for p in first.parts] == [True] * 5
    assert gate().parts[1].sentence == "6 answers match the golden exactly."

    tell(1, "answers changed")
    changed = gate("w2")
    assert changed.verdict is Verdict.answers_changed and changed.refuse
    assert "since the golden, the weights (the model directory's manifest) w1 → w2 changed" in changed.sentence
    for n, mode, said in ((2, "garble", "broken_characters"), (3, "loop", "loop — ' is' repeated 48 times"),
                          (4, "empty", "empty — no text")):
        tell(n, f"answers {mode}")
        garbled = gate()
        assert garbled.verdict is Verdict.garbled and said in garbled.sentence, garbled.sentence
        assert garbled.parts[2].facts["bad_outputs"] == {"1": 1, "2": 2, "4": 4, "6": 6}
    tell(5, "answers normal")
    tell(6, "spec off")
    inactive = gate()
    assert inactive.verdict is Verdict.spec_decode_inactive and not inactive.refuse
    tell(7, "nans on")
    corrupted = gate()
    assert corrupted.verdict is Verdict.corrupted and corrupted.refuse
    assert corrupted.sentence.startswith("19 requests had NaNs in their logits during the gate")
