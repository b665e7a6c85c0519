"""Benchmark: what weights parity adds to a start's preflight, on a model directory of 46 × 1 GiB sparse shards.

    .venv/bin/python tests/bench/bench_weights.py [--shards 46] [--shard-gib 1] [--trials 5] [--budget 20]
                                                  [--json bench-weights.json]

The directory holds ``--shards`` sparse shards (``truncate``: nothing on disk, every read a page of zeros, so the
figure is sparkd's hashing and not the disk), a ``model.safetensors.index.json`` listing them, ``config.json``
and ``tokenizer.json``. Each figure is the wall time of what a head's start runs, in this process, ``--trials``
times (median):

- **preflight without the manifest**: the ``launch_target`` check on the directory (config.json and every shard
  the index lists are there) — what a start cost before weights parity;
- **the same with the manifest, unchanged directory**: that check plus the manifest as a start builds it with
  the hash cache warm (a ``stat`` per file, the always-hashed small files read): a restart of an unchanged group;
- **first start, no manifest yet**: the manifest with an empty cache and the default budget (``--budget``): it
  hashes shards until the budget and defers the rest (the row says how many), once;
- **the background finishing**: what the first start deferred, hashed unbounded (its GiB/s is sparkd's hashing
  rate at the idle I/O class), once — after it, the manifest is complete and the restarts above are timed.

What a restart of an unchanged group pays for parity is the difference of the first two rows (target: under
100 ms; it does not grow with the size of the shards, only with their number).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from sparkd.config import config_from_mapping  # noqa: E402
from sparkd.launch.render import render  # noqa: E402
from sparkd.preflight.base import PreflightContext  # noqa: E402
from sparkd.preflight.launch_target import check_launch_target  # noqa: E402
from sparkd.preflight.weights_local import LocalWeights  # noqa: E402
from sparkd.runtime.process import ProcessRuntime  # noqa: E402

GIB = 1 << 30


class Quiet:
    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: None


def make_model(root: Path, shards: int, size: int) -> None:
    root.mkdir(parents=True)
    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    for name in names:
        with (root / name).open("wb") as f:
            f.truncate(size)
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shards * size}, "weight_map": {f"layers.{k}": n for k, n in enumerate(names)}}))
    (root / "config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"]}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}))


def timed(fn: Any) -> float:
    started = time.perf_counter()
    anyio.run(fn)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=46)
    parser.add_argument("--shard-gib", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--budget", type=float, default=20.0, help="[weights] hash_budget_s of the first start")
    parser.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "sparkd-bench-weights.json")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sparkd-bench-weights-"))
    try:
        root = folder / "model"
        make_model(root, args.shards, int(args.shard_gib * GIB))
        cfg = config_from_mapping({"runtime": "process", "launch": {"model": str(root), "executable": "/bin/true"},
                                   "paths": {"state_dir": str(folder / "state")},
                                   "weights": {"hash_budget_s": args.budget}}, env={})
        ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(folder / "run"))
        keeper = LocalWeights(lambda: cfg, log=Quiet())

        async def check() -> None:
            result = await check_launch_target(ctx)
            assert result.verdict.value == "ok", result.found

        first: dict[str, Any] = {}

        async def cold() -> None:
            m = await keeper.manifest()
            first.update(hashed=len(m.hashed), pending=len(m.pending), low_priority=m.low_priority)

        first_s = timed(cold)
        rest_s = timed(lambda: keeper.manifest(bounded=False))
        without = [timed(check) for _ in range(args.trials)]

        async def warm() -> None:
            await check()
            m = await keeper.manifest()
            assert len(m.hashed) == 3 and not m.pending, (m.hashed, m.pending)

        with_manifest = [timed(warm) for _ in range(args.trials)]
        base, warm_s = statistics.median(without), statistics.median(with_manifest)
        result = {
            "shards": args.shards, "shard_gib": args.shard_gib, "trials": args.trials, "budget_s": args.budget,
            "preflight_without_manifest_s": without, "preflight_with_manifest_s": with_manifest,
            "median_without_s": round(base, 4), "median_with_s": round(warm_s, 4),
            "ratio": round(warm_s / base, 2) if base else None, "first_start_s": round(first_s, 2),
            "first_start": first, "background_s": round(rest_s, 2),
            "load": os.getloadavg(),
        }
        args.json.write_text(json.dumps(result, indent=2))
        print(f"| figure ({args.shards} × {args.shard_gib:g} GiB sparse) | sparkd | note |\n|---|---|---|")
        print(f"| preflight without the manifest (launch_target) | {base * 1000:.1f} ms | median of {args.trials} |")
        print(f"| the same with the manifest, unchanged directory | {warm_s * 1000:.1f} ms | ratio "
              f"{result['ratio']}, +{(warm_s - base) * 1000:.1f} ms |")
        print(f"| first start, no manifest yet (budget {args.budget:g} s) | {first_s:.1f} s | "
              f"{first['hashed']} files hashed, {first['pending']} deferred to the background |")
        rest_gib = first["pending"] * args.shard_gib
        print(f"| the background finishing ({first['pending']} shards) | {rest_s:.1f} s | "
              f"{rest_gib / rest_s if rest_s else 0:.2f} GiB/s at the idle I/O class |")
        print(f"load average {result['load'][0]:.2f}; JSON: {args.json}", file=sys.stderr)
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
