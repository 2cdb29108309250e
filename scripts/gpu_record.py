"""Record ampgraph's real-execution verification on this machine's GPU, for docs/verification/.

Runs ``ampgraph verify`` (the library call) for OPT-125M and llama-tiny in the seed notebook's
four settings, once with bf16 and once with fp16 autocast, writes every result into one JSON
record ``docs/verification/<device>-<gpu>-<date>.json`` and prints a Markdown summary to paste
into a pull request. Exit status 1 if any setting disagrees (the record is written all the same).

Runs from a source checkout with no network and no install step::

    PYTHONPATH=src python3 scripts/gpu_record.py                 # on the GPU machine
    PYTHONPATH=src python3 scripts/gpu_record.py --device cpu    # the same on CPU (CI smoke test)
    PYTHONPATH=src python3 scripts/gpu_record.py --models opt-125m --amp-dtypes bf16 --out /tmp/v
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("opt-125m", "llama-tiny")
DEFAULT_AMP_DTYPES = ("bf16", "fp16")
SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def slug(text: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``: safe in a file name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def record_path(out_dir: Path, device_type: str, name: str, date: str) -> Path:
    return out_dir / f"{device_type}-{slug(name)}-{date[:10]}.json"


def markdown(record: dict[str, Any]) -> str:
    """The summary to paste into a pull request: where it ran, then one row per setting."""
    versions = record["versions"]
    lines = [
        f"### ampgraph verify: real {record['device_type'].upper()} execution",
        "",
        (
            f"{record['device_type'].upper()}: **{record['device_name']}**, torch "
            f"{versions.get('torch')}, transformers {versions.get('transformers')}, ampgraph "
            f"{versions.get('ampgraph')}, {record['date']}"
        ),
        "",
        *table_rows(record["results"]),
    ]
    for err in record["errors"]:
        lines.append(
            f"| {err['model']} | {err['amp_dtype']} | {err['setting']} | error: {err['error']} "
            "| | | |"
        )
    bad = [(r, d) for r in record["results"] for d in r["disagreements"]]
    if bad:
        lines += ["", "Disagreements:", ""]
        for r, d in bad:
            amp = SHORT[r["setting"]["amp_dtype"]]
            lines.append(
                f"- {r['model']} {r['setting']['name']} ({amp}): {d['kind']} `{d['node']}` "
                f"({d['op']}): predicted {d['predicted']}, observed {d['observed']}"
            )
    verdict = "all agree" if record["ok"] else "DISAGREEMENTS FOUND"
    lines += ["", f"Result: **{verdict}**."]
    return "\n".join(lines)


def table_rows(results: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown table of verify results: one row per model, autocast dtype and setting."""
    lines = [
        "| model | autocast dtype | setting | nodes | modules | casts | disagreements |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r["agreement"]
        cells = [
            r["model"],
            SHORT[r["setting"]["amp_dtype"]],
            r["setting"]["name"],
            *(f"{f[k]['agree']}/{f[k]['total']}" for k in ("nodes", "modules", "casts")),
            str(len(r["disagreements"])),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def record_figures(folder: Path) -> str:
    """The figures of a folder of ``verify --record`` files, as the record's docs page shows
    them (``--page``; ``tests/test_gpu_record_page.py`` checks the page against its JSON):
    a totals line, then the table."""
    import json

    results = [
        r for path in sorted(folder.glob("*.json")) for r in json.loads(path.read_text())["results"]
    ]
    totals = {
        k: (sum(r["agreement"][k]["agree"] for r in results),
            sum(r["agreement"][k]["total"] for r in results))
        for k in ("nodes", "modules", "casts")
    }  # fmt: skip
    models = sorted({r["model"] for r in results})
    found = [
        f"{r['model']} {r['setting']['name']} {SHORT[r['setting']['amp_dtype']]}"
        for r in results for _d in r["disagreements"]
    ]  # fmt: skip
    head = (
        f"{len(results)} runs of {len(models)} models: "
        + ", ".join(f"{k} {a}/{t}" for k, (a, t) in totals.items())
        + f" agree; {len(found)} disagreement{'s' if len(found) != 1 else ''}"
        + (f" ({', '.join(found)})." if found else ".")
    )
    return "\n".join([head, "", *table_rows(results)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated model specs (default: %(default)s)")  # fmt: skip
    parser.add_argument("--amp-dtypes", default=",".join(DEFAULT_AMP_DTYPES),
                        help="comma-separated autocast dtypes (default: %(default)s)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "verification",
                        help="folder for the JSON record (default: docs/verification)")  # fmt: skip
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--page", type=Path, metavar="FOLDER",
                        help="print the figures of a folder of records for its docs page; "
                             "run nothing")  # fmt: skip
    args = parser.parse_args(argv)
    if args.page is not None:
        print(record_figures(args.page))
        return 0

    import torch

    from ampgraph.errors import AmpgraphError
    from ampgraph.model.build import load_model
    from ampgraph.settings import seed_matrix
    from ampgraph.formats.outputs import write_verify_record
    from ampgraph.formats.verify import summary_line
    from ampgraph.verify import device_name, verify, verify_record

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run this on the GPU machine, or pass --device cpu",
              file=sys.stderr)  # fmt: skip
        return 2
    results = []
    errors: list[dict[str, str]] = []
    start = time.perf_counter()
    for spec in filter(None, (m.strip() for m in args.models.split(","))):
        model = load_model(spec, seq_len=args.seq_len)
        for amp in filter(None, (a.strip() for a in args.amp_dtypes.split(","))):
            for setting in seed_matrix(args.device, amp):
                try:
                    result = verify(model, setting)
                except AmpgraphError as exc:  # record it and go on: a GPU session is precious
                    errors.append({"model": spec, "amp_dtype": amp, "setting": setting.name,
                                   "error": str(exc)})  # fmt: skip
                    print(f"{spec} {setting.name} {amp}: error: {exc}", file=sys.stderr)
                    continue
                print(summary_line(result), file=sys.stderr)
                results.append(result)
    name = device_name(args.device)
    extra = {
        "device_type": args.device,
        "device_name": name,
        "command": " ".join(["scripts/gpu_record.py", *(sys.argv[1:] if argv is None else argv)]),
        "seconds": round(time.perf_counter() - start, 1),
        "errors": errors,
    }
    record = verify_record(results, **extra)
    record["ok"] = extra["ok"] = record["ok"] and not errors
    path = write_verify_record(results, record_path(args.out, args.device, name, record["date"]), **extra)
    print(markdown(record))
    print(f"\nrecord: {path}", file=sys.stderr)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
