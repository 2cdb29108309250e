"""The zoo's page (docs/zoo.md) from its JSON lines, and the suite's slice data (issue 42).

``scripts/zoo.py --page`` and ``--export-slice`` call these; the results file is the record of
the run (one JSON object per model type, the last one for a type wins, so a rerun of some types
appended to the file replaces their lines).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import classify, config_and_inputs, model_types, status  # noqa: E402

#: The mechanisms the capture fix of issue 42 (the ``zoofix`` branch) addresses.
FIX_CLASSES = ("grad mode", "lines before a raise", "swapped modules", "value-dependent shapes",
               ".item()")  # fmt: skip


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every type's last record in ``results``, by type."""
    records: dict[str, dict[str, Any]] = {}
    for line in results.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            records[rec["type"]] = rec
    return records


def mechanism(rec: dict[str, Any]) -> str:
    """Why a type is not exact, as one phrase and the evidence's first line.

    >>> mechanism({"build_error": "LookupError: no tester here", "builds": False})
    'other: LookupError: no tester here'
    """
    if not rec.get("builds"):
        text = rec.get("build_error", "")
        return f"{classify(text)}: {text}"
    for combo, cells in rec["cells"].items():
        for name, cell in cells.items():
            if cell.get("failure"):
                return f"{classify(cell['failure'])} ({name}, {combo}): {cell['failure']}"
            if cell.get("raises") and not cell.get("agrees"):
                return (f"the real run raises where the capture does not ({name}, {combo}): "
                        f"{cell['raises']}")  # fmt: skip
            if not cell.get("agrees", cell.get("ok")):
                why = cell.get("first_difference") or cell.get("first") or "no line compared"
                return f"{classify(why)} ({name}, {combo}): {why}"
    return "exact"


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def page(records: dict[str, dict[str, Any]]) -> str:
    """docs/zoo.md's Markdown."""
    counts = Counter(status(r) for r in records.values() if not r.get("no_tester"))
    tried = [r for r in records.values() if not r.get("no_tester")]
    combos = sorted({c for r in tried for c in r.get("cells", {})})
    total = len(set(model_types()) | set(records))
    untested = sum(bool(r.get("no_tester")) for r in records.values())
    lines = [
        "# The transformers zoo, as a number",
        "",
        "Every model type of the installed transformers that has a base model class, built from "
        "its own tests' tiny config and inputs (`scripts/zoo.py`, issue 42), analysed by ampgraph: "
        "`check` (the CUDA policy on the dispatcher, and the eager model's forward hooks on fake "
        "CUDA tensors) and `verify --device cpu` (the CPU policy, real CPU kernels), in "
        f"{', '.join(f'`{c}`' for c in combos) or 'no combination yet'}.",
        "",
        "| | types |",
        "| --- | --- |",
        f"| model types with a base model class | {total} |",
        f"| with a tester here, run | {len(tried)} |",
        f"| without a tester here (no test file, not a causal LM) | {untested} |",
        f"| not run yet (the run was stopped first) | {total - len(records)} |",
        f"| build | {len(tried) - counts['does not build'] - counts['timed out'] - counts['crashed']} |",
        f"| analysable | {counts['exact'] + counts['not exact']} |",
        f"| exact | {counts['exact']} |",
        f"| timed out | {counts['timed out']} |",
        f"| the job's process died | {counts['crashed']} |",
        "",
        "A type is *analysable* when every cell was captured and verified (no failure), *exact* "
        "when every node agrees with the dispatcher, every hook line with the eager run's and "
        "every CPU node, module and cast with the real CPU run's.",
        "",
        "## Every type that is not exact, and why",
        "",
        f"Mechanisms the capture fix of issue 42 addresses: {', '.join(FIX_CLASSES)}; a type "
        "whose mechanism is one of them says so.",
        "",
        "| type | tester | status | mechanism |",
        "| --- | --- | --- | --- |",
    ]
    for name, rec in sorted(records.items()):
        if rec.get("no_tester") or status(rec) == "exact":
            continue
        mech = mechanism(rec)
        fix = " (issue 42's capture fix)" if mech.split(" (")[0].split(":")[0] in FIX_CLASSES else ""
        lines.append(f"| {name} | {_cell(rec.get('tester', '-'), 60)} | {status(rec)} | "
                     f"{_cell(mech)}{fix} |")  # fmt: skip
    exact = sorted(n for n, r in records.items() if not r.get("no_tester") and status(r) == "exact")
    lines += ["", f"## Exact ({len(exact)})", "", ", ".join(exact) or "none", ""]
    return "\n".join(lines)


def write_page(results: Path, out: Path) -> None:
    """Write ``out`` from ``results``."""
    out.write_text(page(load(results)) + _footer(results))


def _footer(results: Path) -> str:
    return (
        "\n## How it was made\n\n"
        f"`python scripts/zoo.py --page --results {results.name}` from the results file beside "
        "this page; the run itself is `python scripts/zoo.py --tests-dir TRANSFORMERS/tests` "
        "(each type a Ray job, see the script's docstring for a cluster).\n"
    )


def _tensor(value: Any) -> dict[str, Any]:
    """A tensor as JSON: integer values kept (ids and masks steer a forward), floating ones as
    their shape and dtype only (the suite draws them from seed 0: only the dtype flows)."""
    out = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if not value.is_floating_point():
        out["values"] = value.flatten().tolist()
    return out


def export_slice(names: list[str], tests_dir: Path, out: Path) -> None:
    """Each of ``names``' tiny config and inputs as JSON (the suite's slice, no transformers
    checkout needed to rebuild them)."""
    data = {}
    for name in names:
        config, inputs, source = config_and_inputs(name, tests_dir)
        data[name] = {
            "tester": source,
            "config": config.to_diff_dict(),
            "inputs": {k: _tensor(v) for k, v in inputs.items()},
        }
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
