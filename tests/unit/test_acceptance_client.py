"""The gate's requests and how an answer is read (sparkd/acceptance/client.py), in vLLM 0.32's shapes."""

from __future__ import annotations

import pytest

from sparkd.acceptance.client import answer_from, request_body
from sparkd.supervisor.acceptance.answers import Shape

SHAPE = Shape(max_tokens=48, seed=1234, top_logprobs=5)


def test_every_request_is_greedy_seeded_bounded_and_asks_for_token_ids_and_logprobs() -> None:
    chat = request_body("chat", "m", "Hi?", SHAPE, {"enable_thinking": False})
    assert chat == {"model": "m", "max_tokens": 48, "temperature": 0, "seed": 1234, "return_token_ids": True,
                    "messages": [{"role": "user", "content": "Hi?"}], "logprobs": True, "top_logprobs": 5,
                    "chat_template_kwargs": {"enable_thinking": False}}
    raw = request_body("completion", "m", "Hi?", SHAPE)
    assert raw == {"model": "m", "max_tokens": 48, "temperature": 0, "seed": 1234, "return_token_ids": True,
                   "prompt": "Hi?", "logprobs": 5}


def test_a_chat_answer_and_a_completion_answer_read_alike() -> None:
    chat = {"choices": [{"message": {"content": " Paris."}, "finish_reason": "stop", "token_ids": [7, 8],
                         "logprobs": {"content": [
                             {"token": " Paris", "logprob": -0.1, "top_logprobs": [
                                 {"token": " Paris", "logprob": -0.1}, {"token": " Lyon", "logprob": -2.0}]},
                             {"token": ".", "logprob": -0.2, "top_logprobs": [{"token": ".", "logprob": -0.2}]}]}}]}
    raw = {"choices": [{"text": " Paris.", "finish_reason": "stop", "token_ids": [7, 8],
                        "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.1, -0.2],
                                     "top_logprobs": [{" Lyon": -2.0, " Paris": -0.1}, {".": -0.2}]}}]}
    a, b = answer_from("chat", "capital", chat), answer_from("completion", "capital", raw)
    assert (a.key, b.key) == ("capital/chat", "capital/completion")
    assert (a.token_ids, a.text, a.tokens, a.top, a.finish_reason) == (b.token_ids, b.text, b.tokens, b.top, "stop")
    assert a.top[0] == ((" Paris", -0.1), (" Lyon", -2.0)), "best first"


def test_a_reasoning_models_answer_is_its_reasoning_when_the_content_is_empty() -> None:
    body = {"choices": [{"message": {"content": None, "reasoning": "Let me think"}, "finish_reason": "length",
                         "token_ids": [1, 2, 3]}]}
    assert answer_from("chat", "p", body).text == "Let me think"


@pytest.mark.parametrize(("body", "said"), [
    ({"error": "x"}, "an answer without choices"),
    ({"choices": [{"text": "x", "token_ids": None}]}, "an answer without token_ids"),
])
def test_what_is_no_answer_is_said(body: object, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        answer_from("completion", "p", body)
