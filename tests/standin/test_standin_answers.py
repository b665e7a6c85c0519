"""What the stand-in answers (sparkd_standin/answers.py) and how a test makes it answer like a broken engine: the
ANSWERS, SPEC_DECODE_ACCEPTS and NAN_LOGITS knobs at launch, ``answers``/``spec``/``nans`` in the control file at run
time; token ids and log-probabilities in vLLM 0.32's shapes, so sparkd's acceptance client reads them as it reads the
real vLLM's (tests/realvllm/)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from freeport import free_port
from standin_helpers import Standins, http, serving

from sparkd.acceptance.client import answer_from
from sparkd.supervisor.acceptance.counters import read_counters
from sparkd.supervisor.acceptance.garble import Kind, check
from sparkd_standin.answers import ANSWER_MODES, answer
from sparkd_standin.knobs import KnobError, load_knobs

PROMPT = "What is the capital of France? Answer in one short sentence."


def test_an_answer_is_the_prompts_own_and_the_same_every_time() -> None:
    first = answer(PROMPT, 48)
    assert first == answer(PROMPT, 48) and len(first) == 48
    assert [t.id for t in first] != [t.id for t in answer("Another question?", 48)]
    assert [t.id for t in answer(PROMPT, 48, "changed")] != [t.id for t in first]
    assert all(t.top[0][1] - t.top[1][1] >= 1.5 for t in first), "no near tie: a change is never numerics"


@pytest.mark.parametrize(("mode", "kinds"), [
    ("normal", set()), ("changed", set()), ("garble", {Kind.broken_characters, Kind.foreign_script}),
    ("loop", {Kind.loop}), ("empty", {Kind.empty}),
])
def test_each_mode_is_what_the_garble_checks_say_it_is(mode: str, kinds: set[Kind]) -> None:
    tokens = answer(PROMPT, 48, mode)
    found = check("".join(t.text for t in tokens), prompt=PROMPT, finish_reason="length" if tokens else "stop",
                  tokens=len(tokens))
    assert {f.kind for f in found} == kinds


def test_the_knobs_are_checked() -> None:
    knobs = load_knobs({"SPARKD_STANDIN_ANSWERS": "loop", "SPARKD_STANDIN_SPEC_DECODE_ACCEPTS": "0",
                        "SPARKD_STANDIN_NAN_LOGITS": "1"})
    assert (knobs.answers, knobs.spec_decode_accepts, knobs.nan_logits) == ("loop", False, True)
    with pytest.raises(KnobError, match=f"SPARKD_STANDIN_ANSWERS: 'purple' \\(one of {', '.join(ANSWER_MODES)}\\)"):
        load_knobs({"SPARKD_STANDIN_ANSWERS": "purple"})


def _ask(port: int, api: str, prompt: str = PROMPT) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    if api == "chat":
        body |= {"messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": 3}
        path = "/v1/chat/completions"
    else:
        body |= {"prompt": prompt, "logprobs": 3}
        path = "/v1/completions"
    response = http("127.0.0.1", port, 10).post(path, json=body)
    assert response.status_code == 200, response.text
    answered: dict[str, object] = response.json()
    return answered


def test_token_ids_and_logprobs_in_vllm_032_shapes_through_both_apis(launch: Standins) -> None:
    port = free_port()
    serving(launch.start("m", "--host", "127.0.0.1", "--port", str(port), env={"SPARKD_STANDIN_TOKENS_PER_S": "500"}),
            port)
    chat, raw = (answer_from(api, "capital", _ask(port, api)) for api in ("chat", "completion"))
    expected = [t.id for t in answer(PROMPT, 6)]
    assert list(chat.token_ids) == list(raw.token_ids) == expected
    assert chat.tokens == raw.tokens and len(chat.top) == 6 and len(chat.top[0]) == 3
    assert chat.top[0] == raw.top[0] and chat.finish_reason == raw.finish_reason == "length"


def test_the_speculative_decoder_and_nans_are_switched_at_run_time(launch: Standins, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.write_text("")
    port = free_port()
    env = {"SPARKD_STANDIN_TOKENS_PER_S": "500", "SPARKD_STANDIN_CONTROL_FILE": str(control),
           "VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
    serving(launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--speculative-config",
                         json.dumps({"method": "mtp", "num_speculative_tokens": 2}), env=env), port)

    def counters() -> object:
        return read_counters(http("127.0.0.1", port).get("/metrics").text)

    before = counters()
    _ask(port, "chat")
    moved = counters()
    assert moved.drafts == 2 and moved.accepted_per_position == {0: 2, 1: 2}  # type: ignore[attr-defined]
    assert moved.corrupted == before.corrupted == 0  # type: ignore[attr-defined]
    control.write_text("1 spec off\n")
    time.sleep(1.0)  # the control file is polled every 0.2 s
    _ask(port, "chat")
    stuck = counters()
    assert stuck.drafts > moved.drafts and stuck.accepted_per_position == moved.accepted_per_position  # type: ignore[attr-defined]
    control.write_text("2 nans on\n")
    time.sleep(1.0)
    _ask(port, "chat")
    assert counters().corrupted == 1  # type: ignore[attr-defined]
    control.write_text("3 answers garble\n")
    time.sleep(1.0)
    garbled = answer_from("chat", "capital", _ask(port, "chat"))
    assert check(garbled.text, prompt=PROMPT, finish_reason="length"), garbled.text


def _families(text: str) -> dict[str, set[str]]:
    """Family name → the label names of its series, for the gate's families."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith(("vllm:spec_decode", "vllm:corrupted")) and "{" in line:
            name, labels = line.split("{", 1)
            out.setdefault(name, set()).update(p.split("=", 1)[0] for p in labels.split("}", 1)[0].split(","))
    return out


def test_the_standins_gate_families_are_the_real_032_pages(launch: Standins) -> None:
    real = (Path(__file__).parents[1] / "data" / "acceptance" / "vllm-032-ngram-metrics-after.txt").read_text()
    port = free_port()
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    serving(launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--speculative-config", spec,
                         env={"VLLM_COMPUTE_NANS_IN_LOGITS": "1"}), port)
    assert _families(http("127.0.0.1", port).get("/metrics").text) == _families(real)
