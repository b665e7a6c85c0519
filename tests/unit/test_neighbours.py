"""The one definition of stale (sparkd.preflight.neighbours), from scripted process tables: orphaned, our previous
launch, or a neighbour, with the cases the field meets (a reused PID, a zombie, another PID namespace, a
container's init as the parent, another sparkd's launch, another user's process)."""

from __future__ import annotations

import pytest

from sparkd.preflight import holders, processes
from sparkd.preflight import neighbours as nb
from sparkd.preflight.neighbours import Launch, Place, Proc, Scope, Stale

HOST_NS = 4026531836
BOX_NS = 4026532999  # a container's PID namespace

INIT = Proc(1, 0, ("/sbin/init",), pid_ns=HOST_NS)
SYSTEMD_USER = Proc(900, 1, ("/lib/systemd/systemd", "--user"), uid=0, pid_ns=HOST_NS)
SHELL = Proc(50, 1, ("-bash",), uid=0, pid_ns=HOST_NS)
SPARKD_B = Proc(60, 1, ("/usr/bin/python3", "/usr/bin/sparkd", "run", "--config", "b.toml"), 5.0, 0, pid_ns=HOST_NS)
SHIM = Proc(70, 1, ("/usr/bin/containerd-shim-runc-v2", "-namespace", "moby"), uid=0, pid_ns=HOST_NS)


def p(pid: int, ppid: int, *argv: str, start: float = 100.0, uid: int | None = 0, ns: int | None = HOST_NS,
      zombie: bool = False, ns_init: bool = False, marker: str | None = None, sid: int | None = None) -> Proc:
    return Proc(pid, ppid, argv, start, uid, zombie, ns, ns_init, marker, sid)


# Processes under each scenario's root; every table also has init, a shell, systemd --user, a shim, sparkd B.
BASE = {x.pid: x for x in (INIT, SYSTEMD_USER, SHELL, SPARKD_B, SHIM)}
HOST = (Place(HOST_NS, 0),)
BOX = (Place(BOX_NS),)
SCOPE = Scope(prefix="VLLM::", places=HOST, never_touch=frozenset({1, 4242}))

CASES: list[tuple[str, list[Proc], int, Scope, Stale | None, str]] = [
    ("engine re-parented to init after its API server was SIGKILLed",
     [p(10, 1, "VLLM::EngineCore")], 10, SCOPE, Stale.orphaned, "orphaned"),
    ("worker under an orphaned engine",
     [p(10, 1, "VLLM::EngineCore"), p(11, 10, "VLLM::Worker_TP0")], 11, SCOPE, Stale.orphaned, "parent is PID 1"),
    ("worker under its live API server (vllm serve)",
     [p(20, 50, "/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"), p(21, 20, "VLLM::EngineCore"),
      p(22, 21, "VLLM::Worker_TP0")], 22, SCOPE, None, "its launcher PID 20"),
    ("engine of a Python program using vLLM's LLM class",
     [p(20, 50, "python3", "train.py"), p(21, 20, "VLLM::EngineCore")], 21, SCOPE, None, "launcher PID 20"),
    ("API server daemonised to init: its engine is a neighbour",
     [p(20, 1, "vllm", "serve", "m"), p(21, 20, "VLLM::EngineCore")], 21, SCOPE, None, "launcher PID 20"),
    ("several API servers: titled, alive",
     [p(20, 50, "vllm", "serve"), p(23, 20, "VLLM::APIServer_0"), p(24, 23, "VLLM::EngineCore")], 24, SCOPE, None,
     "API server PID 23"),
    ("orphan adopted by systemd --user (a subreaper)",
     [p(12, 900, "VLLM::Worker_TP1")], 12, SCOPE, Stale.orphaned, "systemd --user"),
    ("orphan in this launch's container, adopted by its init (sleep infinity)",
     [p(30, 70, "sleep", "infinity", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", ns=BOX_NS)],
     31, Scope(prefix="VLLM::", places=BOX), Stale.orphaned, "sleep infinity"),
    ("orphan in a docker-exec container kept alive by `tail -f /dev/null`",
     [p(30, 70, "tail", "-f", "/dev/null", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", ns=BOX_NS)],
     31, Scope(prefix="VLLM::", places=BOX), Stale.orphaned, "tail -f"),
    ("container whose init is vLLM's API server: alive",
     [p(30, 70, "vllm", "serve", "m", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", ns=BOX_NS)],
     31, Scope(prefix="VLLM::", places=BOX), None, "launcher PID 30"),
    ("container whose init is an unknown program (it may be the launcher)",
     [p(30, 70, "python3", "app.py", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", ns=BOX_NS)],
     31, Scope(prefix="VLLM::", places=BOX), None, "launcher PID 30"),
    ("orphan in another PID namespace (someone's container)",
     [p(30, 70, "tini", "--", "x", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", ns=BOX_NS)],
     31, SCOPE, None, "another PID namespace"),
    ("PID namespace unreadable: not proven to be the launch's",
     [p(13, 1, "VLLM::EngineCore", ns=None)], 13, SCOPE, None, "another PID namespace"),
    ("orphan of another user",
     [p(14, 1, "VLLM::Worker_TP0", uid=65534)], 14, SCOPE, None, "uid 65534"),
    ("a zombie",
     [p(15, 1, "VLLM::EngineCore", zombie=True)], 15, SCOPE, None, "zombie"),
    ("another prefix (a demo's, or another launch's own)",
     [p(16, 1, "SPARKDEMO::EngineCore")], 16, SCOPE, None, "not a VLLM::*"),
    ("a command line that only mentions the title",
     [p(17, 1, "python", "-c", "VLLM::Worker")], 17, SCOPE, None, "not a VLLM::*"),
    ("the watched instance",
     [p(4242, 1, "VLLM::EngineCore")], 4242, SCOPE, None, "watched instance"),
    ("init itself, whatever its title",
     [], 1, SCOPE, None, "init"),
    ("parent not visible (a view of /proc, or a PID namespace's edge)",
     [p(18, 777, "VLLM::EngineCore")], 18, SCOPE, None, "cannot be seen"),
    ("gone",
     [], 19, SCOPE, None, "gone"),
    ("our previous launch, proven by its record (root untitled)",
     [p(40, 1, "vllm", "serve", start=7.0), p(41, 40, "VLLM::EngineCore")], 41,
     Scope(prefix="VLLM::", places=HOST, ours=Launch(40, 7.0)), Stale.previous_launch, "previous launch"),
    ("our previous launch's root itself",
     [p(40, 1, "vllm", "serve", start=7.0)], 40,
     Scope(prefix="VLLM::", places=HOST, ours=Launch(40, 7.0)), Stale.previous_launch, "previous launch"),
    ("a reused PID: the record's PID now belongs to a live neighbour's API server",
     [p(40, 50, "vllm", "serve", start=900.0), p(41, 40, "VLLM::EngineCore")], 41,
     Scope(prefix="VLLM::", places=HOST, ours=Launch(40, 7.0)), None, "launcher PID 40"),
    ("another live sparkd's launch, even orphaned-looking (its API server re-parented to init)",
     [p(20, 1, "VLLM::EngineCore", start=3.0), p(21, 20, "VLLM::Worker_TP0")], 21,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(20, 3.0, "sparkd instance b.toml"),)), None,
     "sparkd instance b.toml"),
    ("another sparkd's registration whose PID was reused protects nothing",
     [p(20, 1, "VLLM::EngineCore", start=3.0)], 20,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(20, 99.0, "sparkd instance b.toml"),)),
     Stale.orphaned, "orphaned"),
    ("a live launch of another sparkd (its daemon the parent)",
     [p(25, 60, "bash", "/var/lib/b/run/launch.sh"), p(26, 25, "vllm", "serve"), p(27, 26, "VLLM::EngineCore")],
     27, SCOPE, None, "launcher PID 26"),
    ("another live sparkd's orphan (its root gone): its launch marker names the owner",
     [p(28, 1, "VLLM::Worker_TP0", marker="m-b")], 28,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(25, 3.0, "sparkd instance b.toml", "m-b"),)), None,
     "sparkd instance b.toml"),
    ("another live sparkd's orphan whose title overwrote its environment (no marker): its session tells",
     [p(28, 1, "VLLM::EngineCore", sid=25)], 28,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(25, 3.0, "sparkd instance b.toml", "m-b"),)), None,
     "sparkd instance b.toml"),
    ("an orphan of another session than the registered launch's is not that launch's",
     [p(28, 1, "VLLM::EngineCore", sid=26)], 28,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(25, 3.0, "sparkd instance b.toml", "m-b"),)),
     Stale.orphaned, "orphaned"),
    ("our own previous launch's session proves nothing more than the orphan rule does",
     [p(28, 1, "python3", "helper.py", sid=40)], 28, Scope(prefix="VLLM::", places=HOST, ours=Launch(40, 7.0)),
     None, "not a VLLM::* process"),
    ("a marker of a registration that is not live is no protection (not in the scope's others)",
     [p(28, 1, "VLLM::Worker_TP0", marker="m-gone")], 28,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(25, 3.0, "sparkd instance b.toml", "m-b"),)),
     Stale.orphaned, "orphaned"),
    ("a user's registration speaks for that user's orphan (a user's launch, a user's sparkd)",
     [p(28, 1, "VLLM::Worker_TP0", uid=1000, marker="m-u")], 28,
     Scope(prefix="VLLM::", places=(Place(HOST_NS, 1000),),
           others=(Launch(25, 3.0, "sparkd instance u.toml", "m-u", uid=1000),)), None, "sparkd instance u.toml"),
    ("a user's registration never speaks for root's orphan, even naming its marker or its root",
     [p(28, 1, "VLLM::Worker_TP0", start=3.0, marker="m-root")], 28,
     Scope(prefix="VLLM::", places=HOST, others=(Launch(28, 3.0, "sparkd instance u.toml", "m-root", uid=1000),)),
     Stale.orphaned, "orphaned"),
    ("the launch's host and container places: an orphan in the container, any uid there",
     [p(30, 70, "sleep", "infinity", ns=BOX_NS, ns_init=True), p(31, 30, "VLLM::EngineCore", uid=1000, ns=BOX_NS)],
     31, Scope(prefix="VLLM::", places=(*HOST, *BOX)), Stale.orphaned, "sleep infinity"),
    ("the launch's host place, another uid: named by uid",
     [p(32, 1, "VLLM::EngineCore", uid=1000)], 32, Scope(prefix="VLLM::", places=(*HOST, *BOX)), None,
     "uid 1000, not the launch's uid 0"),
    ("parent chain that loops",
     [p(80, 81, "VLLM::EngineCore"), p(81, 80, "VLLM::Worker_TP0")], 80, SCOPE, None, "loops"),
]


@pytest.mark.parametrize(("case", "procs", "pid", "scope", "stale", "why"), CASES, ids=[c[0] for c in CASES])
def test_judge(case: str, procs: list[Proc], pid: int, scope: Scope, stale: Stale | None, why: str) -> None:
    table = {**BASE, **{x.pid: x for x in procs}}
    judgement = nb.judge(pid, table, scope)
    assert judgement.stale is stale, (case, judgement)
    assert why in judgement.why, (case, judgement.why)


def test_another_instances_launch_names_its_owner() -> None:
    table = {**BASE, 20: p(20, 1, "VLLM::EngineCore", start=3.0)}
    judgement = nb.judge(20, table, Scope(others=(Launch(20, 3.0, "sparkd instance /etc/sparkd/b.toml"),)))
    assert judgement.neighbour and judgement.owner == "sparkd instance /etc/sparkd/b.toml"


def test_no_restriction_when_the_scope_cannot_tell() -> None:
    """A container launch whose user sparkd cannot resolve: uid unrestricted (the namespace still bounds it)."""
    table = {**BASE, 14: p(14, 1, "VLLM::Worker_TP0", uid=1000, ns=None)}
    assert nb.judge(14, table, Scope()).stale is Stale.orphaned


def test_select_lists_the_stale_with_their_reason() -> None:
    table = {**BASE, **{x.pid: x for x in (
        p(10, 1, "VLLM::EngineCore"), p(11, 10, "VLLM::Worker_TP0"), p(12, 50, "VLLM::Worker_TP1"),
        p(13, 1, "python", "-c", "VLLM::Worker"), p(20, 1, "vllm", "serve", start=7.0), p(21, 20, "VLLM::EngineCore"),
        p(22, 1, "SPARK::Worker_TP0"))}}
    scope = Scope(places=HOST, ours=Launch(20, 7.0), never_touch=frozenset({11}))
    found = processes.select(table, [10, 11, 12, 13, 20, 21, 22], scope)
    assert [(c.pid, c.why) for c in found] == [(10, "orphaned"), (20, "previous launch"), (21, "previous launch")]
    spark = Scope(prefix="SPARK::", places=HOST)
    assert [c.pid for c in processes.select(table, [10, 22], spark)] == [22]


def test_reverting_to_any_title_would_end_live_neighbours() -> None:
    """The regression this module exists for: of the table's titled processes, only the orphan is stale."""
    table = {**BASE, **{x.pid: x for x in (
        p(20, 50, "vllm", "serve"), p(21, 20, "VLLM::EngineCore"), p(22, 21, "VLLM::Worker_TP0"),
        p(10, 1, "VLLM::EngineCore"))}}
    titled = [pid for pid, x in table.items() if nb.is_titled(x.argv)]
    assert sorted(titled) == [10, 21, 22]
    assert [j.pid for j in nb.stale(titled, table, SCOPE)] == [10]


CID = "3f" * 32


@pytest.mark.parametrize(("cgroup", "expected"), [
    (f"4:memory:/docker/{CID}\n0::/\n", CID),  # cgroup v1
    (f"0::/system.slice/docker-{CID}.scope\n", CID),  # v2, systemd driver
    (f"0::/kubepods/burstable/pod1/cri-containerd-{CID}.scope\n", CID),
    (f"0::/docker/{CID}/init.scope\n", CID),  # a container running systemd
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("4:memory:/process_api/ef3aaccf235d2d64484ba1e15f195bb0\n", None),  # 32 hex digits: not a container id
    ("", None),
])
def test_the_container_a_process_runs_in(cgroup: str, expected: str | None) -> None:
    assert holders.container_id(cgroup) == expected


@pytest.mark.parametrize(("container", "owner", "text"), [
    (None, "", "PID 7 (vllm serve m)"),
    (CID, "", f"PID 7 (vllm serve m) in container {CID[:12]}"),
    (CID, "", "PID 7 (vllm serve m) in container vllm_b"),
    (None, "sparkd instance b (state /s/b)", "PID 7 (vllm serve m), of sparkd instance b (state /s/b)"),
])
def test_a_holder_is_named(container: str | None, owner: str, text: str) -> None:
    names = {CID: "vllm_b"} if text.endswith("vllm_b") else {}
    assert holders.describe(7, "vllm serve m", container, owner, names) == text
