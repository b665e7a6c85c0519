"""Preflight decisions, apart from the I/O: tables of observations → verdict, sentence, action."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from sparkd.config import Config, PreflightConfig, config_from_mapping
from sparkd.guard.meminfo import MemInfo, parse_meminfo
from sparkd.launch.devices import Devices, Gpu, launch_devices
from sparkd.preflight import gpu, host, image, memory, ports, processes, shm, shmholders, stale, target
from sparkd.preflight.base import GIB, MIB, Verdict
from sparkd.preflight.stale import StaleProcess
from sparkd.runtime import make_runtime
from sparkd.supervisor.failures import FailureClass

V = Verdict


def cfg(**sections: Any) -> Config:
    data: dict[str, Any] = {"runtime": "process", "launch": {"model": "m"}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return config_from_mapping(data, env={})


# ---- launch target: local models, listings ---------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("/models/DeepSeek-V4-Flash", "/models/DeepSeek-V4-Flash"),
        ("deepseek-ai/DeepSeek-V4-Flash", None),
        ("gpt2", None),
    ],
)
def test_local_model(model: str, expected: str | None) -> None:
    assert target.local_model(model) == expected


def listing(
    *names: str, status: int = 0, index: dict[str, Any] | None = None, index_name: str = "model.safetensors.index.json"
) -> target.Listing:
    out = "\n".join(names) + "\n"
    if index is not None:
        out += target.INDEX_MARK + index_name + "\n" + json.dumps(index)
    return target.parse_listing(status, out)


SHARDS_4 = [f"model-{k:05d}-of-00004.safetensors" for k in range(1, 5)]
INDEX_4 = {"weight_map": {f"layer.{k}": s for k, s in enumerate(SHARDS_4 * 2)}}


@pytest.mark.parametrize(
    ("case", "lst", "problem"),
    [
        ("complete with index", listing("config.json", "model.safetensors.index.json", *SHARDS_4, index=INDEX_4), None),
        ("complete without index", listing("config.json", *SHARDS_4), None),
        ("single file", listing("config.json", "tokenizer.json", "model.safetensors"), None),
        ("missing dir", listing(status=3), "does not exist in container vllm"),
        ("a file", listing(status=4), "is not a directory"),
        ("unreadable", listing(status=5), "cannot be read"),
        ("no config.json", listing(*SHARDS_4), "has no config.json"),
        ("no weights", listing("config.json", "tokenizer.json"), "has no weight shards"),
        (
            "index lists a missing shard",
            listing("config.json", *SHARDS_4[:3], index=INDEX_4),
            "is missing 1 of 4 weight shards listed in model.safetensors.index.json in container vllm: "
            "model-00004-of-00004.safetensors",
        ),
        (
            "of-pattern gap without index",
            listing("config.json", SHARDS_4[0], SHARDS_4[2], SHARDS_4[3]),
            "is missing 1 weight shard(s) in container vllm: model-00002-of-00004.safetensors",
        ),
        (
            "broken index",
            target.parse_listing(0, f"config.json\n{target.INDEX_MARK}model.safetensors.index.json\n{{"),
            "unreadable model.safetensors.index.json",
        ),
    ],
)
def test_model_problem(case: str, lst: target.Listing, problem: str | None) -> None:
    why, seen = target.model_problem("/models/m", lst, "in container vllm")
    if problem is None:
        assert why is None and seen.startswith("model /models/m"), case
    else:
        assert why is not None and problem in why and why.startswith("the model path /models/m"), (case, why)


def test_gguf_file_is_a_model() -> None:
    assert target.model_problem("/models/m.gguf", listing(status=4), "on this host")[0] is None


# ---- stale processes ----------------------------------------------------------------------------------------


def test_title_prefix_follows_the_launch() -> None:
    assert stale.title_prefix({}, {}) == "VLLM::"
    assert stale.title_prefix({"VLLM_PROCESS_NAME_PREFIX": "SPARK"}, {}) == "SPARK::"
    assert stale.title_prefix({}, {"VLLM_PROCESS_NAME_PREFIX": "BOX"}) == "BOX::"


@pytest.mark.parametrize(
    ("found", "survivors", "dry_run", "verdict", "text"),
    [
        ([], [], False, V.ok, "no stale vLLM process"),
        ([processes.Candidate(10, ["VLLM::EngineCore"], "orphaned")], [], True, V.warn,
         "10 VLLM::EngineCore (orphaned)"),
        ([processes.Candidate(10, ["VLLM::EngineCore"], "orphaned")], [], False, V.fixed, "1 stale"),
        (
            [processes.Candidate(10, ["VLLM::EngineCore"], "orphaned")],
            [StaleProcess(10, "VLLM::EngineCore")],
            False,
            V.fail,
            "outlived SIGKILL: 10 VLLM::EngineCore",
        ),
    ],
)
def test_stale_verdict(
    found: list[processes.Candidate], survivors: list[StaleProcess], dry_run: bool, verdict: Verdict, text: str
) -> None:
    v, found_text, _ = processes.verdict(found, survivors, dry_run=dry_run)
    assert v is verdict and text in found_text


# ---- ports ------------------------------------------------------------------------------------------------------

NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 0100007F:7325 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0 100 0 0 10 0
   2: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1
   3: 0100007F:1F41 0100007F:D2F1 06 00000000:00000000 03:00000F3A 00000000     0        0 0 3 0
"""
NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when
   0: 00000000000000000000000000000000:7325 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0
   1: 0000000000000000FFFF00000100007F:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0
"""  # noqa: E501


def test_parse_net_tcp() -> None:
    entries = ports.parse_net_tcp(NET_TCP)
    assert [(e.address, e.port, e.state, e.inode) for e in entries] == [
        ("0.0.0.0", 8000, 0x0A, 111),
        ("127.0.0.1", 29477, 0x0A, 222),
        ("127.0.0.1", 8000, 0x01, 333),
        ("127.0.0.1", 8001, 0x06, 0),
    ]
    assert ports.holder_inodes(entries, 8000) == {111}  # the established connection is not a holder
    six = ports.parse_net_tcp(NET_TCP6)
    assert [(e.address, e.port, e.inode) for e in six] == [("::", 29477, 444), ("::ffff:127.0.0.1", 8000, 555)]


API = ports.Wanted(8000, "0.0.0.0", "API port (launch.port)")
STALE = ports.Holder(77, "VLLM::Worker_TP0", stale=True)
OTHER = ports.Holder(88, "python3 -m http.server 8000 # vllm", stale=False)
WATCHED = ports.Holder(99, "vllm serve /models/m", stale=False, protected=True)


@pytest.mark.parametrize(
    ("error", "holders", "dry_run", "verdict", "end", "cls", "text"),
    [
        (None, [], False, V.ok, (), None, "API port (launch.port) 8000 is free"),
        (errno.EADDRINUSE, [STALE], False, V.fixed, (77,), None, "was held by stale vLLM PID 77 (VLLM::Worker_TP0)"),
        (errno.EADDRINUSE, [STALE], True, V.warn, (), None, "is held by stale vLLM PID 77"),
        (
            errno.EADDRINUSE,
            [OTHER],
            False,
            V.fail,
            (),
            FailureClass.port_in_use,
            "held by PID 88 (python3 -m http.server 8000 # vllm): not a stale vLLM process",
        ),
        (errno.EADDRINUSE, [STALE, OTHER], False, V.fail, (), FailureClass.port_in_use, "PID 88"),
        # an operator's preflight while vLLM runs: its own port is not a problem
        (errno.EADDRINUSE, [WATCHED], False, V.ok, (), None, "held by the watched vLLM instance"),
        (errno.EADDRINUSE, [], False, V.fail, (), FailureClass.port_in_use, "no process here shows"),
        (errno.EADDRNOTAVAIL, [], False, V.fail, (), FailureClass.config_error, "not an address of this node"),
        (errno.EACCES, [], False, V.fail, (), FailureClass.port_in_use, "cannot be bound"),
    ],
)
def test_port_decision(
    error: int | None,
    holders: list[ports.Holder],
    dry_run: bool,
    verdict: Verdict,
    end: tuple[int, ...],
    cls: FailureClass | None,
    text: str,
) -> None:
    d = ports.decide(API, error, holders, dry_run=dry_run)
    assert (d.verdict, d.end, d.failure_class) == (verdict, end, cls)
    assert text in d.found


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({}, [8000]),
        ({"node": {"role": "head"}}, [8000, 29501]),
        ({"node": {"role": "head", "rank": 0}, "cluster": {"master_port": 29555}}, [8000, 29555]),
        ({"node": {"role": "worker", "rank": 1}}, []),
        ({"runtime": "docker-exec", "container": {"image": "x", "host_network": False}}, []),
        ({"runtime": "docker-run", "container": {"image": "x", "host_network": False}}, []),
        ({"runtime": "docker-run", "container": {"image": "x", "host_network": True}}, [8000]),
    ],
)
def test_wanted_ports(sections: dict[str, Any], expected: list[int]) -> None:
    """The runtime says whether vLLM's ports are the host's; the check asks it, never the runtime kind."""
    config = cfg(**sections)
    on_host = make_runtime(config).shares_host_network
    assert [w.port for w in ports.wanted_ports(config, on_host_network=on_host)] == expected


# ---- /dev/shm -------------------------------------------------------------------------------------------------

SEG = shm.Segment("psm_0badf00d", 24 * MIB)


@pytest.mark.parametrize(
    ("removed", "free", "dry_run", "verdict", "text"),
    [
        ([], 10 * GIB, False, V.ok, "no leaked segment"),
        ([SEG], 10 * GIB, False, V.fixed, "freed 25165824 bytes (24.0 MiB)"),
        ([SEG], 10 * GIB, True, V.warn, "would remove them, freeing 25165824 bytes"),
        ([], 100 * MIB, False, V.fail, "less than the 256.0 MiB vLLM needs"),
        ([SEG], 240 * MIB, True, V.warn, "would remove"),  # the dry run counts what it would free
        ([], None, False, V.ok, "no leaked segment"),
    ],
)
def test_shm_verdict(removed: list[shm.Segment], free: int | None, dry_run: bool, verdict: Verdict, text: str) -> None:
    v, found, did = shm.verdict(removed, free, 256 * MIB, dry_run=dry_run, where=Path("/dev/shm"))
    assert v is verdict and text in found + " " + did


# ---- memory ------------------------------------------------------------------------------------------------------

MEMINFO = """\
MemTotal:       125483480 kB
MemFree:         4980736 kB
MemAvailable:   120000000 kB
Buffers:           10240 kB
Cached:         115343360 kB
Active:          6000000 kB
Inactive:      110000000 kB
Unevictable:           0 kB
Shmem:             20480 kB
Slab:             800000 kB
PageTables:        40000 kB
HugePages_Total:       0
"""


def test_droppable_cache_is_page_cache_and_buffers_less_shared_memory() -> None:
    info = parse_meminfo(MEMINFO)
    assert memory.droppable(info) == (115343360 + 10240 - 20480) * 1024
    assert info.driver_residual == (125483480 - 4980736 - 6000000 - 110000000 - 800000 - 40000) * 1024


def mem(
    total_gib: float, free_gib: float, *, cached_gib: float = 0, anon_gib: float = 0, driver_gib: float = 0
) -> MemInfo:
    """A meminfo whose residual (driver-held) memory is ``driver_gib``."""
    rest = total_gib - free_gib - cached_gib - anon_gib - driver_gib - 1.0
    assert rest >= -1e-9
    g = GIB
    return MemInfo(mem_total=int(total_gib * g), mem_free=int(free_gib * g),
                   mem_available=int((free_gib + cached_gib) * g), cached=int(cached_gib * g), swap_total=0,
                   swap_free=0, active=int((cached_gib + anon_gib) * g),
                   inactive=int(rest * g), unevictable=0, shmem=0, slab=int(0.5 * g), page_tables=int(0.5 * g))


HOLDERS = [memory.Holder(4242, 40 * GIB, "python3 train.py")]


@pytest.mark.parametrize(
    ("case", "info", "kw", "verdict", "texts", "reboot"),
    [
        ("plenty", mem(119.7, 115), {}, V.ok, ["covers 0.90 x MemTotal 119.7 GiB + 2.0 GiB margin"], False),
        (
            "page cache, dry run would drop it",
            mem(119.7, 11, cached_gib=100),
            {"may_drop": 100 * GIB},
            V.warn,
            ["only once the page cache"],
            False,
        ),
        (
            "page cache, drop_caches off",
            mem(119.7, 11, cached_gib=100),
            {"cache_dropped": False},
            V.fail,
            ["page cache holds 100.0 GiB ([preflight] drop_caches is off)"],
            False,
        ),
        (
            "a process holds it",
            mem(119.7, 70, anon_gib=45),
            {"holders": HOLDERS},
            V.fail,
            ["top memory holders: PID 4242 python3 train.py (40.0 GiB)", "stop what holds the memory"],
            False,
        ),
        (
            "nothing explains it",
            mem(119.7, 80, driver_gib=35),
            {"holders": HOLDERS[:0]},
            V.fail,
            ["35.0 GiB is held outside any process or cache", "a reboot is likely needed"],
            True,
        ),
    ],
)
def test_memory_assessment(
    case: str, info: dict[str, int], kw: dict[str, Any], verdict: Verdict, texts: list[str], reboot: bool
) -> None:
    a = memory.assess(info, 0.9, 2 * GIB, **kw)
    assert a.verdict is verdict, (case, a.found)
    for text in texts:
        assert text in a.found, (case, a.found)
    assert a.reboot_likely is reboot


def test_need_matches_vllm_request() -> None:
    # vLLM 0.13: requested = ceil(total x utilization): 0.9 x 121.69 GiB → 109.52 GiB
    total = int(121.69 * GIB)
    assert round(memory.need_bytes(total, 0.9, 0) / GIB, 2) == 109.52



@pytest.mark.parametrize(("sections", "expected"), [
    ({}, 0.9),
    ({"launch": {"model": "m", "gpu_memory_utilization": 0.75}}, 0.75),
    ({"launch": {"model": "m", "extra_args": ["--gpu-memory-utilization=0.8"]}}, 0.8),
    ({"launch": {"model": "m", "script": "/w/head.sh"}}, 0.9),
])
def test_utilization_is_what_vllm_receives(sections: dict[str, Any], expected: float) -> None:
    from sparkd.launch.render import render

    assert memory.utilization_of(render(cfg(**sections)).argv) == expected


def test_top_holders() -> None:
    rows = [
        memory.Holder(1, 5, "a"),
        memory.Holder(2, 50, "b"),
        memory.Holder(3, 0, "kthread"),
        memory.Holder(4, 50, "c"),
    ]
    assert [h.pid for h in memory.top_holders(rows, 2)] == [2, 4]


# ---- host hardening -----------------------------------------------------------------------------------------

SWAPS = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swap.img   file  8388604  0  -2\n"


@pytest.mark.parametrize(
    ("seen", "pf", "keys"),
    [
        (host.Observed([], 3145728, 0), PreflightConfig(), []),
        (
            host.Observed(host.parse_swaps(SWAPS), 65536, 1),
            PreflightConfig(),
            ["swap", "vm.min_free_kbytes", "vm.overcommit_memory"],
        ),
        (
            host.Observed(["/swap.img (8.0 GiB)"], 65536, 1),
            PreflightConfig(swap_off=False, min_free_kbytes=0, overcommit_memory=None),
            [],
        ),
        (host.Observed([], None, None), PreflightConfig(), []),  # unreadable: nothing to say
    ],
)
def test_host_findings(seen: host.Observed, pf: PreflightConfig, keys: list[str]) -> None:
    items = host.findings(seen, pf)
    assert [f.key for f in items] == keys
    if keys:
        assert "swap is on: /swap.img (8.0 GiB), want off" in host.describe(items)
        assert [f.value for f in items] == [None, "1572864", "0"]


# ---- image assertions ----------------------------------------------------------------------------------------

MXFP4_OK = "def f():\n    torch.cuda.empty_cache()\n\ndef g():\n    del w13, w2\n    torch.cuda.empty_cache()\n"
MXFP4_TWICE = MXFP4_OK + "    del w13, w2\n    torch.cuda.empty_cache()  # mod re-applied\n"
RULE = config_from_mapping(
    {
        "runtime": "process",
        "launch": {"model": "m"},
        "preflight": {"assert": [{"path": "/x/mxfp4.py", "pattern": "empty_cache", "count": 2}]},
    },
    env={},
).preflight.asserts[0]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (MXFP4_OK, None),
        (MXFP4_TWICE, "has 3 line(s) matching 'empty_cache' in container vllm, expected 2"),
        (None, "/x/mxfp4.py does not exist in container vllm"),
        ("", "has 0 line(s) matching"),
    ],
)
def test_image_assertion(text: str | None, problem: str | None) -> None:
    why = image.problem(RULE, text, "in container vllm")
    assert why == problem if problem is None else problem in (why or "")


def test_count_lines_is_grep_c() -> None:
    assert image.count_lines("a empty_cache empty_cache\nb\nempty_cache()\n", r"empty_cache") == 2
    assert image.count_lines("x = 1\n", r"^x\s*=") == 1


# ---- GPU compute processes ----------------------------------------------------------------------------------


def test_parse_compute_apps() -> None:
    out = "1234, /usr/bin/python3\n 77 , VLLM::Worker_TP0\n\nNo running processes found\n"
    assert gpu.parse_compute_apps(out) == [gpu.App(1234, "/usr/bin/python3"), gpu.App(77, "VLLM::Worker_TP0")]
    assert gpu.parse_compute_apps("") == []


@pytest.mark.parametrize(
    ("apps", "stale_pids", "protect", "dry_run", "verdict", "end", "text"),
    [
        ([], set(), frozenset(), False, V.ok, [], "no leftover"),
        ([gpu.App(5, "python")], set(), frozenset({5}), False, V.ok, [], "belong to the watched instance"),
        ([gpu.App(7, "python3")], {7}, frozenset(), False, V.fixed, [7], "PID 7 (VLLM::Worker_TP0)"),
        ([gpu.App(7, "python3")], {7}, frozenset(), True, V.warn, [], "stale vLLM"),
        (
            [gpu.App(7, "python3"), gpu.App(9, "/usr/bin/python3")],
            {7},
            frozenset(),
            False,
            V.fail,
            [],
            "PID 9 (/usr/bin/python3)",
        ),
    ],
)
def test_gpu_decision(
    apps: list[gpu.App],
    stale_pids: set[int],
    protect: frozenset[int],
    dry_run: bool,
    verdict: Verdict,
    end: list[int],
    text: str,
) -> None:
    v, found, to_end = gpu.decide(apps, stale_pids, protect, {7: "PID 7 (VLLM::Worker_TP0)"}, dry_run=dry_run)
    assert (v, to_end) == (verdict, end) and text in found


def test_parse_compute_apps_with_their_gpu_and_the_gpu_list() -> None:
    out = "1234, /usr/bin/python3, GPU-aaaa\n77, VLLM::Worker_TP0, GPU-bbbb\n"
    assert gpu.parse_compute_apps(out) == [gpu.App(1234, "/usr/bin/python3", "GPU-aaaa"),
                                           gpu.App(77, "VLLM::Worker_TP0", "GPU-bbbb")]
    assert gpu.parse_gpus("0, GPU-aaaa\n1, GPU-bbbb\n") == [Gpu(0, "GPU-aaaa"), Gpu(1, "GPU-bbbb")]


EIGHT = [Gpu(i, f"GPU-{i}{i}{i}{i}-uuid") for i in range(8)]


@pytest.mark.parametrize(("apps", "devices", "kept", "elsewhere"), [
    # a neighbour's vLLM on GPU 5 is not a leftover for a launch on GPUs 0 and 1
    ([gpu.App(10, "python", "GPU-5555-uuid"), gpu.App(11, "python", "GPU-1111-uuid")],
     launch_devices({"CUDA_VISIBLE_DEVICES": "0,1"}, container=False), [11], 1),
    # a launch naming no GPU uses them all: every compute process counts
    ([gpu.App(10, "python", "GPU-5555-uuid")], launch_devices({}, container=False), [10], 0),
    # an app whose GPU nvidia-smi does not know counts (nothing proves it elsewhere)
    ([gpu.App(10, "python", "GPU-unknown")], launch_devices({"CUDA_VISIBLE_DEVICES": "0"}, container=False), [10], 0),
    # a container given GPUs 4-7, its vLLM told CUDA_VISIBLE_DEVICES=1 (the container's second: host GPU 5)
    ([gpu.App(10, "python", "GPU-5555-uuid"), gpu.App(11, "python", "GPU-4444-uuid")],
     launch_devices({"CUDA_VISIBLE_DEVICES": "1"}, container=True, gpus="device=4,5,6,7"), [10], 1),
])
def test_gpu_only_the_launchs_devices(apps: list[gpu.App], devices: Devices, kept: list[int], elsewhere: int) -> None:
    mine, other = gpu.on_launch_gpus(apps, EIGHT, devices)
    assert ([a.pid for a in mine], other) == (kept, elsewhere)


def test_gpu_a_neighbour_on_another_gpu_is_said_to_be_left_alone() -> None:
    v, found, _ = gpu.decide([], set(), frozenset(), {}, dry_run=False, elsewhere=2)
    assert v is V.ok and found == "no leftover GPU compute process; 2 on GPUs this launch does not use, left alone"


@pytest.mark.parametrize(("env", "container", "gpus", "selected", "words"), [
    ({}, False, None, list(range(8)), "every GPU (the launch names none)"),
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, False, None, [2, 0], "CUDA_VISIBLE_DEVICES=2,0"),
    ({"CUDA_VISIBLE_DEVICES": ""}, False, None, [], "CUDA_VISIBLE_DEVICES="),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, False, None, [], "CUDA_VISIBLE_DEVICES=-1"),
    ({"CUDA_VISIBLE_DEVICES": "1,9,2"}, False, None, [1], "CUDA_VISIBLE_DEVICES=1,9,2"),  # CUDA stops at 9
    ({"CUDA_VISIBLE_DEVICES": "GPU-3333"}, False, None, [3], "GPU-3333"),  # a unique UUID prefix
    ({"CUDA_VISIBLE_DEVICES": "GPU-"}, False, None, [], "GPU-"),  # ambiguous: CUDA finds nothing
    ({"NVIDIA_VISIBLE_DEVICES": "3"}, False, None, list(range(8)), "every GPU"),  # the runtime's, not a host's
    ({}, True, "all", list(range(8)), "every GPU"),
    ({}, True, "2", [0, 1], "[container] gpus = 2 (the first 2)"),
    ({}, True, "device=6,7", [6, 7], "[container] gpus = device=6,7"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, True, "device=6,7", [6], "then CUDA_VISIBLE_DEVICES=0"),
    ({"NVIDIA_VISIBLE_DEVICES": "4,5"}, True, None, [4, 5], "NVIDIA_VISIBLE_DEVICES=4,5"),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, True, None, [], "NVIDIA_VISIBLE_DEVICES=void"),
    ({"NVIDIA_VISIBLE_DEVICES": "4,5"}, True, "device=1", [1], "[container] gpus = device=1"),  # the request wins
])
def test_launch_devices(env: dict[str, str], container: bool, gpus: str | None, selected: list[int],
                        words: str) -> None:
    devices = launch_devices(env, container=container, gpus=gpus)
    assert [g.index for g in devices.select(EIGHT)] == selected
    assert words in devices.describe()


def entry(name: str, inode: int) -> shmholders.Entry:
    return shmholders.Entry(name, inode, dev=27, size=4096, mtime=0.0)


@pytest.mark.parametrize(("name", "held", "owned", "live", "expected"), [
    ("psm_0badf00d", False, False, set(), "naming"),
    ("nccl-x1", False, False, set(), "naming"),
    ("psm_0badf00d", True, True, set(), None),  # held (by descriptor or by mapping under any name): never
    ("sem.mp-abc", False, False, set(), None),  # multiprocessing's naming proves nothing
    ("sem.mp-abc", False, True, set(), "ours"),  # the ledger's proof: our launch held it
    ("sem.mp-abc", True, True, set(), None),  # ours once, but some live process holds it now
    ("torch_4242_77_0", False, False, set(), "naming"),  # its creator is gone
    ("torch_4242_77_0", False, False, {4242}, None),  # its creator runs: it may be in flight
    ("torch_4242_77_0", False, True, {4242}, "ours"),
    ("vllm_psm_x", False, False, set(), None),  # not a name we know
])
def test_shm_decide(name: str, held: bool, owned: bool, live: set[int], expected: str | None) -> None:
    found = [entry(name, 11)]
    chosen = shm.decide(found, {11} if held else set(), {(name, 11): {}} if owned else {}, live)
    assert [s.why for s in chosen] == ([expected] if expected else [])


@pytest.mark.parametrize(("name", "uid", "owned", "expected"), [
    ("psm_0badf00d", 0, False, "naming"),  # the launch's uid
    ("psm_0badf00d", 1000, False, "naming"),  # the container's numeric user
    ("psm_user1res", 1, False, None),  # another user's SharedMemory: theirs (security.md §7)
    ("nccl-x1", 1, False, None),
    ("psm_user1res", None, False, None),  # owner unknown
    ("psm_user1res", 1, True, "ours"),  # the ledger noted it held by our launch, of its own uid
])
def test_shm_naming_only_for_the_launch_uids(name: str, uid: int | None, owned: bool, expected: str | None) -> None:
    found = [shmholders.Entry(name, 11, dev=27, size=4096, mtime=0.0, uid=uid)]
    chosen = shm.decide(found, set(), {(name, 11): {}} if owned else {}, set(), frozenset({0, 1000}))
    assert [s.why for s in chosen] == ([expected] if expected else [])


def test_shm_ledger_proof_needs_the_same_inode() -> None:
    assert shm.decide([entry("sem.mp-abc", 12)], set(), {("sem.mp-abc", 11): {}}, set()) == []


def test_shm_sweep_removes_nothing_when_it_cannot_see_every_process(tmp_path: Path) -> None:
    segments = tmp_path / "shm"
    segments.mkdir()
    (segments / "psm_0badf00d").write_bytes(b"x")
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "fd").write_text("")  # unreadable as a directory: like another user's process
    with pytest.raises(shm.IncompleteView, match="cannot be read"):
        shm.sweep(segments, proc=proc, complete_view=True)
    assert (segments / "psm_0badf00d").exists()
    assert [s.name for s in shm.sweep(segments, proc=proc, complete_view=False)] == ["psm_0badf00d"]
