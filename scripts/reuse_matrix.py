#!/usr/bin/env python
"""Prove graph sharing on every bundled model: shared graphs annotate as fresh captures do.

For each bundled model, device type and autocast dtype, the seed's four settings are analysed
twice: by :func:`ampgraph.pipeline.stages.analyze_group`, which captures once per parameter dtype and
shares the graph wherever :mod:`ampgraph.capture.reads` proves it is the one a capture would give, and
by a fresh capture in every setting. Every node record and module call must be equal
(:func:`ampgraph.capture.reads.annotation_difference`). Writes docs/graph-reuse.md.

    .venv/bin/python scripts/reuse_matrix.py                      # all bundled models, cuda
    .venv/bin/python scripts/reuse_matrix.py -m gpt2 --device cpu --out /tmp/r.md

Exit status 1 if any shared graph annotates differently from a fresh capture.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import AMP_DTYPES, SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COST_HINT = {"llama-3-70b": 100, "phi-2": 12, "mistral-7b": 10, "llama-3-8b": 10, "qwen2-0.5b": 8}


@dataclass
class Row:
    name: str
    devices: tuple[str, ...] = ()
    captures: int = 0
    analyses: int = 0
    shared: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    failure: str | None = None
    seconds: float = 0.0


def run_model(job: tuple[str, tuple[str, ...]]) -> Row:
    from ampgraph.capture.reads import annotation_difference
    from ampgraph.model.build import load_model
    from ampgraph.pipeline.stages import analyze, analyze_group
    from ampgraph.settings import Setting, short_dtype

    name, devices = job
    start = time.perf_counter()
    row = Row(name, devices)
    try:
        model = vision_model(name) if name in vision_models() else load_model(name)
        for device in devices:
            for amp in AMP_DTYPES:
                settings = [Setting.parse(s, device_type=device, amp_dtype=amp) for s in SETTINGS]
                shared = analyze_group(model, settings, check=False)
                for setting, rep in zip(settings, shared):
                    row.analyses += 1
                    where = f"{device} {short_dtype(setting.amp_dtype)} {setting.name}"
                    graph_of = rep.capture.get("graph_of")
                    if graph_of:
                        row.shared.append(f"{where} ← {graph_of}")
                    else:
                        row.captures += 1
                        if rep.capture.get("not_shared"):
                            row.refused.append(f"{where}: {rep.capture['not_shared']}")
                    why = annotation_difference(rep, analyze(model, setting, check=False))
                    if why is not None:
                        row.differences.append(f"{where}: {why}")
    except Exception as exc:  # noqa: BLE001 - report it in the table, don't stop the matrix
        row.failure = f"{type(exc).__name__}: {exc}"
    row.seconds = time.perf_counter() - start
    return row


def vision_models() -> dict[str, Any]:
    """The torchvision and timm models of ``scripts/vision_matrix.py``, by name."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from vision_matrix import MODELS
    finally:
        sys.path.pop(0)
    return MODELS


def vision_model(name: str) -> Any:
    """A vision model as ``scripts/vision_matrix.py`` builds it, with its example inputs."""
    import torch

    from ampgraph.model.build import ModelInputs

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from vision_matrix import MODELS, build
    finally:
        sys.path.pop(0)
    module, shape = build(name)
    image = torch.randn(shape, device="meta")
    args = {
        "torchvision.optical_flow": (image, image.clone()),
        "torchvision.detection": ([image],),
    }.get(MODELS[name][0], (image,))
    return ModelInputs(name, module, args)


def markdown(rows: Sequence[Row], total: float, devices: Sequence[str]) -> str:
    import torch
    import transformers

    analyses = sum(r.analyses for r in rows)
    captures = sum(r.captures for r in rows)
    lines = [
        "# One capture for several settings, against a fresh capture in each",
        "",
        (
            "Every bundled model (and the torchvision and timm models of `scripts/vision_matrix.py` where named) in the seed's four settings (fp32, half, amp-half, amp-fp32) "
            f"with both autocast dtypes, device type {', '.join(devices)}: analysed once with "
            "shared graphs (`analyze_group`: one capture per parameter dtype, shared wherever "
            "every trace-time read of the setting agrees, see `ampgraph.capture.reads`) and once with a "
            "fresh capture in every setting. *equal* says whether every node record (op, module, "
            "policy, inputs, casts, outputs, promotion, reason, error) and every module call of "
            "the two are the same. *shared* lists the settings analysed on another setting's "
            "graph; *refused* why a graph was not shared where the parameter dtype allowed it."
        ),
        "",
        (
            f"Produced by `scripts/reuse_matrix.py` with torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}, on "
            f"{os.cpu_count()} CPU cores and no GPU; {analyses} analyses with {captures} "
            f"captures instead of {analyses}; total {total:.0f} s wall."
        ),
        "",
        "| model | captures | equal | shared | refused |",
        "|---|---:|---|---|---|",
    ]
    for r in rows:
        if r.failure:
            lines.append(f"| `{r.name}` | – | failed: {r.failure} | | |")
            continue
        equal = "yes" if not r.differences else f"**no** ({len(r.differences)})"
        shared = ", ".join(sorted({s.split(" ← ")[0].split(" ", 2)[2] + " ← " + s.split(" ← ")[1]
                                   for s in r.shared})) or "–"  # fmt: skip
        refused = "; ".join(sorted({x.split(": ", 1)[1] for x in r.refused})) or "–"
        lines.append(
            f"| `{r.name}` | {r.captures} of {r.analyses} | {equal} | {shared} | {refused} |"
        )
    details = [d for r in rows for d in r.differences]
    if details:
        lines += ["", "## Differences", ""] + [f"- {d}" for d in details]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m", "--model", action="append",
        help="bundled model, or a model of scripts/vision_matrix.py (repeat)",
    )  # fmt: skip
    parser.add_argument("--device", action="append", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "graph-reuse.md")
    parser.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    opts = parser.parse_args(argv)
    devices = tuple(opts.device or ("cuda",))

    import torch  # noqa: F401 - imported once, before the workers fork
    import transformers  # noqa: F401

    from ampgraph.model.build import bundled_models
    from ampgraph.pipeline.stages import analyze_group  # noqa: F401

    names = opts.model or list(bundled_models())
    jobs = [(n, devices) for n in sorted(names, key=lambda n: -COST_HINT.get(n, 1))]
    start = time.perf_counter()
    rows: dict[str, Row] = {}
    if opts.jobs > 1:
        with mp.get_context("fork").Pool(opts.jobs, maxtasksperchild=1) as pool:
            for row in pool.imap_unordered(run_model, jobs):
                rows[row.name] = row
                print(f"{row.name}: {row.captures}/{row.analyses} captures, "
                      f"{len(row.differences)} differences ({row.seconds:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
    else:
        for job in jobs:
            rows[job[0]] = run_model(job)
    total = time.perf_counter() - start
    ordered = [rows[n] for n in names]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(markdown(ordered, total, devices))
    print(f"wrote {opts.out} in {total:.0f} s", file=sys.stderr)
    return 1 if any(r.failure or r.differences for r in ordered) else 0


if __name__ == "__main__":
    sys.exit(main())
