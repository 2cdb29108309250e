"""The compiled dtype flow on bigger models: Inductor's plan (fake tensors) for each model, timed,
then proven on the real thing on this CPU: the same captured graph compiled by Inductor's C++
backend with random weights, its generated code read node by node against the plan, and its
outputs against eager's, with and without ``emulate_precision_casts``.

    PYTHONPATH=src python scripts/compiled_matrix.py > /tmp/compiled-matrix.json
    PYTHONPATH=src nice -n 10 python scripts/compiled_matrix.py proof opt-125m half \
        --append /tmp/compiled-proofs.jsonl          # one proof row, appended as it finishes

Compiling OPT-125M for real takes minutes of CPU: run it under ``nice``, one row at a time.
MODEL is a model spec, or ``moe`` for the Mixtral-shaped MoE below. ``COMPILED_CODE_DIR=DIR``
keeps each generated module there for a reader. The rows behind docs/compiled.md's proof table
are ``docs/verification/cpu-compiled-proofs.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ampgraph.capture.trace import capture
from ampgraph.compiled import generated
from ampgraph.compiled.inductor import plan
from ampgraph.model.build import load_model
from ampgraph.settings import Setting, seed_matrix

#: A Mixtral-shaped MoE small enough to compile here (2 layers, 4 experts, top-2).
MOE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
       "max_position_embeddings": 64}  # fmt: skip


def _materialise(module: torch.nn.Module) -> torch.nn.Module:
    """The meta-built model on the CPU with seeded random weights (no download)."""
    torch.manual_seed(0)
    module = module.to_empty(device="cpu")
    if hasattr(module, "tie_weights"):  # to_empty unties shared weights; export's graph shares
        module.tie_weights()  # them (OPT's lm_head reads embed_tokens'), so eager must too
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02)
        for name, b in module.named_buffers():
            if b.is_floating_point() and "inv_freq" not in name:
                b.fill_(1.0 if name.endswith("running_var") else 0.0)
    if hasattr(module, "_init_weights") and hasattr(module, "config"):
        rope = getattr(module, "model", module)
        for m in rope.modules():
            if hasattr(m, "inv_freq") and hasattr(m, "rope_init_fn"):
                m.inv_freq.copy_(m.rope_init_fn(m.config, "cpu")[0])
    return module.eval()


def _real(value: object) -> object:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return torch.randn(value.shape)
        return torch.ones(value.shape, dtype=value.dtype)
    return value


def plan_row(spec: str, setting: Setting) -> dict:
    model = load_model(spec)
    t = time.perf_counter()
    c = capture(model, setting)
    t_capture = time.perf_counter() - t
    t = time.perf_counter()
    flow = plan(c)
    t_plan = time.perf_counter() - t
    low = [n for n in flow.nodes if n.computes and n.dtype in ("bfloat16", "float16")]
    return {"model": spec, "setting": setting.name, "capture_s": round(t_capture, 1),
            "plan_s": round(t_plan, 1), "nodes": len(flow.nodes), "computing_16bit": len(low),
            "dropped": len(flow.dropped()), "kernels": len(flow.kernels),
            "dropped_names": [f"{n.name} ({n.module})" for n in flow.dropped()][:6]}  # fmt: skip


def proof_row(spec: str, setting: Setting) -> dict:
    model = load_model(spec)
    c = capture(model, setting)
    module = _materialise(model.module)
    args = tuple(_real(a) for a in model.args)
    kwargs = {k: _real(v) for k, v in model.kwargs.items()}
    row: dict = {"model": spec, "setting": setting.name}
    outs = []
    for emulate in (False, True):
        flow = plan(c, emulate_precision_casts=emulate)
        t = time.perf_counter()
        out, code = generated.compile_for_real(
            c, generated.real_inputs(c, module, args, kwargs), emulate_precision_casts=emulate)
        row[f"compile_s{'_emulate' if emulate else ''}"] = round(time.perf_counter() - t, 1)
        read = generated.read_code(code)
        if os.environ.get("COMPILED_CODE_DIR"):  # keep the generated module for a reader
            where = Path(os.environ["COMPILED_CODE_DIR"]) / f"{Path(spec).stem}-{emulate}.py"
            where.write_text(code)
        row[f"untyped{'_emulate' if emulate else ''}"] = len(read.untyped)
        row[f"disagreements{'_emulate' if emulate else ''}"] = generated.disagreements(flow, read)
        row[f"cpp_kernels{'_emulate' if emulate else ''}"] = len(read.kernels)
        outs.append(out[0].float())
    eager_module = module.to(getattr(torch, setting.param_dtype))  # as the setting runs eager
    with torch.no_grad(), torch.autocast("cpu", getattr(torch, setting.amp_dtype),
                                         enabled=setting.autocast):  # fmt: skip
        eager = eager_module(*args, **kwargs)
    if not isinstance(eager, torch.Tensor):  # a tuple, or a ModelOutput whose first is logits
        eager = eager[0]
    row["dropped"] = len(plan(c).dropped())
    eager = eager.float()
    row["eager_max_abs"] = eager.abs().max().item()
    for key, out in (("gap", outs[0]), ("gap_emulate", outs[1])):
        diff = (out - eager).abs()
        row[key] = diff.max().item()
        row[f"{key}_mean"] = diff.mean().item()
        row[f"{key}_equal"] = (diff == 0).float().mean().item()  # share of outputs bit-equal
    # What the dropped roundings alone change: the compiled program against itself with them
    # emulated (the same kernels otherwise, so no reassociation of fused math in between).
    row["emulation_changes_output"] = not torch.equal(outs[0], outs[1])
    row["emulation_gap"] = (outs[0] - outs[1]).abs().max().item()
    return row


def _moe_spec() -> str:
    moe = Path(tempfile.mkdtemp()) / "config.json"
    moe.write_text(json.dumps(MOE))
    return str(moe)


def _one(kind: str, spec: str, setting_name: str, append: str | None) -> None:
    """One row (``plan`` or ``proof``), printed and appended to ``append`` as it finishes."""
    fn = {"plan": plan_row, "proof": proof_row}[kind]
    spec = _moe_spec() if spec == "moe" else spec
    t = time.perf_counter()
    row = {"kind": fn.__name__, "torch": torch.__version__,
           **fn(spec, Setting.parse(setting_name, device_type="cpu"))}  # fmt: skip
    row["wall_s"] = round(time.perf_counter() - t, 1)
    print(json.dumps(row), flush=True)
    if append:
        with open(append, "a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    args = sys.argv[1:]
    if args:  # one row: plan|proof MODEL [SETTING] [--append FILE]
        append = args[args.index("--append") + 1] if "--append" in args else None
        rest = [a for a in args if a not in ("--append", append)]
        _one(rest[0], rest[1], rest[2] if len(rest) > 2 else "amp-fp32", append)
        return
    moe = _moe_spec()
    rows = []
    cpu = seed_matrix("cpu")
    amp = Setting.parse("amp-fp32", device_type="cpu")
    jobs = [(plan_row, "opt-125m", s) for s in cpu]
    jobs += [(plan_row, m, amp) for m in ("t5-small", "resnet18", moe)]
    jobs += [(proof_row, m, amp) for m in ("resnet18", moe, "t5-small", "opt-125m")]
    for fn, spec, setting in jobs:
        try:
            rows.append({"kind": fn.__name__, **fn(spec, setting)})
        except Exception as exc:  # noqa: BLE001 - a row says what failed, the rest still run
            rows.append({"kind": fn.__name__, "model": spec, "setting": setting.name,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
