"""Issue 25, mechanism 3: a leaf module's input attributed to the wrong graph node (an MoE
expert's ``act_fn`` printed the routing indices' ``int64``), and the check that passed it.

Export's passes renumber the nodes they copy, so a trace-time name can be another node of the
final graph; the module view now follows the value each node recorded, and the check compares
every hook line with what the hooks saw while tracing in the setting. Every expectation is the
eager model's own forward hooks on fake tensors (:func:`ampgraph.verify.hooks.eager_hook_lines`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.capture.module_io import ModuleIORecorder
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = [
    (n, d) for n in ("fp32", "half", "amp-half", "amp-fp32") for d in ("bfloat16", "float16")
]


class Routed(nn.Module):
    """Top-k routing to experts, after a no-grad, autocast-off region whose multi-output ops
    export's region passes copy and rename: ``act``'s input is a ``chunk`` item whose trace-time
    name is, in the final graph, the routing's ``sort`` indices."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4, bias=False)
        self.w = nn.Parameter(torch.randn(4, 16, 8))
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            a, b = x.float().sum(0).chunk(2)
            c, d = a.chunk(2)
        vals, idx = self.router(x).float().softmax(-1).topk(2)
        order, perm = idx.flatten().sort()
        h = torch.bmm(x[perm // 2].unsqueeze(1), self.w[order].transpose(1, 2)).squeeze(1)
        gate, up = h.chunk(2, -1)
        y = self.act(gate) * up * (c.sum() + d.sum() + b.sum())
        return y * vals.flatten()[perm, None]


def _routed() -> ModelInputs:
    return ModelInputs("routed", Routed().eval(), (torch.randn(6, 8),))


def _agrees(model: ModelInputs, setting: Setting) -> list[str]:
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    return lines


@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_a_routed_expert_activation_receives_the_expert_matmul(name: str, dtype: str) -> None:
    lines = _agrees(_routed(), Setting.parse(name, amp_dtype=dtype))
    assert any(line.startswith("[act] in=") for line in lines) or name == "half"


def _misattributed(self: ModuleIORecorder, gm: torch.fx.GraphModule) -> dict:  # type: ignore[type-arg]
    """The attribution before the fix: ``act``'s input named as the routing's int64 indices."""
    io = _REAL_RESOLVE(self, gm)
    indices = next(n.name for n in gm.graph.nodes if n.target == torch.ops.aten.sort.default)
    io["act"] = [(indices, out) for _, out in io["act"]]
    return io


_REAL_RESOLVE = ModuleIORecorder.resolve


@pytest.fixture
def misattributing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(ModuleIORecorder, "resolve", _misattributed)
    yield


@pytest.mark.parametrize("name", ["amp-fp32", "amp-half"])
def test_the_check_is_not_blind_to_a_module_line_the_hooks_contradict(
    name: str, misattributing: None
) -> None:
    model, setting = _routed(), Setting.parse(name)
    report = analyze(model, setting)
    wrong = next(line for line in hook_lines(report) if line.startswith("[act]"))
    assert wrong not in eager_hook_lines(model, setting)  # the eager run contradicts it
    assert report.check is not None and report.check["disagreements"] >= 1
    assert any("[act]" in d for d in report.check["module_disagreements"])
    assert any("[act]" in (r.check or {}).get("note", "") for r in report.disagreements)


def _moe(family: str, experts: str) -> ModelInputs:
    transformers = pytest.importorskip("transformers")
    shape = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_experts_per_tok": 2, "vocab_size": 128}  # fmt: skip
    if family == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=64, num_local_experts=4, **shape)
        cls = transformers.MixtralForCausalLM
    else:
        config = transformers.Qwen2MoeConfig(
            intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64,
            num_experts=4, **shape,
        )  # fmt: skip
        cls = transformers.Qwen2MoeForCausalLM
    config._experts_implementation = experts
    torch.manual_seed(0)
    ids = torch.ones(1, 5, dtype=torch.long)
    return ModelInputs(family, cls(config).eval(), (), {"input_ids": ids})


@pytest.mark.parametrize("family", ["mixtral", "qwen2-moe"])
@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_moe_families_batched_experts(family: str, name: str, dtype: str) -> None:
    lines = _agrees(_moe(family, "batched_mm"), Setting.parse(name, amp_dtype=dtype))
    assert sum("experts.act_fn]" in line for line in lines) == 2


@pytest.mark.parametrize("family", ["mixtral", "qwen2-moe"])
@pytest.mark.parametrize("name", ["half", "amp-half"])
def test_moe_families_grouped_experts_on_an_sm90_gpu(
    family: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers' default experts ask the GPU's compute capability, which no driver answers
    # here: both the capture and the eager run are told an H100's, so both take grouped_mm.
    # With bf16 weights both take the same path (others: the capture's compiling state picks
    # transformers' fallback op, the eager run grouped_mm, which is another mechanism).
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_a, **_k: (9, 0))
    lines = _agrees(_moe(family, "grouped_mm"), Setting.parse(name, amp_dtype="bfloat16"))
    assert sum("experts.act_fn]" in line for line in lines) == 2
