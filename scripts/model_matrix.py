#!/usr/bin/env python
"""Check every bundled model against the dispatcher in every setting and write docs/models.md.

The matrix is each bundled model x the seed's four settings x {bf16, fp16} x {cuda, cpu}: 16
checked analyses per model. Each model is built once (on meta) and reused for its 16 settings;
models run in worker processes forked after torch and transformers are imported, largest first, so
two cores stay busy.

    .venv/bin/python scripts/model_matrix.py                    # all bundled models -> docs/models.md
    .venv/bin/python scripts/model_matrix.py -m gpt2 -m bert-base-uncased --out /tmp/m.md

Exit status 1 if any node disagrees with the dispatcher or any analysis fails.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import AMP_DTYPES, SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ("cuda", "cpu")
#: Rough relative cost (layers x width) so the biggest models start first.
COST_HINT = {"llama-3-70b": 100, "phi-2": 12, "mistral-7b": 10, "llama-3-8b": 10, "qwen2-0.5b": 8}


@dataclass
class Cell:
    """One (device, amp dtype) column of one model: four settings summed."""

    nodes: list[int] = field(default_factory=list)
    compared: int = 0
    disagreements: int = 0
    errors: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class Row:
    """One model's line of the table."""

    name: str
    architecture: str = "-"
    params: str = "-"
    origin: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failure: str | None = None
    captures: int = 0


def run_model(name: str) -> Row:
    """Build one model and check it in all 16 settings."""
    from ampgraph.formats.text import disagreement_lines
    from ampgraph.model.build import CatalogueEntry, bundled_models, count_parameters, load_model
    from ampgraph.pipeline.stages import analyze, analyze_group
    from ampgraph.settings import Setting, short_dtype

    start = time.perf_counter()
    row = Row(name, origin=bundled_models().get(name, ""))
    try:
        model = load_model(name)
    except Exception as exc:  # noqa: BLE001 - report it in the table, don't stop the matrix
        row.failure = f"build: {type(exc).__name__}: {exc}"
        row.seconds = time.perf_counter() - start
        return row
    row.architecture = type(model.module).__name__
    row.params = CatalogueEntry(name, "", "", count_parameters(model.module), "").params_text
    for device in DEVICES:
        # All eight settings of a device type at once: one capture per parameter dtype serves
        # every setting it is proven to be the graph of (analyze_group).
        settings = [
            Setting.parse(setting_name, device_type=device, amp_dtype=amp)
            for amp in AMP_DTYPES
            for setting_name in SETTINGS
        ]
        try:
            reports = analyze_group(model, settings)
        except Exception:  # noqa: BLE001 - find the failing setting one by one
            reports = []
            for setting in settings:
                try:
                    reports.append(analyze(model, setting))
                except Exception as exc:  # noqa: BLE001 - a failed setting is a finding
                    reports.append(exc)
        for setting, rep in zip(settings, reports):
            amp, setting_name = short_dtype(setting.amp_dtype), setting.name
            cell = row.cells.setdefault(f"{device} {amp}", Cell())
            if isinstance(rep, Exception):
                cell.failures.append(f"{setting_name}: {type(rep).__name__}: {rep}")
                continue
            if not rep.capture.get("graph_of"):
                row.captures += 1
            assert rep.check is not None
            cell.nodes.append(len(rep.nodes))
            cell.compared += int(rep.check["compared"])
            cell.disagreements += int(rep.check["disagreements"])
            cell.errors += len(rep.errors)
            for line in disagreement_lines(rep):
                row.details.append(f"{device} {amp} {setting_name}: {line}")
    row.seconds = time.perf_counter() - start
    return row


def _nodes(cells: Sequence[Cell]) -> str:
    counts = [n for c in cells for n in c.nodes]
    if not counts:
        return "-"
    lo, hi = min(counts), max(counts)
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def _cell(cell: Cell) -> str:
    if cell.failures:
        return f"**{len(cell.failures)} failed**"
    text = f"{cell.disagreements}"
    if cell.errors:
        # A predicted error is a finding about the model, agreed by the dispatcher: said, not bold.
        text += f" ({cell.errors} raises)"
    return f"**{text}**" if cell.disagreements else text


def markdown(rows: Sequence[Row], total: float) -> str:
    """The table docs/models.md holds."""
    import torch
    import transformers

    columns = [f"{d} {a}" for d in DEVICES for a in AMP_DTYPES]
    lines = [
        "# Bundled models against the dispatcher",
        "",
        (
            "Every bundled model (`ampgraph models`) captured (`--tracer make-fx`: torch.export's "
            "graph) and checked node by node against PyTorch's dispatcher in the seed's four "
            "settings (fp32, half, amp-half, amp-fp32), for both autocast dtypes and both device types: 16 checked "
            "analyses per model. Each device/dtype column gives the disagreements summed over the "
            "four settings; *nodes* is the graph size (it varies by setting where casts are traced "
            "in), *compared* the node checks summed over all 16 analyses, *captures* how many of "
            "the 16 traced a graph of their own (the others share one, proven to be the graph "
            "their own capture would give: docs/graph-reuse.md). 0 everywhere is the "
            "acceptance. Where a model raises in a setting, the column says at how many nodes "
            "(resnet18 in `half`: fp32 images meet bf16 convolution weights, which a GPU "
            "refuses); the dispatcher agrees with each such prediction."
        ),
        "",
        (
            f"Produced by `scripts/model_matrix.py` with torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}, on "
            f"{os.cpu_count()} CPU cores and no GPU (seq_len 8); total {total:.0f} s wall."
        ),
        "",
        # The architecture is on each model's gallery page: here it would push the table past
        # the page's column.
        "| model | params | nodes | compared | captures | "
        + " | ".join(columns)
        + " | time |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(columns) + "---:|",
    ]
    for row in rows:
        cells = [row.cells.get(c, Cell()) for c in columns]
        if row.failure:
            lines.append(
                f"| `{row.name}` | {row.params} | - | - | - | "
                + " | ".join("**failed**" for _ in columns)
                + f" | {row.seconds:.0f} s |"
            )
            continue
        compared = sum(c.compared for c in cells)
        lines.append(
            f"| `{row.name}` | {row.params} | {_nodes(cells)} | "
            f"{compared:,} | {row.captures} | "
            + " | ".join(_cell(c) for c in cells)
            + f" | {row.seconds:.0f} s |"
        )
    problems = [
        r for r in rows if r.failure or r.details or any(c.failures for c in r.cells.values())
    ]
    if problems:
        lines += ["", "## Problems", ""]
        for row in problems:
            if row.failure:
                lines.append(f"- `{row.name}`: {row.failure}")
            for cell_name, cell in row.cells.items():
                lines += [f"- `{row.name}` {cell_name} {f}" for f in cell.failures]
            lines += [f"- `{row.name}` {d}" for d in row.details[:20]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m", "--model", action="append", help="bundled model (repeat); default all"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "models.md")
    parser.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    opts = parser.parse_args(argv)

    # Imported once here, before the workers fork: imports are most of a cold process's time.
    # Frozen after, so that no collection in a worker scans (and copies) what they made.
    from ampgraph.pipeline.run import frozen_imports

    with frozen_imports():
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from ampgraph.model.build import bundled_models
        from ampgraph.pipeline.stages import analyze  # noqa: F401

    names = opts.model or list(bundled_models())
    order = sorted(names, key=lambda n: -COST_HINT.get(n, 1))
    start = time.perf_counter()
    rows: dict[str, Row] = {}
    if opts.jobs > 1:
        with mp.get_context("fork").Pool(opts.jobs, maxtasksperchild=1) as pool:
            for row in pool.imap_unordered(run_model, order):
                rows[row.name] = row
                _progress(row)
    else:
        for name in order:
            rows[name] = run_model(name)
            _progress(rows[name])
    total = time.perf_counter() - start
    ordered = [rows[n] for n in names]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(markdown(ordered, total))
    print(f"wrote {opts.out} in {total:.0f} s", file=sys.stderr)
    bad = [
        r for r in ordered if r.failure or r.details or any(c.failures for c in r.cells.values())
    ]
    return 1 if bad else 0


def _progress(row: Row) -> None:
    cells = row.cells.values()
    status = row.failure or (
        f"{sum(c.disagreements for c in cells)} disagreements, "
        f"{sum(len(c.failures) for c in cells)} failures"
    )
    print(f"{row.name}: {status} ({row.seconds:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
