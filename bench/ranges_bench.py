#!/usr/bin/env python3
"""``ampgraph ranges``' speed budget: OPT-125M's ranges in at most twice its plain CPU forward.

In one process, after the imports (which both pay alike), on the same fp32 weights and inputs:

* ``eager forward``: ``model(**inputs)`` under ``torch.no_grad()``, the plain CPU forward;
* ``graph run``: the captured graph run by the ranges interpreter with every reduction switched
  off (what running node by node costs);
* ``ranges run``: the same with every node's outputs reduced (:func:`ampgraph.ranges.collect.
  run_ranges`): the measurement the budget is on;
* ``value_ranges, 1 setting`` and ``4 settings``: the whole API call, capture and annotation of
  each setting and the weights included, for the record.

Each is the median of ``--runs`` runs (the whole calls: of one), in wall seconds and in this
process's CPU seconds (``time.process_time``: what another process's load on the machine does
not inflate; the budget is judged on both and printed PASS or FAIL). ``--seq-len`` sets the
token count (8, the other commands' default, and 128 are worth a look), ``--threads`` torch's
threads.

    python bench/ranges_bench.py
    python bench/ranges_bench.py --seq-len 128 --runs 7 --json bench/results/ranges.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUDGET = 2.0  # ranges run / eager forward


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``runs`` calls (after one warm-up call)."""
    fn()
    walls, cpus = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch's intra-op threads (default: torch's own). 1 is the figure least moved by "
        "other load: on a shared 2-core machine, two threads spin at every op's barrier.",
    )  # fmt: skip
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    import ampgraph.ranges.collect as collect
    from ampgraph.capture.casts import cast_floating
    from ampgraph.capture.trace import capture
    from ampgraph.pipeline.run import prepare
    from ampgraph.pipeline.stages import analyze_capture
    from ampgraph.ranges import value_ranges
    from ampgraph.ranges.weights import build_real, seed_weights
    from ampgraph.settings import Setting
    from ampgraph.verify.tensors import graph_inputs, real_inputs

    built = prepare(args.model, seq_len=args.seq_len)
    reference = Setting.parse("fp32,inputs=fp32")
    cap = capture(built, reference)
    report = analyze_capture(cap, check=False)
    real = build_real(built.module).eval()
    seed_weights(real, 0)
    state = dict(real.named_parameters(remove_duplicate=False))
    state.update(real.named_buffers(remove_duplicate=False))
    cpu, gen = torch.device("cpu"), torch.Generator().manual_seed(0)
    fargs, fkwargs = cast_floating(real_inputs(built, cpu, gen), "float32")
    values = graph_inputs(cap, built, fargs, fkwargs, cpu, gen, known=state)
    modules = {r.name: r.module for r in report.nodes}
    kinds = {r.name: r.kind for r in report.nodes}

    def eager() -> None:
        with torch.no_grad():
            real(*fargs, **fkwargs)

    def ranges_run() -> None:
        collect.run_ranges(cap, values, modules, kinds)

    reduce = collect.reduce_tensor

    def graph_run() -> None:
        collect.reduce_tensor = lambda t: None  # type: ignore[assignment,return-value]
        try:
            collect.run_ranges(cap, values, modules, kinds)
        finally:
            collect.reduce_tensor = reduce

    rows: dict[str, tuple[float, float]] = {}
    # In turns, so that a change in the machine's load falls on all three alike.
    runs = (("eager forward", eager), ("graph run", graph_run), ("ranges run", ranges_run))
    for name, fn in runs:
        rows[name] = timed(fn, args.runs)
    calls = (
        ("value_ranges, 1 setting", ["amp-fp32"]),
        ("value_ranges, 4 settings", ["fp32", "half", "amp-fp32", "amp-half"]),
    )
    for name, settings in calls:
        w, c = time.perf_counter(), time.process_time()
        value_ranges(built, settings)
        rows[name] = (time.perf_counter() - w, time.process_time() - c)

    base_wall, base_cpu = rows["eager forward"]
    threads = torch.get_num_threads()
    print(f"{args.model}, seq_len {args.seq_len}, torch {torch.__version__}, {threads} threads, "
          f"{platform.machine()}, median of {args.runs}")  # fmt: skip
    print(f"{'case':<26}{'wall':>10}{'CPU':>10}{'x forward (wall)':>18}{'x forward (CPU)':>17}")
    for name, (wall, cpu_s) in rows.items():
        print(f"{name:<26}{wall:>9.3f}s{cpu_s:>9.3f}s{wall / base_wall:>17.2f}x"
              f"{cpu_s / base_cpu:>16.2f}x")  # fmt: skip
    wall_ratio = rows["ranges run"][0] / base_wall
    cpu_ratio = rows["ranges run"][1] / base_cpu
    verdict = "PASS" if min(wall_ratio, cpu_ratio) <= BUDGET else "FAIL"
    print(f"budget: ranges run <= {BUDGET}x the eager forward: {wall_ratio:.2f}x wall, "
          f"{cpu_ratio:.2f}x CPU: {verdict}")  # fmt: skip
    if args.json:
        record = {
            "model": args.model, "seq_len": args.seq_len, "runs": args.runs,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cases": {k: {"wall_s": round(v[0], 4), "cpu_s": round(v[1], 4)}
                      for k, v in rows.items()},
            "ratio_wall": round(wall_ratio, 3), "ratio_cpu": round(cpu_ratio, 3),
            "verdict": verdict,
        }  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
