"""The failure classifier's cost on realistic tails: this tree's `classify()` against a peer revision's, in one run.

Each development excerpt (tests/data/vllm-logs/) ends a tail padded to N lines with a real vLLM 0.32 start (the
real-vLLM tier's excerpt) and serving lines (throughput logs, uvicorn's access log, a tqdm bar's frames); every tail
is classified once by each side, in its own process, and the table gives p50/p90/max per side and the ratio. N is the
classifier's scan limit (2000, what `sparkd explain` reads) and the daemon's tail (300, `LOG_TAIL_LINES`).

    .venv/bin/python tests/bench/bench_classify.py              # the peer is main
    .venv/bin/python tests/bench/bench_classify.py --peer 396d975 --lines 2000 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "vllm-logs"

_MEASURE = """
import json, sys, time
from sparkd.supervisor.classify import classify
tails = json.load(sys.stdin)
out = []
for tail in tails:
    t0 = time.perf_counter()
    classify(1, None, tail)
    out.append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
"""


def _body(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").partition("\n---\n")[2].rstrip("\n").split("\n")


def tails(lines: int) -> list[list[str]]:
    start = _body(CORPUS / "realvllm-032-ready-then-stopped.log")[:120]
    serve: list[str] = []
    for i in range(200):
        serve.append(f"(APIServer pid=20274) INFO 11-27 09:{i % 60:02d}:38 [loggers.py:123] Engine 000: Avg prompt "
                     "throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, Running: 2 reqs, Waiting: "
                     "0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%")
        serve += [f'(APIServer pid=20274) INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" '
                  "200 OK"] * 4
        serve.append("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.2s/it]\r"
                     "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.1s/it]")
    padding = (start + serve) * 3
    out = []
    for path in sorted(CORPUS.glob("*.log")):
        excerpt = _body(path)
        out.append((padding[:max(0, lines - len(excerpt))] + excerpt)[-lines:])
    return out


def measure(source: Path, cases: list[list[str]]) -> list[float]:
    """`classify()` of the tree at `source` (its own process, run there: the package that directory holds is imported,
    not the one installed), once per tail, in ms."""
    done = subprocess.run([sys.executable, "-c", _MEASURE], input=json.dumps(cases), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(source)}, cwd=source, check=True, timeout=1800)
    return sorted(json.loads(done.stdout))


def peer_tree(rev: str, into: Path) -> Path:
    archive = into / "peer.tar"
    subprocess.run(["git", "archive", "-o", str(archive), rev, "sparkd"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def _row(name: str, ms: list[float]) -> str:
    return (f"| {name} | {statistics.median(ms):.0f} | {ms[int(0.9 * len(ms))]:.0f} | {ms[-1]:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default="main", help="the revision whose classifier is the peer (default: main)")
    parser.add_argument("--lines", type=int, nargs="+", default=[2000, 300], help="tail lengths")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkd-bench-classify-") as tmp:
        peer = peer_tree(args.peer, Path(tmp))
        print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}")
        for lines in args.lines:
            cases = tails(lines)
            ours, theirs = measure(ROOT, cases), measure(peer, cases)
            print(f"\n{len(cases)} tails of {lines} lines, ms\n\n| side | p50 | p90 | max |\n|---|---:|---:|---:|")
            print(_row("this tree", ours))
            print(_row(f"peer ({args.peer})", theirs))
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"\nratio of the medians (this tree / peer): {ratio:.2f}")


if __name__ == "__main__":
    main()
