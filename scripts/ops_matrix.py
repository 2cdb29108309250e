#!/usr/bin/env python
"""Odd ops, each in a leaf of its own, against two oracles; writes docs/ops-matrix.md.

Each op runs in a small model, applied twice: to the input cast to the parameters' dtype
(``x.to(w.dtype)``: a dtype read while tracing, and in ``half`` the 16-bit kernel itself), then to
a Linear's output (what autocast made of it). Every model is analysed on cuda and cpu x bf16/fp16
x the seed's four settings (16 cells) and compared with

* the dispatcher: ``ampgraph check``, node by node, and
* the eager model's own forward hooks on fake tensors with the real autocast kernels
  (:func:`ampgraph.verify.hooks.eager_hook_lines`), line by line.

A cell agrees when the check finds 0 disagreements and nothing unanalysed and the hook lines are
equal (an error the model raises, such as the ``half`` setting's Linear fed fp32, included). A cell
whose prediction is inexact but which the check flags (a disagreement counted) is listed as such.

    .venv/bin/python scripts/ops_matrix.py                 # every op -> docs/ops-matrix.md
    .venv/bin/python scripts/ops_matrix.py -o rfft -o sdpa --out /tmp/ops.md

Exit status 1 if any cell is wrong without the check saying so, or fails.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import AMP_DTYPES, SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ("cuda", "cpu")
#: Every op's input: (3, 4, 4), square matrices for the linear algebra.
SHAPE = (3, 4, 4)

T = torch.Tensor
#: name -> what the leaf computes from its input ``x`` (``m`` is the leaf, for its submodule).
OPS: dict[str, Callable[[Any, T], T]] = {
    "rfft": lambda m, x: torch.fft.rfft(x, dim=-1).abs(),
    "fft2": lambda m, x: torch.fft.fft2(x).real,
    "cumsum": lambda m, x: x.cumsum(-1),
    "cumprod": lambda m, x: x.cumprod(-1),
    "prod": lambda m, x: x.prod(-1),
    "logsumexp": lambda m, x: x.logsumexp(-1),
    "sdpa": lambda m, x: F.scaled_dot_product_attention(x, x, x),
    "bicubic": lambda m, x: F.interpolate(x.unsqueeze(0), scale_factor=2, mode="bicubic"),
    "normalize": lambda m, x: F.normalize(x, dim=-1),
    "cosine_similarity": lambda m, x: F.cosine_similarity(x, x.flip(-1), dim=-1),
    "vector_norm": lambda m, x: torch.linalg.vector_norm(x, dim=-1),
    "norm_p3": lambda m, x: x.norm(p=3, dim=-1),
    "baddbmm": lambda m, x: torch.baddbmm(x, x, x.transpose(-1, -2)),
    "addmv": lambda m, x: torch.addmv(x[0, 0], x[0], x[0, 1]),
    "addr": lambda m, x: torch.addr(x[0], x[0, 0], x[0, 1]),
    "tensordot": lambda m, x: torch.tensordot(x, x, dims=([2], [2])),
    "kron": lambda m, x: torch.kron(x[0], x[1]),
    "einsum_chain": lambda m, x: torch.einsum("bij,bjk,bkl->bil", x, x, x),
    "multi_dot": lambda m, x: torch.linalg.multi_dot([x[0], x[1], x[2]]),
    "matrix_exp": lambda m, x: torch.linalg.matrix_exp(x),
    "inv": lambda m, x: torch.linalg.inv(x + 4 * torch.eye(x.shape[-1], device=x.device)),
    "dist": lambda m, x: torch.dist(x, x.flip(0)),
    "cdist": lambda m, x: torch.cdist(x, x),
    "pdist": lambda m, x: F.pdist(x[0]),
    "renorm": lambda m, x: x.renorm(2, 0, 1.0),
    "lerp": lambda m, x: torch.lerp(x, x.flip(0), 0.3),
    "mse_loss": lambda m, x: F.mse_loss(x, x.flip(0)),
    "smooth_l1_loss": lambda m, x: F.smooth_l1_loss(x, x.flip(0)),
    "kl_div": lambda m, x: F.kl_div(x.log_softmax(-1), x.softmax(-1), reduction="batchmean"),
    "soft_margin_loss": lambda m, x: F.soft_margin_loss(x, x.detach().sign()),
    "hinge_embedding_loss": lambda m, x: F.hinge_embedding_loss(x, x.sign()),
    "margin_ranking_loss": lambda m, x: F.margin_ranking_loss(x, x.flip(0), x.sign()),
    "poisson_nll_loss": lambda m, x: F.poisson_nll_loss(x, x.abs()),
    "gelu_tanh": lambda m, x: F.gelu(x, approximate="tanh"),
    "silu": lambda m, x: F.silu(x),
    "mish": lambda m, x: F.mish(x),
    "softplus": lambda m, x: F.softplus(x),
    "glu": lambda m, x: F.glu(x, -1),
    "logsigmoid": lambda m, x: F.logsigmoid(x),
    "pointwise": lambda m, x: x.abs().rsqrt() + x.pow(3) + x.exp() + x.log1p().nan_to_num(),
    "var_mean": lambda m, x: torch.var_mean(x, -1)[0],
    "std": lambda m, x: x.std(-1),
    "pixel_shuffle": lambda m, x: F.pixel_shuffle(x.reshape(1, 4, 3, 4), 2),
    "sum_of_bool": lambda m, x: (x > 0).sum(-1).float() + x.sum(-1),
    "where_float64": lambda m, x: torch.where(x > 0, x, torch.zeros((), dtype=torch.float64)),
    "mul_arange": lambda m, x: x * torch.arange(x.shape[-1], device=x.device),
    "topk": lambda m, x: x.topk(2, -1).values,
    "sort": lambda m, x: x.sort(-1).values,
    "masked_softmax": lambda m, x: x.masked_fill(x > 0, float("-inf")).softmax(-1),
    "index_add": lambda m, x: x.index_add(0, torch.tensor([0, 1], device=x.device), x[:2]),
    "scatter_add": lambda m, x: x.scatter_add(-1, torch.zeros_like(x, dtype=torch.long), x),
    "bucketize": lambda m, x: torch.bucketize(x, torch.linspace(-1, 1, 5, device=x.device)).float(),
    "embedding_bag": lambda m, x: m.inner(torch.tensor([[1, 2], [3, 4]], device=x.device)),
    "conv_transpose1d": lambda m, x: m.inner(x),
    "instance_norm": lambda m, x: m.inner(x),
    "local_response_norm": lambda m, x: m.inner(x.unsqueeze(0)),
    "multihead_attention": lambda m, x: m.inner(x, x, x)[0],
    "prelu": lambda m, x: m.inner(x),
    "bilinear": lambda m, x: m.inner(x, x),
    "group_norm": lambda m, x: m.inner(x),
}  # fmt: skip
#: The ops that are a module: what the leaf holds as ``inner``.
INNER: dict[str, Callable[[], nn.Module]] = {
    "embedding_bag": lambda: nn.EmbeddingBag(10, 4),
    "conv_transpose1d": lambda: nn.ConvTranspose1d(4, 3, 2),
    "instance_norm": lambda: nn.InstanceNorm1d(4, affine=True),
    "local_response_norm": lambda: nn.LocalResponseNorm(2),
    "multihead_attention": lambda: nn.MultiheadAttention(4, 2, batch_first=True),
    "prelu": lambda: nn.PReLU(),
    "bilinear": lambda: nn.Bilinear(4, 4, 3),
    "group_norm": lambda: nn.GroupNorm(1, 4),
}


class Op(nn.Module):
    """One op, a leaf of its own unless it holds the module that is the op."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.fn = OPS[name]
        if name in INNER:
            self.inner = INNER[name]()

    def forward(self, x: T) -> T:
        return self.fn(self, x)


class OneOp(nn.Module):
    """The op on the input cast to the parameters' dtype, then on a Linear's output."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.op = Op(name)

    def forward(self, x: T) -> T:
        # The op first, on the parameters' dtype: in ``half`` that is the 16-bit kernel itself.
        own_dtype = self.op(x.to(self.fc.weight.dtype)).float().sum()
        after_linear = self.op(self.fc(x)).float().sum()
        return own_dtype + after_linear


@dataclass
class Row:
    name: str
    cells: int = 0
    agree: int = 0
    #: Inexact, and said so: the check counted a disagreement (see ``check.hold_to_the_raise``).
    flagged: int = 0
    raised: int = 0  # cells where the eager model raises, e.g. half's first Linear
    compared: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_op(name: str) -> Row:
    """The op's 16 cells against both oracles."""
    from ampgraph import analyze
    from ampgraph.errors import AmpgraphError
    from ampgraph.model.build import ModelInputs
    from ampgraph.report.printed import hook_lines
    from ampgraph.settings import Setting
    from ampgraph.verify.hooks import eager_hook_lines

    torch.manual_seed(0)
    model = ModelInputs(name, OneOp(name).eval(), (torch.randn(SHAPE),))
    row = Row(name)
    for device in DEVICES:
        for amp in AMP_DTYPES:
            for setting_name in SETTINGS:
                setting = Setting.parse(setting_name, amp_dtype=amp, device_type=device)
                row.cells += 1
                where = f"{device} {amp} {setting_name}"
                try:
                    report = analyze(model, setting)
                except AmpgraphError as exc:
                    row.failures.append(f"{where}: {exc}")
                    continue
                check = report.check or {}
                ours = hook_lines(report)
                eager = eager_hook_lines(model, setting)
                row.compared += check.get("compared", 0)
                row.raised += any("error:" in line for line in eager)
                exact = ours == eager
                if check.get("disagreements") == 0 and not check.get("not_analysed") and exact:
                    row.agree += 1
                elif not exact and check.get("disagreements"):
                    row.flagged += 1
                    row.notes.append(f"{where}: flagged ({check['disagreements']} disagreement)")
                else:
                    first = next((a for a, b in zip(ours, eager) if a != b), "")
                    row.failures.append(
                        f"{where}: {check.get('disagreements')} disagreements, hook line {first!r}"
                    )
    return row


def _run_safely(name: str) -> Row:
    try:
        return run_op(name)
    except Exception as exc:  # noqa: BLE001 - one op's failure is a line in the table
        return Row(name, failures=[f"{type(exc).__name__}: {exc}".splitlines()[0]])


def markdown(rows: list[Row], seconds: float) -> str:
    cells = sum(r.cells for r in rows)
    agree = sum(r.agree for r in rows)
    flagged = sum(r.flagged for r in rows)
    lines = [
        "# Odd ops against the dispatcher and the eager model's hooks",
        "",
        (
            f"{len(rows)} ops nobody tuned ampgraph for, each in a leaf module of its own inside a "
            "small model: the op on the input cast to the parameters' dtype "
            "(`x.to(self.fc.weight.dtype)`, a dtype read while tracing), then a Linear, then the "
            "op on the Linear's output. Each is analysed on cuda and cpu with bf16 and fp16 "
            "autocast in the seed's four settings: 16 cells. A cell *agrees* when `ampgraph "
            "check` finds 0 disagreements and nothing unanalysed, and `ampgraph table`'s hook "
            "lines equal the eager model's own forward hooks on fake tensors running the real "
            "autocast kernels. *raises* counts the cells where the eager model raises (the `half` "
            "setting's Linear fed fp32, a CPU kernel with no 16-bit version), which the "
            "prediction must show at the same call."
        ),
        "",
        (
            "*Flagged* cells would be inexact and say so: the check counts a disagreement where "
            "a graph traced again after a raise parts from the setting's own trace. In `half`, "
            "where the forward raises while traced, the trace goes on past the raise in the "
            "setting's own dtypes, so `x.to(self.fc.weight.dtype)` holds the 16-bit dtype as in "
            "a real run. A cell neither agreeing nor flagged would be a wrong report that passes "
            "`check`; the script fails on it."
        ),
        "",
        (
            f"Produced by `scripts/ops_matrix.py` with torch {torch.__version__}, Python "
            f"{platform.python_version()}, on 2 CPU cores and no GPU: {agree} of {cells} cells "
            f"agree, {flagged} are flagged by the check, {cells - agree - flagged} are wrong "
            f"without it; total {seconds:.0f} s wall."
        ),
        "",
        "| op | cells agreeing | flagged | raises | nodes compared |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r.name}` | {r.agree}/{r.cells} | {r.flagged} | {r.raised} | {r.compared:,} |"
        )
    notes = [f"* `{r.name}` {f}" for r in rows for f in (*r.notes, *r.failures)]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--op", action="append", choices=sorted(OPS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ops-matrix.md")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    names = args.op or list(OPS)
    start = time.perf_counter()
    if args.jobs > 1:
        with mp.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(_run_safely, names, chunksize=1)
    else:
        rows = [_run_safely(n) for n in names]
    text = markdown(rows, time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 1 if any(r.failures or r.agree + r.flagged != r.cells for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
