"""What if an op were on another autocast list (``ampgraph diff --move-op``): the moved tables,
the dispatcher kernels registered for the preview, and exact counts on small modules and OPT."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph import policy as P
from ampgraph.cli import main
from ampgraph.errors import AmpgraphError
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze
from ampgraph.report.records import Report
from ampgraph.review.diff import diff_reports
from ampgraph.review.whatif import findings_note, moved_kernels, parse_moves, preview_moves

from .conftest import report as analysed_report

#: The cuda settings trace fake CUDA tensors (DESIGN.md fact 4): a CUDA build of torch.
needs_cuda_build = pytest.mark.skipif(
    not torch.backends.cuda.is_built(), reason="a CPU-only build of torch"
)


class Block(nn.Module):
    """A Linear whose bf16 output meets softmax, LayerNorm, a matmul with an fp32 parameter
    and gelu: one op of each kind a move changes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)
        self.proj = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        s = torch.softmax(h, -1)
        n = self.ln(h)
        m = torch.matmul(h, self.proj)
        return s + n + nn.functional.gelu(m)


def block() -> ModelInputs:
    return ModelInputs("block", Block(), (torch.randn(2, 8),), {})


def by_op(report: Report) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in report.nodes:
        out.setdefault(n.op, []).append(n)
    return out


def _listed(name: str) -> list[str]:
    """The overloads of ``aten::name`` CUDA's lists name in the installed release, as moves
    print them (softmax: ``int``, and ``Dimname`` too on torch 2.9)."""
    names = getattr(torch.ops.aten, name).overloads()
    listed = [o for o in names if P.lookup("cuda", f"aten::{name}", o) is not None]
    return [name if o == "default" else f"{name}.{o}" for o in listed]


def test_parse_moves_resolves_overloads_from_the_lists() -> None:
    moves = parse_moves(["softmax=lower_precision_fp", "gelu=fp32", "sum=none"], "cuda")
    # softmax and sum without an overload: the overloads CUDA's lists name; gelu: its default.
    assert [str(m) for m in moves] == [
        *(f"{o} → lower_precision_fp" for o in _listed("softmax")),
        "gelu → fp32",
        *(f"{o} → none" for o in _listed("sum")),
    ]
    assert {"softmax.int"} <= set(_listed("softmax")) and {"sum", "sum.dim_IntList"} <= set(
        _listed("sum")
    )
    assert moves[0].op is torch.ops.aten.softmax.int
    for text, message in [
        ("softmax", "a move is OP=LIST"),
        ("softmax=fp33", "'fp33' is no list a preview can move an op to"),
        ("nothing=fp32", "torch has no op aten::nothing"),
        ("softmax.foo=fp32", "aten::softmax has no overload 'foo'"),
        ("gelu=fp32_set_opt_dtype", "takes no dtype argument"),
        ("add=fp32", "name one of aten::add's overloads"),
    ]:
        with pytest.raises(AmpgraphError, match=message):
            parse_moves([text], "cuda")


def test_moved_tables_decide_what_they_took_off_every_list() -> None:
    tables = P.moved(P.TABLES, "cuda", {"layer_norm": "none", "gelu": P.FP32})
    with P.tables_in_use(tables, P.ACTIVE_RELEASE):
        assert P.lookup("cuda", "aten::layer_norm", "") is None
        assert P.decided("cuda", "aten::layer_norm", "")  # no policy, not an unknown kernel
        assert P.lookup("cuda", "aten::gelu", "") == P.FP32
        assert P.lookup("cpu", "aten::layer_norm", "") is None
        assert not P.decided("cpu", "aten::layer_norm", "")  # CPU's lists never named it
    assert P.lookup("cuda", "aten::layer_norm", "") == P.FP32
    assert not P.decided("cuda", "aten::gelu", "")


def test_moved_kernels_last_only_as_long_as_the_preview() -> None:
    [move] = parse_moves(["gelu=fp32"], "cpu")
    x = torch.ones(2, dtype=torch.bfloat16)
    assert not P.has_autocast_kernel("cpu", "aten::gelu")
    with moved_kernels([move], "cpu"):
        assert P.has_autocast_kernel("cpu", "aten::gelu")
        with torch.autocast("cpu"):
            assert nn.functional.gelu(x).dtype == torch.float32
    assert not P.has_autocast_kernel("cpu", "aten::gelu")  # the remembered answer is forgotten
    with torch.autocast("cpu"):
        assert nn.functional.gelu(x).dtype == torch.bfloat16
    # The analysis after the preview is the analysis before it: gelu has no policy, not an
    # opaque kernel, and the dispatcher agrees.
    r = analyze(Block(), "autocast=on,device=cpu", args=(torch.randn(2, 8),))
    gelu = by_op(r)["aten.gelu.default"][0]
    assert gelu.policy is None and gelu.not_analysed is None
    assert r.check is not None and r.check["disagreements"] == 0


@needs_cuda_build
def test_softmax_onto_the_lower_precision_list() -> None:
    a, b = preview_moves(block(), "amp-fp32", ["softmax=lower_precision_fp"])
    moved = (f"{o} → lower_precision_fp" for o in _listed("softmax"))
    assert b.model == f"block [{', '.join(moved)}]"
    assert b.check is not None and b.check["disagreements"] == 0
    sa, sb = by_op(a)["aten.softmax.int"][0], by_op(b)["aten.softmax.int"][0]
    assert (sa.policy, sa.outputs, sa.casts) == ("fp32_set_opt_dtype", ["float32"], [])
    assert (sb.policy, sb.outputs, sb.casts) == ("lower_precision_fp", ["bfloat16"], [])
    d = diff_reports(a, b)
    # softmax, and the add that now meets bf16 + fp32 + ... where it met fp32.
    assert [(c.op, [f.field for f in c.fields]) for c in d.changes] == [
        ("aten.softmax.int", ["policy", "outputs"]),
        ("aten.add.Tensor", ["inputs", "promotion"]),
    ]
    # ... and the audit now flags softmax as a sensitive op running in 16 bits.
    assert findings_note(a, b) == "audit findings: promotion 1 → 2, sensitive-16bit 0 → 1"


@needs_cuda_build
def test_matmul_to_promote_and_gelu_to_fp32() -> None:
    a, b = preview_moves(block(), "amp-fp32", ["matmul=promote", "gelu=fp32"])
    assert b.check is not None and b.check["disagreements"] == 0
    mm = by_op(b)["aten.matmul.default"][0]
    # promote: the widest of bf16 (fc's output) and fp32 (the parameter) is fp32.
    assert mm.policy == "promote" and mm.outputs == ["float32"]
    assert [(c.from_dtype, c.to_dtype) for c in mm.casts] == [("bfloat16", "float32")]
    gelu = by_op(b)["aten.gelu.default"][0]
    assert (gelu.policy, gelu.casts, gelu.outputs) == ("fp32", [], ["float32"])
    d = diff_reports(a, b)
    assert d.counts()["changed"] == 3 and d.counts()["casts_added"] == 1
    assert d.counts()["casts_removed"] == 1  # matmul no longer casts the parameter to bf16


@needs_cuda_build
def test_layer_norm_off_every_list_meets_its_fp32_weight() -> None:
    # layer_norm alone: it decomposes to native_layer_norm, which autocast still runs in fp32;
    # the one change is who casts the bf16 activation to fp32.
    a, b = preview_moves(block(), "amp-fp32", ["layer_norm=none"])
    assert b.check["disagreements"] == 0
    [change] = diff_reports(a, b).changes
    assert [f.field for f in change.fields] == ["casts"] and change.op == "aten.layer_norm.default"
    assert change.casts_added == ("(native_layer_norm input) bf16→fp32",)
    assert change.casts_removed == ("linear bf16→fp32",)
    # Both off: the bf16 activation meets LayerNorm's fp32 weight, and torch refuses it, in
    # the annotation as in the dispatcher.
    a, b = preview_moves(block(), "amp-fp32", ["layer_norm=none", "native_layer_norm=none"])
    ln = by_op(b)["aten.layer_norm.default"][0]
    assert ln.policy is None and ln.error == "expected scalar type BFloat16 but found Float"
    assert b.check["disagreements"] == 0
    # The add after it no longer runs, so no longer promotes.
    assert findings_note(a, b) == (
        "audit findings: autocast-cast 3 → 2, promotion 1 → 0, dtype-error 0 → 1"
    )


@pytest.mark.slow
@needs_cuda_build
def test_opt_layer_norms_off_every_list_in_amp_half() -> None:
    a, b = preview_moves("opt-125m", "amp-half", ["layer_norm=none", "native_layer_norm=none"])
    assert b.check is not None and b.check["disagreements"] == 0
    counts = diff_reports(a, b).counts()
    # 25 LayerNorms lose their policy and their three casts to fp32 (input, weight, bias: 75);
    # the 49 16-bit ops after them no longer cast their fp32 input back to bf16.
    assert {k: counts[k] for k in ("changed", "added", "removed", "policy", "outputs")} == {
        "changed": 75, "added": 0, "removed": 0, "policy": 25, "outputs": 26,
    }  # fmt: skip
    assert (counts["casts_added"], counts["casts_removed"]) == (0, 124)
    assert Counter(n.policy for n in b.nodes if n.op == "aten.layer_norm.default") == {None: 25}
    assert findings_note(a, b) == "audit findings: autocast-cast 74 → 0, sensitive-16bit 0 → 25"


@needs_cuda_build
def test_cli_move_op() -> None:
    result = CliRunner().invoke(main, ["diff", "llama-tiny", "--move-op", "silu=fp32"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == "B: llama-tiny [silu → fp32] amp-fp32 (autocast cuda bf16, parameters fp32)"
    nodes = len(
        analysed_report("llama-tiny", "amp-fp32").nodes
    )  # transformers' graph, as it is installed
    assert lines[2] == (
        f"{nodes} → {nodes} graph nodes: 6 changed, 0 added, 0 removed; 2 policies, 4 input dtypes, "
        "4 output dtypes, 2 promotions, casts +4 −0"
    )
    assert "note: audit findings: autocast-cast 17 → 19, promotion 12 → 14" in lines
    assert any(line.startswith("note: B checked against the dispatcher: ") and "all agree" in line
               for line in lines)  # fmt: skip
    assert (
        "  ~ silu … silu_1 aten.silu.default: policy none → fp32; casts added linear_4 "
        "bf16→fp32; outputs bf16 → fp32"
    ) in lines
    for args, message in [
        (["--move-op", "softmax"], "Error: 'softmax': a move is OP=LIST"),
        (["-s", "fp32", "--move-op", "silu=fp32"], "fp32 has no autocast whose lists to change"),
        (["a.json", "b.json", "--move-op", "silu=fp32"], "compares one model in one setting"),
    ]:
        failed = CliRunner().invoke(main, ["diff", *args])
        assert failed.exit_code in (1, 2) and message in failed.output, failed.output
        assert "Traceback" not in failed.output
