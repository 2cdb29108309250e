"""One capture for several settings: a shared graph annotates exactly as a fresh capture would.

Every test compares :func:`ampgraph.pipeline.stages.analyze_group` (which shares a graph wherever
:mod:`ampgraph.capture.reads` proves it is the one a capture in the setting would give) with a fresh
capture in each setting, node for node. The modules below read their setting in each way a model
can: a dtype read (eager attention's ``.to(q.dtype)``), a cast fixed from another tensor
(``x.to(y)``), a cast that is a no-op in one setting only (``type_as``), an autocast region whose
dtype comes from the autocast state, an autocast query, a Python-level torch function that reads
dtypes inside (``F.multi_head_attention_forward``), and a layout that depends on the dtype (fake
CUDA attention picks its kernel by dtype). ``scripts/reuse_matrix.py`` runs the same comparison on
every bundled model (docs/graph-reuse.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampgraph import Setting
from ampgraph.capture.reads import annotation_difference
from ampgraph.pipeline.stages import analyze, analyze_group, plan_jobs
from tests.conftest import model, report

SEED = ("fp32", "half", "amp-half", "amp-fp32")


def settings(device: str = "cuda", amp: str = "bf16") -> list[Setting]:
    return [Setting.parse(n, device_type=device, amp_dtype=amp) for n in SEED]


def compare(module: nn.Module, args: tuple, device: str = "cuda", amp: str = "bf16") -> dict:
    """Shared against fresh in the four settings; returns {setting: report.capture}."""
    shared = analyze_group(module, settings(device, amp), args=args)
    out = {}
    for setting, rep in zip(settings(device, amp), shared):
        fresh = analyze(module, setting, args=args)
        assert annotation_difference(rep, fresh) is None, (setting.name, rep.capture)
        assert rep.check is not None and rep.check["disagreements"] == 0
        out[setting.name] = rep.capture
    return out


class Linear2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)


class EagerAttention(Linear2):
    """transformers' eager attention: fp32 softmax, then back to the query's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.a(x)
        w = torch.softmax(q @ q.transpose(-1, -2), dim=-1, dtype=torch.float32).to(q.dtype)
        return self.b(w @ x)


class CastLike(Linear2):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(x.to(y)) + y


class TypeAs(Linear2):
    """``type_as`` returns ``x`` itself where the dtypes already match (fp32), a new value where
    they do not (amp-fp32): later uses of ``x`` refer to another node."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        z = x.type_as(y)
        return self.b(x) + z


class DefaultDtypeRegion(Linear2):
    """A region that enables autocast without a dtype takes the autocast state's: fp16 by default
    on CUDA, bf16 under ``amp-fp32 --amp-dtype bf16``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda"):
            y = self.a(x)
        return self.b(y.float())


class DisabledRegion(Linear2):
    """Llama's rotary embedding: a region that disables autocast; its dtype is never used."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", enabled=False):
            y = self.a(x.float())
        return self.b(y)


class AskAutocast(Linear2):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if torch.is_autocast_enabled("cuda"):
            y = y.float()
        return self.b(y)


class Attention(nn.Module):
    """nn.MultiheadAttention: F.multi_head_attention_forward reads dtypes in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(4, 4, device=x.device)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class LayoutByDtype(nn.Module):
    """Fake CUDA SDPA picks a kernel by dtype, and with it its output's strides; ``contiguous()``
    returns its input where that is contiguous already."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        flat = out.contiguous()
        return flat.sum() + out.sum()


X = (torch.randn(1, 4, 8),)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_a_graph_that_reads_nothing_is_shared(amp: str) -> None:
    captures = compare(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8)), X, amp=amp)
    assert captures["amp-fp32"]["graph_of"] == "fp32"
    assert "graph_of" not in captures["fp32"]
    # half raises (fp32 input, 16-bit weights) and is traced on past the raise in its own
    # dtypes (issue 25): that graph serves only half, so amp-half is captured itself.
    assert captures["half"]["method"] == "make-fx"
    assert "graph_of" not in captures["amp-half"]
    half_input = (X[0].to(torch.bfloat16 if amp == "bf16" else torch.float16),)
    captures = compare(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), half_input, amp=amp)
    assert captures["amp-half"]["graph_of"] == "half"


@pytest.mark.parametrize(
    ("module", "refusal"),
    [
        (EagerAttention(), "dtype at linear read float32 when traced; it is bfloat16 in amp-fp32"),
        (CastLike(), "to() at linear read float32 when traced; it is bfloat16 in amp-fp32"),
        (TypeAs(), "type_as() at linear read float32 when traced; it is bfloat16 in amp-fp32"),
        (
            DefaultDtypeRegion(),
            (
                "torch.get_autocast_dtype() returned torch.float16 when traced; "
                "torch.bfloat16 in amp-fp32"
            ),
        ),
        (AskAutocast(), "torch.is_autocast_enabled() returned False when traced; True in amp-fp32"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_a_setting_read_that_differs_refuses_the_graph(module: nn.Module, refusal: str) -> None:
    captures = compare(module, X)
    assert "graph_of" not in captures["amp-fp32"]
    assert captures["amp-fp32"]["not_shared"] == f"fp32's graph: {refusal}"


def test_a_region_that_disables_autocast_does_not_refuse() -> None:
    captures = compare(DisabledRegion(), X)
    assert captures["amp-fp32"]["graph_of"] == "fp32"


def widen(x: torch.Tensor) -> torch.Tensor:
    """A torch function written in Python, as torch.nn.functional's are: it reads a dtype
    inside, after dispatching on torch functions itself."""
    if torch.overrides.has_torch_function_unary(x):
        return torch.overrides.handle_torch_function(widen, (x,), x)
    return x.double() if x.dtype == torch.bfloat16 else x


class Widen(Linear2):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return widen(self.a(x)).sum()


def test_reads_inside_python_level_torch_functions_are_seen() -> None:
    captures = compare(Widen(), X)
    assert captures["amp-fp32"]["not_shared"] == (
        "fp32's graph: dtype at linear read float32 when traced; it is bfloat16 in amp-fp32"
    )


def test_multi_head_attention_annotates_as_fresh() -> None:
    compare(Attention(), X)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_layouts_that_depend_on_the_dtype_are_compared(amp: str) -> None:
    compare(LayoutByDtype(), X, amp=amp)  # equal to fresh, whether shared or refused


def test_cpu_settings_share_too() -> None:
    captures = compare(EagerAttention(), X, device="cpu")
    assert "graph_of" not in captures["amp-fp32"]
    captures = compare(nn.Sequential(nn.Linear(8, 8)), (X[0].to(torch.bfloat16),), device="cpu")
    assert captures["amp-half"]["graph_of"] == "half"


def test_the_reads_log_leaves_the_graph_as_it_was() -> None:
    """Logging reads must not change what torch.export records."""
    from ampgraph.capture import engines as C
    from ampgraph.capture.reads import TraceReads

    inputs = model("llama-tiny")
    setting = Setting.parse("amp-fp32")
    plain = C._export(inputs, "cuda", torch.float32, setting)
    logged = C._export(inputs, "cuda", torch.float32, setting, TraceReads())
    assert plain.graph_module.code == logged.graph_module.code


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_llama_tiny_shares_two_graphs_and_annotates_as_fresh(amp: str) -> None:
    shared = analyze_group(model("llama-tiny"), settings("cuda", amp))
    assert [r.capture.get("graph_of") for r in shared] == [None, None, "half", "fp32"]
    for name, rep in zip(SEED, shared):
        assert annotation_difference(rep, report("llama-tiny", name, "cuda", amp)) is None
        assert rep.check is not None and rep.check["disagreements"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["opt-125m", "t5-small", "resnet18", "gpt2"])
def test_bundled_models_annotate_as_fresh(spec: str) -> None:
    for amp in ("bf16", "fp16"):
        shared = analyze_group(model(spec), settings("cuda", amp))
        for name, rep in zip(SEED, shared):
            fresh = report(spec, name, "cuda", amp)
            assert annotation_difference(rep, fresh) is None, (spec, amp, name)
            assert rep.check is not None and rep.check["disagreements"] == 0


def train_compare(module: nn.Module | str, args: tuple = (), **options: object) -> list[dict]:
    """A training step on a shared graph against a fresh capture's, in the four settings: the
    forward's annotation, the dispatcher's verdicts, and the whole backward section (joint graph
    records, gradients, saved tensors, its check) equal. Returns each report's capture."""
    shared = analyze_group(module, settings(), args=args, pass_="train", **options)
    for setting, rep in zip(settings(), shared):
        fresh = analyze(module, setting, args=args, pass_="train", **options)
        assert annotation_difference(rep, fresh) is None, setting.name
        assert rep.check == fresh.check, setting.name
        assert rep.backward is not None and fresh.backward is not None
        assert rep.backward.to_dict() == fresh.backward.to_dict(), setting.name
        if not rep.backward.skipped:  # (half raises: fp32 input, 16-bit weights)
            assert rep.backward.check is not None and rep.backward.check["disagreements"] == 0
    return [rep.capture for rep in shared]


@pytest.mark.parametrize("inside", [False, True], ids=["outside", "backward_autocast"])
def test_a_training_step_on_a_shared_graph_is_the_fresh_captures(inside: bool) -> None:
    captures = train_compare(model("llama-tiny"), backward_autocast=inside)
    assert [c.get("graph_of") for c in captures] == [None, None, "half", "fp32"]


def test_a_training_step_is_refused_a_graph_whose_reads_differ() -> None:
    captures = train_compare(EagerAttention(), X)
    assert "graph_of" not in captures[3]
    assert captures[3]["not_shared"].startswith("fp32's graph: dtype at linear read float32")


def test_jobs_group_settings_that_may_share_and_split_for_idle_cores() -> None:
    eight = settings("cuda", "bf16") + settings("cuda", "fp16")
    assert plan_jobs(eight, 2) == [[0, 3, 4, 7], [1, 2], [5, 6]]
    assert plan_jobs(eight, 1) == [[0, 3, 4, 7], [1, 2], [5, 6]]
    assert sorted(i for job in plan_jobs(eight, 8) for i in job) == list(range(8))
    assert len(plan_jobs(eight, 8)) == 8
