"""Whether a group of ranks can form: every problem a sentence naming the nodes and their ranks."""

from __future__ import annotations

import pytest

from sparkd.cluster.ranks import Member, group_problems


def member(node: str, rank: int, *, nnodes: int = 4, tp: int = 4, pp: int = 1, head: bool = False) -> Member:
    return Member(node=node, where=f"10.0.0.{rank + 1}", rank=rank, nnodes=nnodes, tensor_parallel_size=tp,
                  pipeline_parallel_size=pp, gpus_per_node=1, head=head)


def group(*ranks: int, **kw: object) -> list[Member]:
    return [member(f"spark{i}", r, head=i == 0, **kw) for i, r in enumerate(ranks)]  # type: ignore[arg-type]


CASES = [
    ("TP=4 over four nodes", group(0, 1, 2, 3), []),
    ("TP=2 × PP=2 over four nodes", group(0, 1, 2, 3, tp=2, pp=2), []),
    ("two nodes claim rank 2", group(0, 1, 2, 2), ["rank 2 is claimed 2 times: spark2 (10.0.0.3) rank 2, "
                                                 "spark3 (10.0.0.3) rank 2", "must be 0…3"]),
    ("a rank past the end", group(0, 1, 2, 5), ["must be 0…3", "spark3 (10.0.0.6) rank 5"]),
    ("nnodes says 2 on a group of 4", group(0, 1, 2, 3, nnodes=2), ["nnodes is 2 on spark0", "the group has 4 nodes"]),
    ("TP=2 alone over four nodes", group(0, 1, 2, 3, tp=2),
     ["tensor_parallel_size 2 × pipeline_parallel_size 1 = 2 GPUs, but the 4 nodes have 4"]),
    ("the head is not rank 0", [member("spark0", 1, head=True), member("spark1", 0), member("spark2", 2),
                                member("spark3", 3)], ["the head must be rank 0: spark0"]),
]


@pytest.mark.parametrize(("name", "members", "expected"), CASES, ids=[c[0] for c in CASES])
def test_group_problems(name: str, members: list[Member], expected: list[str]) -> None:
    problems = group_problems(members)
    text = "; ".join(problems)
    if not expected:
        assert problems == []
    for part in expected:
        assert part in text, text


def test_different_sizes_on_two_nodes_are_named() -> None:
    members = [*group(0, 1, tp=2, nnodes=2)]
    members[1] = Member("spark1", "10.0.0.2", 1, 2, 1, 2, 1)
    text = "; ".join(group_problems(members))
    assert "spark0 (10.0.0.1) rank 0 tensor 2 × pipeline 1" in text
    assert "spark1 (10.0.0.2) rank 1 tensor 1 × pipeline 2" in text
