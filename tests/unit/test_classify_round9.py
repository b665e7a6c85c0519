"""The gaps round 9's held-out misses showed (tests/data/heldout-misses.md), each as a general reading tested both ways
with lines of its own: a log a terminal hard-wrapped at its width is read with its lines joined back, character for
character, and a log wrapped at words, a table or records that merely share a width are left as they are; a rank's
loss is another node's only where there is another node — on a node the daemon knows runs vLLM alone it is the
engine's own, and where this engine's executor reports the death of rank 0, which serves the TCPStore, the store's
loss is that death's echo — while on a headless node of a group, or with nothing known, it stays the peer's."""

from __future__ import annotations

from pathlib import Path

import pytest
from loop_harness import config, running

from sparkd.launch.facts import config_context
from sparkd.supervisor.classify import classify
from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.hardwrap import unwrapped, wrap_width
from sparkd.testing import FakeClock, FakeRuntime

F = FailureClass
RAY = "(EngineCore pid=88) (RayWorkerProc pid=91, ip=10.1.2.3) "
STORE_FLAG = ('[rank2]:[W0304 05:06:07.123456789 ProcessGroupNCCL.cpp:1900] [PG ID 0 PG GUID 0 Rank 2] Failed to check '
              'the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: Failed '
              'to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?')
STORE_RECV = ("[rank3]:[W0304 05:06:07.2 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=41, addr=[node-b]:"
              "50312, remote=[node-a]:29500): Failed to recv, got 0 bytes. Connection was likely closed. Did the "
              "remote server shutdown or crash?")
LONG_INFO = ("(Worker_TP1 pid=91) INFO 03-04 05:06:01 [gpu_model_runner.py:2000] Model loading took 12.5 GiB memory "
             "and 31.2 seconds, with the weights read from the local cache of this node's model directory")


def cut(line: str, width: int) -> list[str]:
    """`line` as a terminal `width` columns wide shows it: pieces of exactly that width, the last shorter."""
    return [line[at:at + width] for at in range(0, len(line), width)]


def wrapped(records: list[str], width: int) -> list[str]:
    return [piece for record in records for piece in cut(record, width)]


# -- a terminal's hard wrap --

@pytest.mark.parametrize("width", [96, 132, 170])
@pytest.mark.parametrize("store", [STORE_FLAG, STORE_RECV], ids=["dump flag", "recvValue"])
def test_a_store_loss_a_terminal_wrapped_is_read_whole(width: int, store: str) -> None:
    """The wrap cuts the peer-loss words (`Connection was likely clo` / `sed`) and the head of torch's line apart:
    joined back, the store's loss is read as it is unwrapped."""
    records = [RAY + store, RAY + LONG_INFO]
    lines = wrapped(records, width)
    assert records[0] in unwrapped(lines)
    failure = classify(1, None, lines)
    assert failure.cls is F.peer_lost, failure.sentence
    assert "Connection was likely closed" in failure.sentence


@pytest.mark.parametrize(("records", "width"), [
    ([RAY + STORE_FLAG, RAY + LONG_INFO], 80),
    (["(Worker_TP0 pid=5) ERROR 03-04 05:06:07 [worker.py:9] torch.OutOfMemoryError: CUDA out of memory. Tried to "
      "allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.02 GiB is free.",
      "(Worker_TP1 pid=6) ERROR 03-04 05:06:07 [worker.py:9] torch.OutOfMemoryError: CUDA out of memory. Tried to "
      "allocate 2.00 GiB. GPU 1 has a total capacity of 79.10 GiB of which 0.98 GiB is free."], 101),
    (["INFO 03-04 05:06:07 [core.py:1] a record cut right before a space goes on with it, which the join keeps as",
      "INFO 03-04 05:06:08 [core.py:1] it was, and a second record cut mid-word makes two pieces of exactly the width"],
     62),
], ids=["three pieces", "mid-word", "a piece starting with a space"])
def test_the_pieces_are_joined_back_character_for_character(records: list[str], width: int) -> None:
    lines = wrapped(records, width)
    assert len(lines) > len(records) and wrap_width(lines) == width
    assert unwrapped(lines) == records


def test_the_joined_line_is_one_event() -> None:
    events = read_events(wrapped([RAY + STORE_FLAG, RAY + LONG_INFO], 120))
    assert [e.text for e in events] == [STORE_FLAG, LONG_INFO.partition(") ")[2]]


_W = 90
_HEAD = ("(EngineCore_DP0 pid=4) INFO 03-04 05:06:07 [loader.py:3] a record that is exactly the width of the log, and "
         "no wrap at all")[:_W]
_HEAD2 = ("(EngineCore_DP0 pid=4) INFO 03-04 05:06:08 [loader.py:3] another record exactly that wide, and no wrap "
          "either for it")[:_W]


@pytest.mark.parametrize("record", [
    "(Worker_TP1 pid=9) INFO 03-04 05:06:07 [core.py:1] ok",
    "INFO 03-04 05:06:07 [core.py:1] a record of vLLM's own",
    "2026-03-04 05:06:07,123 - INFO - a timestamped record",
    "Mar  4 05:06:07 host vllm[12]: a journal line",
    "[rank0]:[E0304 05:06:07.1 ProcessGroupNCCL.cpp:1] torch's line",
    "  File \"/opt/vllm/engine.py\", line 3, in run",
    "Traceback (most recent call last):",
    "RuntimeError: a new exception",
    "node-a:12:34 [0] NCCL WARN a collective's line",
    "raylet: a writer's own line",
    "vllm-1  | a compose service's line",
    "+-------------------------------+",
    "| GPU  Name        Persistence-M |",
    "1234:a line numbered by grep",
    "Process EngineCore_0:",
    "Fatal Python error: Aborted",
    "",
], ids=["process prefix", "vllm header", "timestamp", "journal", "torch", "frame", "traceback", "exception", "nccl",
        "name colon", "compose", "table border", "table row", "line number", "multiprocessing", "faulthandler",
        "blank"])
def test_a_record_after_a_line_of_the_width_is_no_piece(record: str) -> None:
    lines = [_HEAD, record, _HEAD2, record]
    assert max(map(len, lines)) == _W
    assert unwrapped(lines) == lines


@pytest.mark.parametrize("lines", [
    [_HEAD, "rap here", "(Worker_TP1 pid=9) INFO 03-04 05:06:07 [core.py:1] ok"],
    [_HEAD, "rap here", _HEAD, "rap here"],
    ["x" * 50, "yy", "z" * 50, "ww"],
    [_HEAD, "rap here", _HEAD2, "ther", "(Worker_TP1 pid=9) INFO 03-04 05:06:07 [core.py:1] a record longer than the "
                                        "width the others share, so no terminal wrapped them"],
], ids=["one line cut", "the same line twice", "narrower than a terminal", "a longer line"])
def test_what_shows_no_terminals_width_is_left_alone(lines: list[str]) -> None:
    assert wrap_width(lines) is None
    assert unwrapped(lines) == lines


WORDS = ("a viewer that wraps at words fills each line with whole words up to its width and breaks before the first "
         "word that would not fit, dropping the space between them; two of its lines may come out exactly the width "
         "by chance, yet a shorter one goes on into a word too long to have fitted after it")


@pytest.mark.parametrize("width", [63, 70, 71, 85, 91, 99])
def test_a_text_wrapped_at_words_is_left_alone(width: int) -> None:
    """Each of these widths wraps WORDS at words into two lines or more of exactly the width: a line that ends short of
    it before a word too long to have fitted says it was wrapped at words, and nothing is joined."""
    import textwrap

    lines = textwrap.wrap(WORDS, width)
    assert sum(len(line) == width for line in lines) >= 2
    assert wrap_width(lines) is None and unwrapped(lines) == lines


def test_a_piece_short_by_the_spaces_a_copy_stripped_is_still_a_terminals_cut() -> None:
    """A cut that fell on a space leaves a piece one short of the width once the copy strips it, before a word too long
    to have fitted: a terminal's cut still, not a wrap at words."""
    records = [f"(Worker_TP{n} pid=5) " + letter * 41 + "z" * 59 + " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
               for n, letter in enumerate("xy")]
    lines = [piece.rstrip() for piece in wrapped(records, 60)]
    assert [len(line) for line in lines[:2]] == [60, 59]
    assert wrap_width(lines) == 60
    assert unwrapped(lines)[0] == records[0][:119]


# -- a rank's loss where no peer can be lost --

ALONE, GROUP = ClassifyContext(group=False), ClassifyContext(group=True)
WORKER0_DIED = ("(EngineCore_DP0 pid=30) ERROR 03-04 05:06:07 [multiproc_executor.py:150] Worker proc VllmWorker-0 "
                "died unexpectedly, shutting down executor.")
LOSSES = {
    "store flag": STORE_FLAG,
    "store recv": STORE_RECV,
    "store shut down": "[rank1]:[W0304 05:06:07.1 socket.cpp:1] The TCPStore server has shut down, stopping the watch",
    "nccl remote": "RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
    "gloo reset": "(Worker_TP1 pid=9) RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41000: "
                  "Connection reset by peer",
}


@pytest.mark.parametrize("line", LOSSES.values(), ids=LOSSES.keys())
def test_on_a_node_that_runs_vllm_alone_a_lost_rank_is_the_engines_own(line: str) -> None:
    """No other node, no peer: what the ranks lost was a process of this engine, on this host — the engine's death,
    which spends the restart budget (a peer's loss waits for the peer without spending it)."""
    failure = classify(1, None, [line], context=ALONE)
    assert failure.cls is F.engine_dead, failure.sentence
    assert "runs vLLM alone" in failure.sentence


@pytest.mark.parametrize("context", [None, GROUP], ids=["nothing known", "a group"])
@pytest.mark.parametrize("line", LOSSES.values(), ids=LOSSES.keys())
def test_with_a_group_or_nothing_known_a_lost_rank_stays_the_peers(line: str, context: ClassifyContext | None
                                                                   ) -> None:
    assert classify(1, None, [line], context=context).cls is F.peer_lost


def test_alone_the_workers_own_death_line_is_quoted_as_the_cause() -> None:
    failure = classify(1, None, [STORE_FLAG, WORKER0_DIED], context=ALONE)
    assert failure.cls is F.engine_dead and "Worker proc VllmWorker-0 died unexpectedly" in failure.sentence


@pytest.mark.parametrize("lines", [
    [STORE_FLAG, WORKER0_DIED],
    [WORKER0_DIED, STORE_RECV],
    [STORE_FLAG, WORKER0_DIED.replace("(EngineCore_DP0 pid=30) ", "")],
    [STORE_FLAG, WORKER0_DIED.replace("(EngineCore_DP0 pid=30) ERROR ", "ERROR ").replace(
        ", shutting down executor.", " (exit code: -9), shutting down executor.")],
], ids=["store loss first", "death first", "no process prefix", "0.32's exit code"])
def test_a_store_loss_beside_rank_0s_death_in_this_engine_is_its_echo(lines: list[str]) -> None:
    """Rank 0 serves the TCPStore, and the executor reports its own workers' deaths only: with nothing known of the
    node, a store lost where this engine's executor names VllmWorker-0 dead is that death's echo."""
    failure = classify(1, None, lines)
    assert failure.cls is F.engine_dead, failure.sentence
    assert "Worker proc VllmWorker-0 died unexpectedly" in failure.sentence


@pytest.mark.parametrize("lines", [
    [STORE_FLAG, WORKER0_DIED.replace("VllmWorker-0", "VllmWorker-1")],
    [STORE_FLAG, WORKER0_DIED.replace("VllmWorker-0", "VllmWorker-10")],
    [STORE_FLAG, WORKER0_DIED.replace("EngineCore_DP0", "EngineCore_DP1")],
    [LOSSES["nccl remote"], WORKER0_DIED],
], ids=["a headless node's worker", "rank 10", "another data-parallel engine's", "not the store"])
def test_a_store_loss_beside_another_ranks_death_stays_the_peers(lines: list[str]) -> None:
    """A headless node's executor names its own ranks (never 0); another data-parallel engine's worker 0 serves no
    store of the group's; NCCL's remote error names no rank: the peer's loss, read as before."""
    assert classify(1, None, lines).cls is F.peer_lost


# -- what the daemon knows of the launch --

@pytest.mark.parametrize(("sections", "group"), [
    ({}, False),
    ({"launch": {"extra_args": ["--distributed-executor-backend", "mp"]}}, False),
    ({"launch": {"extra_args": ["--distributed-executor-backend=uni"]}}, False),
    ({"node": {"role": "head", "address": "10.9.0.1"},
      "cluster": {"master_addr": "10.9.0.1", "nnodes": 2, "peers": ["10.9.0.2"]}}, True),
    ({"launch": {"nnodes": 2, "node_rank": 0, "master_addr": "10.9.0.1"}}, True),
    ({"launch": {"script": "/workspace/vllm-head.sh"}}, None),
    ({"launch": {"extra_args": ["--distributed-executor-backend", "ray"]}}, None),
    ({"launch": {"extra_args": ["--data-parallel-address", "10.9.0.1"]}}, None),
    ({"launch": {"extra_args": ["--headless"]}}, None),
    ({"launch": {"env": {"RAY_ADDRESS": "10.9.0.1:6379"}}}, None),
], ids=["alone", "mp executor", "uni executor", "a pair's head", "launch nnodes", "a user's script", "ray executor",
        "data parallel across nodes", "headless", "a ray cluster's address"])
def test_the_config_says_whether_the_launch_spans_nodes(tmp_path: Path, sections: dict[str, dict[str, object]],
                                                         group: bool | None) -> None:
    assert config_context(config(tmp_path, **sections)).group is group



@pytest.mark.anyio
async def test_the_daemon_of_a_node_alone_reads_a_lost_rank_as_the_engines(tmp_path: Path) -> None:
    """The daemon classifies with the config's facts: the same log that reads as a lost peer with nothing known is
    the engine's death on a node that runs vLLM alone."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        runtime.say(STORE_RECV)
        runtime.crash(exit_code=1)
        await node.until(lambda: node.status()["last_failure"] is not None)
        assert node.status()["last_failure"]["class"] == "engine_dead"
    assert classify(1, None, [STORE_RECV]).cls is F.peer_lost
