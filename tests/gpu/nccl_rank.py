"""One torch NCCL rank titled like vLLM's workers (``VLLM::Worker_TP<rank>``), all-reducing in a loop.

    nccl_rank.py RANK WORLD PORT [--timeout S] [--handler vllm|default] [--hold-gib G] [--progress FILE] [--step-s S]

Rank r runs on GPU r (of those CUDA_VISIBLE_DEVICES shows), holds G GiB besides NCCL's buffers, and prints an
``iter`` line every 2 s. Each all-reduce is a step: with SPARKD_PROBE_DIR set and the step probe importable (sparkd's
launch puts its plugin directory on PYTHONPATH), the rank keeps the probe's file with the plugin's own writer, a
step begun before the all-reduce and ended once the GPU finished it, as vLLM's ranks do (``worker-<rank>.step``).
``--timeout``: the process group's timeout (0: torch's default, 10 min). ``--handler vllm``:
SIGTERM raises SystemExit, as vLLM's workers do (it runs only when the main thread is back in Python: a rank
stuck in a collective never runs it). ``--progress``: rank 0 touches FILE after every all-reduce (the fake API
server answers its canary only while it moves). ``--step-s``: each step also spends S seconds on the CPU before its
all-reduce, as a model step does (the daemon phase's 10 ms: a SIGSTOP then lands inside a step, not between two).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("rank", type=int)
    p.add_argument("world", type=int)
    p.add_argument("port")
    p.add_argument("--timeout", type=float, default=0.0)
    p.add_argument("--handler", choices=("vllm", "default"), default="vllm")
    p.add_argument("--hold-gib", type=float, default=8.0)
    p.add_argument("--progress", default=None)
    p.add_argument("--step-s", type=float, default=0.0)
    return p.parse_args(argv)


def step_writer(rank: int, world: int) -> object | None:
    """The step probe's writer for this rank, when the launch asks for it and the plugin is there."""
    folder = os.environ.get("SPARKD_PROBE_DIR")
    if not folder:
        return None
    try:
        from sparkd_vllm_probe import layout
        from sparkd_vllm_probe.writer import StepWriter
    except ImportError:
        print(f"rank{rank}: SPARKD_PROBE_DIR is set but sparkd_vllm_probe is not importable", flush=True)
        return None
    return StepWriter(folder, layout.WORKER, rank, local_rank=rank, world_size=world,
                      title=f"VLLM::Worker_TP{rank}")


def main(argv: list[str]) -> None:
    args = parse(argv)
    import setproctitle

    setproctitle.setproctitle(f"VLLM::Worker_TP{args.rank}")
    if args.handler == "vllm":
        def on_term(signum: int, frame: object) -> None:
            print(f"rank{args.rank}: SIGTERM handler ran (raising SystemExit)", file=sys.stderr, flush=True)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = args.port
    torch.cuda.set_device(args.rank)
    kw = {"timeout": datetime.timedelta(seconds=args.timeout)} if args.timeout > 0 else {}
    t0 = time.time()
    dist.init_process_group("nccl", rank=args.rank, world_size=args.world, device_id=torch.device("cuda", args.rank),
                            **kw)
    hold = torch.ones(int(args.hold_gib * 2**30), dtype=torch.uint8, device="cuda")
    x = torch.ones(16 * 2**20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank{args.rank} pid {os.getpid()}: init+first all_reduce in {time.time() - t0:.1f}s; pg timeout "
          f"{args.timeout if kw else 'default'}; holding {hold.numel() / 2**30:.1f} GiB", flush=True)
    steps = step_writer(args.rank, args.world)
    i, last = 0, time.time()
    while True:
        if steps is not None:
            steps.begin(1)  # type: ignore[attr-defined]
        if args.step_s:
            time.sleep(args.step_s)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        torch.cuda.synchronize()
        if steps is not None:
            steps.end()  # type: ignore[attr-defined]
        i += 1
        if args.progress and args.rank == 0:
            os.utime(args.progress) if os.path.exists(args.progress) else open(args.progress, "w").close()
        if time.time() - last > 2:
            print(f"rank{args.rank} iter {i} at {time.time():.3f}", flush=True)
            last = time.time()


if __name__ == "__main__":
    main(sys.argv[1:])
