"""The garble checks (sparkd/supervisor/acceptance/garble.py) on real garbled outputs from public reports
(tests/data/garble/outputs.json, each with its URL) and on healthy ones, which no check may flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkd.supervisor.acceptance.garble import Kind, check, find_loop, level_result, scripts_of

FIXTURES = json.loads((Path(__file__).parents[1] / "data" / "garble" / "outputs.json").read_text())


def _id(row: dict[str, Any]) -> str:
    return f"{row['url'].rsplit('/', 2)[-2]}#{row['url'].rsplit('/', 1)[-1]}:{'+'.join(row['expect']) or 'clean'}"


@pytest.mark.parametrize("row", FIXTURES, ids=[_id(r) for r in FIXTURES])
def test_real_outputs_get_the_findings_their_report_describes(row: dict[str, Any]) -> None:
    found = check(row["text"], prompt=row["prompt"], finish_reason=row["finish_reason"], tokens=row.get("tokens"),
                  min_tokens=row.get("min_tokens", 1))
    assert sorted({f.kind.value for f in found}) == sorted(row["expect"]), (row["url"], found)


def test_the_fixtures_cover_every_kind_and_healthy_answers() -> None:
    kinds = {k for row in FIXTURES for k in row["expect"]}
    assert kinds == {k.value for k in Kind}
    assert sum(1 for row in FIXTURES if not row["expect"]) >= 5
    assert all(row["url"] and row["what"] for row in FIXTURES)


@pytest.mark.parametrize(("text", "loop"), [
    ("- a\n- b\n" + "-" * 40, False),  # a markdown rule is layout
    ("    " * 8 + "return a", False),  # indentation
    ("a, b = b, a + b\n" * 2, False),  # twice is no loop
    ("The answer is 391. " * 4, True),  # a sentence over and over
    ("abababababab", True),
    ("0123456789" * 3, True),  # three copies make the whole answer
    ("| a | b |\n|---|---|---|---|", False),  # a table's rule
])
def test_what_counts_as_a_loop(text: str, loop: bool) -> None:
    finding = find_loop(text)
    assert (finding is not None) is loop, finding


def test_a_loop_is_named_with_its_unit_and_share() -> None:
    finding = find_loop(" is" * 10)
    assert finding is not None and finding.detail == "' is' repeated 10 times (30 of 30 characters)"


@pytest.mark.parametrize(("prompt", "text", "scripts", "foreign"), [
    ("What is the capital of France?", "Paris, die Hauptstadt: Île-de-France.", (), False),  # Latin, any language
    ("What is π?", "π is about 3.14159.", (), False),  # the prompt's own Greek
    ("What is the area of a circle?", "A = πr²", (), False),  # one Greek letter is not drift
    ("Translate 'good morning' into Chinese.", "早上好", ("han",), False),  # asked for
    ("日本の首都はどこですか？", "東京です。", (), False),
    ("にほんの しゅとは どこ？", "東京です。", (), False),  # a prompt in kana alone: Han and kana go together
    ("Translate 'good morning' into Chinese.", "早上好", (), True),
    ("Summarise the text.", "Кратко: текст о погоде.", (), True),
])
def test_a_script_the_prompt_did_not_ask_for(prompt: str, text: str, scripts: tuple[str, ...], foreign: bool) -> None:
    found = {f.kind for f in check(text, prompt=prompt, finish_reason="stop", scripts=scripts)}
    assert (Kind.foreign_script in found) is foreign


def test_scripts_are_counted_per_letter() -> None:
    assert scripts_of("Hi 你好 мир!") == {"latin": 2, "han": 2, "cyrillic": 3}


@pytest.mark.parametrize(("finish", "tokens", "short"), [
    ("stop", 2, True), ("stop", 3, False), ("length", 1, False), ("abort", 40, True), (None, 40, True),
])
def test_cut_short(finish: str | None, tokens: int, short: bool) -> None:
    found = {f.kind for f in check("Paris", prompt="Capital?", finish_reason=finish, tokens=tokens, min_tokens=3)}
    assert (Kind.cut_short in found) is short


def test_control_characters_are_broken() -> None:
    found = check("Paris\x00\x07", prompt="Capital?", finish_reason="stop")
    assert [f.kind for f in found] == [Kind.broken_characters]


def test_a_level_counts_bad_outputs_and_failed_requests() -> None:
    bad = check("!!!!!!!!!!!!!!!!", prompt="x", finish_reason="length")
    level = level_result(4, [("a/chat#0", ()), ("b/chat#1", bad), ("c/chat#2", ())], ["prompt 'd' (chat): HTTP 500"])
    assert (level.answers, level.bad_outputs) == (3, 2)
    assert level.first().startswith("b/chat at concurrency 4: loop")
