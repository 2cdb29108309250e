#!/usr/bin/env python3
"""``ampgraph ranges`` at full size: peak memory and time per billion parameters, one weight at a
time, and what a 70B checkpoint would need on this machine.

Synthesizes a Llama checkpoint in bf16 safetensors shards (as real checkpoints are saved; one
shard per decoder layer, written one tensor at a time) of about ``--params`` parameters, then
runs ``value_ranges(..., stream=True)`` on it in a fresh process (its peak resident memory is
then the run's own: ``VmHWM`` less the resident memory before the run) in ``--settings``, and
prints:

* the wall and CPU seconds of the whole call and of the reference run, per billion parameters;
* the peak memory above the start, beside the largest tensor in fp32 (what one weight at a time
  must hold: the bf16 tensor read, and its fp32 copy);
* for Llama-3-70B's shape (80 layers, hidden 8192, MLP 28672, vocabulary 128256: 70.6B
  parameters, largest tensor the 4.2 GB fp32 embedding): the time at the measured rate, and the
  peak as measured here scaled by the largest tensor, beside this machine's memory.

    python bench/ranges_full_size.py --params 1.0 --json bench/results/full-size.json

The shards are read from the page cache where they were just written: a first read from disk
adds the disk's time (141 GB for a 70B bf16 checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Llama-3-70B's shape (its config.json's numbers).
LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip


def config(params_b: float) -> dict[str, Any]:
    """A Llama config of hidden 2048 (MLP 5632, vocabulary 32000, 16 heads of 128, 4 KV heads)
    with as many layers as make about ``params_b`` billion parameters."""
    hidden, mlp, vocab, kv = 2048, 5632, 32000, 512
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden
    layers = max(1, round((params_b * 1e9 - 2 * vocab * hidden) / per_layer))
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
        "intermediate_size": mlp, "num_hidden_layers": layers, "num_attention_heads": 16,
        "num_key_value_heads": 4, "vocab_size": vocab, "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }  # fmt: skip


def count(cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters, elements of the largest tensor) of a Llama config."""
    h, m, v, n = (cfg[k] for k in ("hidden_size", "intermediate_size", "vocab_size",
                                   "num_hidden_layers"))  # fmt: skip
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * m + 2 * h
    return 2 * v * h + n * per_layer + h, max(v * h, m * h)


def synthesize(folder: Path, cfg: dict[str, Any]) -> None:
    """config.json and bf16 shards: one per decoder layer, one for the rest."""
    import torch
    from safetensors.torch import save_file

    from ampgraph.model.build import load_model

    (folder / "config.json").write_text(json.dumps(cfg))
    model = load_model(str(folder), seq_len=8)  # on meta: shapes only
    groups: dict[str, list[tuple[str, Any]]] = {}
    for name, p in model.module.named_parameters():
        layer = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(layer, []).append((name, p.shape))
    gen = torch.Generator().manual_seed(0)
    for layer, members in groups.items():
        tensors = {
            name: (torch.randn(shape, generator=gen) * 0.02 if len(shape) > 1
                   else torch.ones(shape)).to(torch.bfloat16)
            for name, shape in members
        }  # fmt: skip
        save_file(tensors, str(folder / f"model-{layer}.safetensors"))


CHILD = """
import json, sys, time
from pathlib import Path
from ampgraph.model.build import load_model
from ampgraph.ranges import value_ranges

def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

folder, settings = Path(sys.argv[1]), sys.argv[2].split(",")
model = load_model(str(folder), seq_len=8)
start = status("VmRSS:")
w, c = time.perf_counter(), time.process_time()
result = value_ranges(model, settings, device_type="cpu", amp_dtype="fp16", weights_dir=folder,
                      stream=True)
print(json.dumps({"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c,
                  "seconds": result.seconds, "peak_above_start": status("VmHWM:") - start,
                  "ok": result.ok, "weights": result.weights}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1.0, help="Billions of parameters.")
    parser.add_argument("--settings", default="amp-fp32")
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    args = parser.parse_args()
    cfg = config(args.params)
    params, largest = count(cfg)
    with tempfile.TemporaryDirectory(prefix="ampgraph-full-size-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        synthesize(folder, cfg)
        written = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder), args.settings],
                             capture_output=True, text=True, env=env, check=True)  # fmt: skip
        run = json.loads(out.stdout.splitlines()[-1])
    billions = params / 1e9
    per_b = {k: run[k] / billions for k in ("wall_s", "cpu_s")}
    run_per_b = run["seconds"]["run"] / billions
    peak, fp32_largest = run["peak_above_start"], largest * 4
    p70, l70 = count({**LLAMA_70B})
    peak_70 = peak * (l70 * 4) / fp32_largest  # the peak scales with the largest tensor
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"synthesized: {billions:.2f}B parameters ({cfg['num_hidden_layers']} layers), "
          f"{size / 1e9:.2f} GB of bf16 shards, written in {written:.0f} s; "
          f"{platform.machine()}, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"ranges, one weight at a time, {args.settings}: {run['wall_s']:.1f} s wall, "
          f"{run['cpu_s']:.1f} s CPU; reference run {run['seconds']['run']:.1f} s")
    print(f"per billion parameters: {per_b['wall_s']:.1f} s wall, {per_b['cpu_s']:.1f} s CPU "
          f"(reference run {run_per_b:.1f} s)")
    print(f"peak memory above the start: {peak / 1e9:.2f} GB (largest tensor in fp32: "
          f"{fp32_largest / 1e9:.2f} GB); in memory the weights alone would be "
          f"{params * 4 / 1e9:.1f} GB")
    print(f"Llama-3-70B ({p70 / 1e9:.1f}B, largest tensor {l70 * 4 / 1e9:.1f} GB in fp32): about "
          f"{per_b['wall_s'] * p70 / 1e9 / 60:.0f} min at this rate and {peak_70 / 1e9:.1f} GB "
          f"peak (this machine: {total / 1e9:.1f} GB), against {p70 * 4 / 1e9:.0f} GB held whole")
    if args.json:
        record = {
            "params": params, "layers": cfg["num_hidden_layers"], "bytes": size,
            "settings": args.settings, "run": run, "per_billion": per_b,
            "peak_above_start": peak, "largest_fp32": fp32_largest,
            "llama_70b": {"params": p70, "minutes": per_b["wall_s"] * p70 / 1e9 / 60,
                          "peak_bytes": peak_70, "machine_bytes": total},
        }  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
