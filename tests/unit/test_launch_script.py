"""Reading a user's launch script (sparkd/launch/script.py): the serve line, its flags and the exports. Pure."""

from __future__ import annotations

from sparkd.launch.script import script_facts

SCRIPT = """#!/bin/bash
export VLLM_HOST_IP=192.168.1.11
export NCCL_SOCKET_IFNAME=bond0 GLOO_SOCKET_IFNAME=bond0
# vllm serve /old/model --node-rank 9
OMP_NUM_THREADS=8 exec vllm serve /models/DeepSeek-V4-Flash \\
  --gpu-memory-utilization 0.90 --max-num-seqs=4 \\
  --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE"}' \\
  --nnodes 2 --node-rank ${NODE_RANK} --master-addr 10.0.0.1 "$@"
"""


def test_the_serve_line_and_exports() -> None:
    facts = script_facts(SCRIPT, ["--headless"])
    assert facts.command[:3] == ("vllm", "serve", "/models/DeepSeek-V4-Flash")
    assert facts.command[-1] == "--headless"  # sparkd's appended arguments, where the script passes "$@"
    assert facts.literal_float("--gpu-memory-utilization") == 0.90
    assert facts.literal_int("--max-num-seqs") == 4
    assert facts.value("--compilation-config") == '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'
    assert facts.value("--node-rank") == "${NODE_RANK}" and facts.literal_int("--node-rank") is None
    assert facts.mentions("--headless")
    assert facts.exports == {"VLLM_HOST_IP": "192.168.1.11", "NCCL_SOCKET_IFNAME": "bond0",
                             "GLOO_SOCKET_IFNAME": "bond0", "OMP_NUM_THREADS": "8"}


def test_no_serve_line() -> None:
    facts = script_facts("echo hello\n# vllm serve m\n")
    assert facts.command == () and facts.value("--node-rank") is None and not facts.mentions("--headless")


def test_unbalanced_quotes_are_skipped() -> None:
    assert script_facts("vllm serve m --x 'oops\n").command == ()
