"""A process holding GPU memory: ``holder.py TITLE GIB READYFILE [--device N] [--orphan]``.

TITLE ``-`` keeps the plain command line (a foreign process); else the process title (``VLLM::Worker_TP0``: a
stale vLLM worker). ``--orphan``: fork twice so the holder's parent is PID 1, as a worker left behind by a dead
vLLM is. READYFILE gets the holder's PID once the memory is allocated and touched.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("title")
    p.add_argument("gib", type=float)
    p.add_argument("ready")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--orphan", action="store_true")
    args = p.parse_args(argv)
    if args.orphan:
        if os.fork():
            os._exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
    if args.title != "-":
        import setproctitle

        setproctitle.setproctitle(args.title)
    import torch

    x = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device=f"cuda:{args.device}")
    x.fill_(1)
    torch.cuda.synchronize()
    with open(args.ready + ".tmp", "w") as handle:
        handle.write(f"{os.getpid()}\n")
    os.replace(args.ready + ".tmp", args.ready)
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
