#!/usr/bin/env python
"""Fake kernels against the real CPU kernels on mixed dtypes, over torch's OpInfo database.

For every op of ``op_db`` with two or more floating tensor arguments in a sample (and a few
backward kernels ``op_db`` does not list, :func:`_backward_ops`), each of a few
samples is made again in mixed dtypes (one floating argument bf16 or fp16 and the others fp32, one
fp32 and the others 16-bit, all bf16, all fp16) and run three ways:

* the real CPU kernel (the oracle),
* on fake CPU tensors as the fake kernels alone type it (*raw*),
* on fake CPU tensors as ampgraph replays it: :class:`~ampgraph.annotate.strict.StrictDtypeMode`
  and :class:`~ampgraph.annotate.kernel_dtypes.RealCpuDtypes` above the fake mode,

and on fake CUDA tensors under ``StrictDtypeMode("cuda")`` (no real CUDA kernel to compare with:
recorded for the page). Each variant is *agrees* (both raise, or neither and the same output
dtypes), *lenient* (the real kernel raises, the fake one does not: a check it lacks), *strict* (the
fake kernel raises, the real one does not) or *dtype* (both run, output dtypes part).

A sample whose fp32 call already parts (a value the fake kernel cannot know, a data-dependent
shape) is skipped, as are variants with a dtype the op's OpInfo does not list for the CPU.

    .venv/bin/python scripts/fake_kernel_survey.py                      # -> docs/fake-kernels.md
    .venv/bin/python scripts/fake_kernel_survey.py -o addmm -o lerp --out /tmp/fk.md
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its cases and page beside this file
from fake_kernel_page import render  # noqa: E402
from fake_kernel_variants import (  # noqa: E402
    AGREES,
    OpRow,
    Outcome,
    Variant,
    _backward_ops,
    _describe_call,
    _floating,
    _run,
    _skip_reason,
    _time_limit,
    _variants,
    ampgraph_pass,
    load_op_db,
    survey_op,
)

ROOT = Path(__file__).resolve().parent.parent


def survey(only: list[str] | None = None, limit_s: float = 420.0) -> tuple[list[OpRow], float]:
    """Every op of ``op_db`` (or those named), the first pass within ``limit_s`` seconds; one
    thread (oneDNN's pick of a CPU convolution counts them: the page's figures are for one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # A fake kernel that raises is a finding; fake_tensor's own traceback of it is noise.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _survey(only, limit_s)
    finally:
        torch.set_num_threads(threads)
        fake_log.setLevel(level)


def _survey(only: list[str] | None, limit_s: float) -> tuple[list[OpRow], float]:
    ops = [
        o for o in [*load_op_db(), *_backward_ops()]
        if not only or o.name in only or f"{o.name}.{o.variant_test_name}" in only
    ]  # fmt: skip
    start, rows = time.perf_counter(), []
    for i, opinfo in enumerate(ops):
        if time.perf_counter() - start > limit_s:
            print(f"time limit reached after {i} of {len(ops)} ops", file=sys.stderr)
            break
        row = survey_op(opinfo)
        rows.append(row)
        if row.variants:
            print(f"[{i + 1}/{len(ops)}] {row.name}: {len(row.variants)} variants, "
                  f"raw {row.kinds('raw') or 'agrees'}", file=sys.stderr)  # fmt: skip
    print("ampgraph's pass", file=sys.stderr)
    ampgraph_pass(rows)
    for row in rows:
        if row.kinds("ampgraph"):
            print(f"  {row.name}: ampgraph {row.kinds('ampgraph')}", file=sys.stderr)
    return rows, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run the survey and write the page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--op", action="append", help="only this OpInfo name (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "fake-kernels.md")
    parser.add_argument("--limit", type=float, default=420.0, help="seconds for the whole run")
    ns = parser.parse_args(argv)
    rows, wall = survey(ns.op, ns.limit)
    ns.out.write_text(render(rows, wall))
    print(f"wrote {ns.out} ({wall:.0f} s)", file=sys.stderr)
    return 0


#: Also what ``scripts/gpu_survey.py`` reuses of the survey (``import fake_kernel_survey as fks``).
__all__ = [
    "AGREES",
    "OpRow",
    "Outcome",
    "Variant",
    "_describe_call",
    "_floating",
    "_run",
    "_skip_reason",
    "_time_limit",
    "_variants",
    "load_op_db",
    "main",
    "render",
    "survey",
]


if __name__ == "__main__":
    sys.exit(main())
