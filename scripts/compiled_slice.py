"""The compiled slice of the real-device survey (``scripts/gpu_survey.py``): ampgraph's plan of what
``torch.compile`` rounds (:mod:`ampgraph.compiled.inductor`) held against the code Inductor really
generates on the device (its Triton backend on a GPU: ``.to(tl.bfloat16)`` roundings and
``'*bf16'`` pointers; its C++ backend with ``--device cpu``) and against the compiled program's
real outputs, with and without ``emulate_precision_casts``.

Each of the compiled-flow test models (``tests/compiled_models.py``: a fused gelu chain that drops
two roundings, matmuls around a softmax, a MoE-shaped router with rotary halves) is captured in
each setting asked for, planned, compiled for real and run. A run agrees where the plan and the
generated code agree kernel by kernel and buffer by buffer, and the outputs behave as planned:
where the plan drops a rounding, emulating the casts changes the compiled output; where it drops
none, emulation changes no bit.

    PYTHONPATH=src python3 scripts/compiled_slice.py --device cpu --settings amp-fp32
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test models live in the repository's tests package

MODELS = ("gelu_chain", "matmul_softmax", "moe_shaped")
SETTINGS = ("amp-fp32", "half")


def run_one(name: str, setting_name: str, amp_dtype: str, device: str) -> dict[str, Any]:
    """One model in one setting: plan, real compile and outputs, with and without emulation."""
    from ampgraph.capture.trace import capture
    from ampgraph.compiled import generated
    from ampgraph.compiled.inductor import BACKENDS, plan
    from ampgraph.model.build import ModelInputs
    from ampgraph.settings import Setting
    from tests import compiled_models

    setting = Setting.parse(setting_name, device_type=device, amp_dtype=amp_dtype)
    module, x = getattr(compiled_models, name)()
    # the input in the parameters' dtype, as a model's embedding would hand it to the layers
    module, x = module.to(device), x.to(device, getattr(torch, setting.param_dtype))
    c = capture(ModelInputs(name, module, (x,)), setting)
    row: dict[str, Any] = {"model": name, "setting": setting.name, "amp_dtype": amp_dtype,
                           "backend": BACKENDS[device], "disagreements": []}  # fmt: skip
    outs = []
    for emulate in (False, True):
        flow = plan(c, emulate_precision_casts=emulate)
        out, code = generated.compile_for_real(
            c, generated.real_inputs(c, module, (x,)), emulate_precision_casts=emulate
        )
        read = generated.read_code(code)
        tag = " (emulated)" if emulate else ""
        row["disagreements"] += [d + tag for d in generated.disagreements(flow, read)]
        if not read.kernels:
            row["disagreements"].append(f"no generated kernel read{tag}: the reader no longer fits")
        if not emulate:
            row["dropped"] = [n.name for n in flow.dropped()]
        outs.append(out[0].float())
    eager_module = module.to(getattr(torch, setting.param_dtype))
    with torch.no_grad(), torch.autocast(device, getattr(torch, amp_dtype), enabled=setting.autocast):
        eager = eager_module(x).float()
    row["gap"] = (outs[0] - eager).abs().max().item()
    row["gap_emulate"] = (outs[1] - eager).abs().max().item()
    row["emulation_changes_output"] = not torch.equal(outs[0], outs[1])
    row["ok"] = not row["disagreements"] and row["emulation_changes_output"] == bool(row["dropped"])
    return row


def survey(names: Sequence[str], settings: Sequence[str], amps: Sequence[str],
           device: str) -> list[dict[str, Any]]:  # fmt: skip
    """Every model in every setting and autocast dtype; a failure is a row that says why."""
    rows = []
    for name in names:
        for setting in settings:
            for amp in amps:
                try:
                    row = run_one(name, setting, amp, device)
                except Exception as exc:  # noqa: BLE001 - a row says what failed, the rest run
                    row = {"model": name, "setting": setting, "amp_dtype": amp, "ok": False,
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}  # fmt: skip
                print(f"compiled {name} {setting} {amp}: "
                      f"{row.get('error') or ('agrees' if row['ok'] else 'PARTS')}",
                      file=sys.stderr)  # fmt: skip
                rows.append(row)
    return rows


def render(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The survey page's section: one line per run."""
    lines = ["", "## Compiled (Inductor) against ampgraph's plan", "",
             "| model | setting | autocast dtype | backend | dropped | gap | gap emulated | result |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['model']} | {r['setting']} | {r['amp_dtype']} | | | | | "
                         f"**error**: {r['error']} |")  # fmt: skip
            continue
        result = "agrees" if r["ok"] else "**parts**: " + "; ".join(r["disagreements"][:3])
        lines.append(f"| {r['model']} | {r['setting']} | {r['amp_dtype']} | {r['backend']} | "
                     f"{', '.join(r['dropped']) or 'none'} | {r['gap']:.3g} | "
                     f"{r['gap_emulate']:.3g} | {result} |")  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--amp-dtypes", default="bfloat16")
    args = parser.parse_args(argv)
    split = lambda text: [t.strip() for t in text.split(",") if t.strip()]  # noqa: E731
    rows = survey(split(args.models), split(args.settings), split(args.amp_dtypes), args.device)
    print(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
