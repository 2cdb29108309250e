"""Autocast regions inside a forward (seed 002's fp32 wrapper) and a wrong table caught."""

from __future__ import annotations

import contextvars

import pytest
import torch
from torch import nn

from ampgraph import Setting, analyze
from ampgraph import policy as P
from ampgraph.model.build import ModelInputs


class Fp32Island(nn.Module):
    """Seed 002: a module that must run in fp32 whatever autocast says around it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # bf16 under autocast
        with torch.autocast("cuda", enabled=False):
            island = h.float().t() @ h.float()  # fp32 matmul, no cast to bf16
        return self.head(island)


class NestedDtype(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.float16):
            return x @ w


def test_autocast_disabled_region_runs_in_fp32() -> None:
    rep = analyze(Fp32Island(), Setting.parse("amp-fp32"), args=(torch.randn(4, 8),))
    (region,) = [n for n in rep.nodes if n.kind == "region"]
    assert "disabled" in region.reason
    body = [n for n in rep.nodes if n.region == region.name]
    (matmul,) = [n for n in body if n.op == "aten.matmul.default"]
    assert matmul.policy is None and matmul.casts == [] and matmul.outputs == ["float32"]
    assert not matmul.autocast
    # Outside the island autocast applies again: head casts the fp32 result to bf16.
    head = next(n for n in rep.nodes if n.op == "aten.linear.default" and n.module == "head")
    assert head.outputs == ["bfloat16"] and head.casts[0].from_dtype == "float32"
    assert rep.check["disagreements"] == 0


def test_nested_region_with_another_dtype() -> None:
    args = (torch.randn(4, 4), torch.randn(4, 4))
    rep = analyze(NestedDtype(), Setting.parse("amp-fp32"), args=args)
    (matmul,) = [n for n in rep.nodes if n.op == "aten.matmul.default"]
    assert matmul.outputs == ["float16"] and matmul.policy == P.LOWER_PRECISION_FP
    assert rep.check["disagreements"] == 0


def test_a_wrong_table_is_caught_by_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """If layer_norm's entries were missing, the dispatcher check must say so, node by node."""
    index = dict(P._IN_USE.get().index)
    del index[("cuda", "layer_norm")], index[("cuda", "native_layer_norm")]
    wrong = P._InUse(index, P.release_in_use(), next(P._KEYS))
    monkeypatch.setattr(P, "_IN_USE", contextvars.ContextVar("wrong_tables", default=wrong))
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
    rep = analyze(model, Setting.parse("amp-half"), args=(torch.randn(2, 8, dtype=torch.bfloat16),))
    (ln,) = [n for n in rep.nodes if n.op == "aten.layer_norm.default"]
    # Not predicted as if no kernel existed: ATen's kernel runs, unanalysed, and the check
    # fails on the tables that lack it.
    assert ln.policy == P.OPAQUE and ln.not_analysed and "tables" in ln.not_analysed
    assert ln.check is not None and ln.check["agree"] is False
    assert ln.check["note"] == "ampgraph's policy tables lack this op's autocast kernel"
    assert rep.check["disagreements"] >= 1


class NoGradTable(nn.Module):
    """A table computed under torch.no_grad() inside forward, as Llama's rotary embedding was
    until transformers 5.24 (which dropped the decorator): the region is the model's own."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            angles = torch.arange(x.shape[-1], device=x.device, dtype=torch.float32) * 0.5
            cos, sin = angles.cos(), angles.sin()
        return self.proj(x) * cos + sin


NO_GRAD_TABLE = ModelInputs("no-grad-table", NoGradTable(), (torch.randn(2, 8),))


def test_grad_mode_regions_are_walked_node_by_node() -> None:
    """export wraps a forward's torch.no_grad() region in wrap_with_set_grad_enabled where grad
    is on around it (a training step's forward), whose body must be annotated op by op, not as
    one opaque call."""
    rep = analyze(NO_GRAD_TABLE, Setting.parse("amp-fp32"), pass_="train")
    (grad_region,) = [n for n in rep.nodes if n.op == "higher_order.wrap_with_set_grad_enabled"]
    body = [n for n in rep.nodes if n.name.startswith(f"{grad_region.name}.")]
    assert {"aten.cos.default", "aten.sin.default"} <= {n.op for n in body}
    assert rep.check is not None and rep.check["disagreements"] == 0
    assert all(n.check is None or n.check["agree"] for n in body)
    assert not [
        n for n in rep.nodes if n.op.startswith("higher_order") and n.reason == "Python-level op"
    ]


def test_the_callers_grad_mode_does_not_change_the_graph() -> None:
    """A notebook cell under torch.no_grad() or with grad on analyses the graph the CLI does:
    the forward is traced as inference runs it (issue 42), where the model's own no_grad region
    changes nothing and is no region; a training step keeps it."""
    setting = Setting.parse("amp-fp32")
    with torch.enable_grad():
        loud = analyze(NO_GRAD_TABLE, setting)
        assert torch.is_grad_enabled()  # the caller's mode, given back
    with torch.no_grad():
        quiet = analyze(NO_GRAD_TABLE, setting)
        assert not torch.is_grad_enabled()
    assert quiet.to_dict() == loud.to_dict()
    assert not any(n.op == "higher_order.wrap_with_set_grad_enabled" for n in quiet.nodes)
    train = analyze(NO_GRAD_TABLE, setting, pass_="train")
    assert any(n.op == "higher_order.wrap_with_set_grad_enabled" for n in train.nodes)


class FailingIsland(nn.Module):
    """A bf16 Linear inside an autocast-disabled region, fed fp32: the body raises."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return self.lin(x.float())


def test_error_inside_a_region_is_reported_once_and_agrees() -> None:
    setting = Setting.parse("autocast=on,params=bf16,device=cpu")
    rep = analyze(FailingIsland(), setting, args=(torch.randn(2, 4),))
    (region,) = [n for n in rep.nodes if n.kind == "region"]
    (linear,) = [n for n in rep.nodes if n.op == "aten.linear.default"]
    assert linear.error and "same dtype" in linear.error
    assert region.skipped == linear.name and region.outputs == []
    assert rep.check["disagreements"] == 0


class Composite(nn.Module):
    """einsum has no CPU autocast kernel, but the bmm it decomposes into does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,jk->ik", x, x.t())


def test_policies_inside_composite_ops_without_their_own() -> None:
    rep = analyze(
        Composite(), Setting.parse("amp-fp32", device_type="cpu"), args=(torch.randn(4, 4),)
    )
    (einsum,) = [n for n in rep.nodes if n.op == "aten.einsum.default"]
    assert einsum.outputs == ["bfloat16"] and einsum.policy == P.LOWER_PRECISION_FP
    assert "inside it autocast applies to bmm" in einsum.reason
    assert [(c.from_dtype, c.to_dtype) for c in einsum.casts] == [("float32", "bfloat16")] * 2
    assert rep.check["disagreements"] == 0
