#!/usr/bin/env python
"""Prove the make-fx capture on every bundled model: it annotates as torch.export's graph does.

For each model, device type, autocast dtype and each of the seed's four settings, the model is
captured twice, by ``--tracer make-fx`` (the default: ``make_fx`` with export's own passes) and by
``--tracer export`` (``torch.export.export``), and both graphs are annotated and checked against
the dispatcher. Every node record (with the check's verdicts, including the dtypes each trace
recorded) and every module call must be equal, and the dispatcher must agree with every node.
Also times both captures. Writes docs/capture-engines.md.

    .venv/bin/python scripts/engine_matrix.py                       # bundled + vision models
    .venv/bin/python scripts/engine_matrix.py -m gpt2 --device cpu --out /tmp/e.md

Exit status 1 if any model annotates differently under the two, or disagrees with the dispatcher.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from matrix_harness import AMP_DTYPES, SETTINGS
from reuse_matrix import COST_HINT, vision_model, vision_models


@dataclass
class Row:
    name: str
    analyses: int = 0
    nodes: int = 0
    disagreements: int = 0
    differences: list[str] = field(default_factory=list)
    methods: set[str] = field(default_factory=set)
    seconds: dict[str, float] = field(default_factory=lambda: {"make-fx": 0.0, "export": 0.0})
    failure: str | None = None


def difference(a: object, b: object) -> str | None:
    """The first difference between two reports, with the check's full record (both traces'
    dtypes included) and the capture's fields other than its method."""
    from ampgraph.capture.reads import annotation_difference

    why = annotation_difference(a, b)
    if why is not None:
        return why
    for x, y in zip(a.nodes, b.nodes):  # type: ignore[attr-defined]
        if x.check != y.check:
            return f"node {x.name}: check {x.check!r}, export {y.check!r}"
    ca = {k: v for k, v in a.capture.items() if k != "method"}  # type: ignore[attr-defined]
    cb = {k: v for k, v in b.capture.items() if k != "method"}  # type: ignore[attr-defined]
    return None if ca == cb else f"capture {ca!r}, export {cb!r}"


def run_model(job: tuple[str, tuple[str, ...]]) -> Row:
    from ampgraph.capture.trace import capture
    from ampgraph.model.build import load_model
    from ampgraph.pipeline.stages import analyze_capture, trace
    from ampgraph.settings import Setting, short_dtype

    name, devices = job
    row = Row(name)
    try:
        model = vision_model(name) if name in vision_models() else load_model(name)
        for device in devices:
            for amp in AMP_DTYPES:
                for s in SETTINGS:
                    setting = Setting.parse(s, device_type=device, amp_dtype=amp)
                    reports = {}
                    for tracer in ("make-fx", "export"):
                        start = time.perf_counter()
                        cap = capture(trace(model, tracer), setting)
                        row.seconds[tracer] += time.perf_counter() - start
                        row.methods.add(cap.method)
                        reports[tracer] = analyze_capture(cap, check=True)
                    row.analyses += 1
                    mine = reports["make-fx"]
                    row.nodes += len(mine.nodes)
                    row.disagreements += sum(
                        1 for r in mine.nodes if r.check and r.check.get("agree") is False
                    )
                    why = difference(mine, reports["export"])
                    if why is not None:
                        row.differences.append(
                            f"{device} {short_dtype(setting.amp_dtype)} {s}: {why}"
                        )
    except Exception as exc:  # noqa: BLE001 - report it in the table, don't stop the matrix
        row.failure = f"{type(exc).__name__}: {exc}"
    return row


def markdown(rows: Sequence[Row], total: float, devices: Sequence[str]) -> str:
    import torch
    import transformers

    mfx = sum(r.seconds["make-fx"] for r in rows)
    exp = sum(r.seconds["export"] for r in rows)
    lines = [
        "# The make-fx capture against torch.export",
        "",
        (
            "Every bundled model and the torchvision and timm models of "
            "`scripts/vision_matrix.py`, in the seed's four settings (fp32, half, amp-half, "
            f"amp-fp32) with both autocast dtypes, device type {', '.join(devices)}: captured "
            "by `--tracer make-fx` (the default: `make_fx` with export's own passes, see "
            "`ampgraph.capture.trace`) and by `--tracer export` (`torch.export.export`), each graph "
            "annotated and checked against the dispatcher. *equal* says whether every node "
            "record (op, module, policy, inputs, casts, outputs, promotion, reason, error, the "
            "check with the dtypes each trace recorded), every module call and the capture's "
            "other fields are the same; *disagreements* counts nodes of the make-fx analysis "
            "where the dispatcher disagrees. *capture s* is the time of the captures alone."
        ),
        "",
        (
            f"Produced by `scripts/engine_matrix.py` with torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}, on "
            f"{os.cpu_count()} CPU cores and no GPU; captures {mfx:.0f} s (make-fx) against "
            f"{exp:.0f} s (export); total {total:.0f} s wall."
        ),
        "",
        (
            "| model | analyses | nodes | equal | disagreements | capture s make-fx / export "
            "| methods |"
        ),
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        if r.failure:
            lines.append(f"| `{r.name}` | – | – | failed: {r.failure} | | | |")
            continue
        equal = "yes" if not r.differences else f"**no** ({len(r.differences)})"
        lines.append(
            f"| `{r.name}` | {r.analyses} | {r.nodes} | {equal} | {r.disagreements} | "
            f"{r.seconds['make-fx']:.1f} / {r.seconds['export']:.1f} | "
            f"{', '.join(sorted(r.methods))} |"
        )
    details = [f"- `{r.name}` {d}" for r in rows for d in r.differences]
    if details:
        lines += ["", "## Differences", "", *details]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m", "--model", action="append",
        help="bundled model, or a model of scripts/vision_matrix.py (repeat)",
    )  # fmt: skip
    parser.add_argument("--device", action="append", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "capture-engines.md")
    parser.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    opts = parser.parse_args(argv)
    devices = tuple(opts.device or ("cuda",))

    import torch  # noqa: F401 - imported once, before the workers fork
    import transformers  # noqa: F401

    from ampgraph.model.build import bundled_models
    from ampgraph.pipeline.stages import analyze_capture  # noqa: F401

    names = opts.model or [*bundled_models(), *vision_models()]
    jobs = [(n, devices) for n in sorted(names, key=lambda n: -COST_HINT.get(n, 1))]
    start = time.perf_counter()
    rows: dict[str, Row] = {}
    with mp.get_context("fork").Pool(max(1, opts.jobs), maxtasksperchild=1) as pool:
        for row in pool.imap_unordered(run_model, jobs):
            rows[row.name] = row
            print(f"{row.name}: {row.analyses} analyses, {len(row.differences)} differences, "
                  f"{row.disagreements} disagreements {row.failure or ''}",
                  file=sys.stderr, flush=True)  # fmt: skip
    total = time.perf_counter() - start
    ordered = [rows[n] for n in names]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(markdown(ordered, total, devices))
    print(f"wrote {opts.out} in {total:.0f} s", file=sys.stderr)
    bad = any(r.failure or r.differences or r.disagreements for r in ordered)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
