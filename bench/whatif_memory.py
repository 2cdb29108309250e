"""Resident memory over repeated what-ifs in one process (issue 46: memory must not grow).

Each what-if moves an op to another autocast list (new policy tables every time) and analyses a
small model with and without the move, as ``ampgraph diff --move`` does. Prints the RSS after a
warm-up and every ``--every`` what-ifs, and the growth per what-if after the warm-up.

    PYTHONPATH=src python bench/whatif_memory.py --count 300
"""

from __future__ import annotations

import argparse
import gc
import resource
import time


def rss_mib() -> float:
    """The process's resident set now, in MiB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--warm-up", type=int, default=20)
    args = parser.parse_args()

    import torch

    from ampgraph.model.build import ModelInputs
    from ampgraph.review.whatif import preview_moves

    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    model = ModelInputs("net", net, (torch.randn(2, 16),), {})
    moves = ["linear=fp32", "layer_norm=lower_precision_fp", "linear=promote"]
    start = time.perf_counter()
    base = 0.0
    for i in range(args.count + args.warm_up):
        preview_moves(model, "autocast=on,device=cpu", [moves[i % len(moves)]], check=False)
        done = i + 1 - args.warm_up
        if done == 0:
            gc.collect()
            base = rss_mib()
            print(f"after {args.warm_up} warm-up what-ifs: RSS {base:.1f} MiB")
        elif done > 0 and done % args.every == 0:
            gc.collect()
            now = rss_mib()
            print(f"after {done} more what-ifs: RSS {now:.1f} MiB "
                  f"({(now - base) * 1024 / done:+.1f} KiB per what-if)")
    print(f"{args.count + args.warm_up} what-ifs in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
