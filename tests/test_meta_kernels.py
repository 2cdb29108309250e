"""Issue 25, further families: forwards that ask the GPU what it is, and meta kernels stricter than
their real kernels (``ampgraph.capture.meta_kernels``, ``ampgraph.torchutil.simulated_cuda_amp``).

Expectations are the real CPU kernel (which shares ``_grouped_mm``'s dtype rule with the CUDA one)
and the eager model's own forward hooks on fake tensors, never ampgraph's output.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph.capture import meta_kernels
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import VIRTUAL_GPU_CAPABILITY, fake_mode, simulated_cuda_amp

from .test_fidelity import _agree

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _grouped(a_dtype: torch.dtype, b_dtype: torch.dtype, device: str) -> torch.Tensor | str:
    """``_grouped_mm`` of a 2D by 3D pair (the MoE layout) on ``device``: its output or error."""
    a = torch.randn(8, 16).to(a_dtype)
    b = torch.randn(4, 16, 32).to(b_dtype)
    offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
    try:
        return torch._grouped_mm(a.to(device), b.to(device), offs=offs.to(device))
    except RuntimeError as exc:
        return str(exc).splitlines()[0]


@pytest.mark.parametrize("a_dtype,b_dtype", list(itertools.product(DTYPES, DTYPES)))
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fake_grouped_mm_types_as_the_real_kernel(
    a_dtype: torch.dtype, b_dtype: torch.dtype, device: str
) -> None:
    real = _grouped(a_dtype, b_dtype, "cpu")
    with fake_mode():
        fake = _grouped(a_dtype, b_dtype, device)
    if isinstance(real, str):
        assert fake == real
    else:
        assert isinstance(fake, torch.Tensor), fake
        assert (fake.dtype, fake.shape) == (real.dtype, real.shape)


@pytest.mark.parametrize("width", [3, 4, 6, 8, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fake_grouped_mm_counts_strides_in_the_operands_own_bytes(
    width: int, dtype: torch.dtype, device: str
) -> None:
    """The 16-byte rule on an expert's input row (transformers' tiny MoE widths): an fp32 row of
    12 is 48 bytes and runs for real; checked on bf16 stand-ins it was refused, and every MoE
    type of the zoo lost its graph once the capture took ``F.grouped_mm`` as a real run does."""
    a = torch.randn(6, width).to(dtype)
    b = torch.randn(2, width, 8).to(dtype).transpose(-1, -2).contiguous().transpose(-1, -2)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    try:
        real: torch.Tensor | None = torch._grouped_mm(a, b, offs=offs)
    except RuntimeError:
        real = None
    with fake_mode():  # made fake on the device (torch 2.9 without a driver cannot move to it)
        fa = torch.empty(6, width, dtype=dtype, device=device)
        fb = torch.empty(2, 8, width, dtype=dtype, device=device).transpose(-1, -2)
        assert fb.stride() == b.stride()
        try:
            fake: torch.Tensor | None = torch._grouped_mm(
                fa, fb, offs=torch.empty(2, dtype=torch.int32, device=device)
            )
        except RuntimeError:
            fake = None
    assert (real is None) == (fake is None)
    if real is not None and fake is not None:
        assert (fake.dtype, fake.shape) == (real.dtype, real.shape)


def test_the_replacement_is_registered_for_every_op_it_lists() -> None:
    for name in meta_kernels.REPLACED:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta")


class ByCapability(nn.Module):
    """Experts that take ``F.grouped_mm`` on a GPU of compute capability 8.0 or newer and a loop
    of matmuls elsewhere, as transformers' MoE experts do; autocast has no rule for either."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(16, 4)
        self.experts = nn.Parameter(torch.randn(4, 16, 32))
        self.act = nn.SiLU()
        self.out = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32, device=x.device)
        w = self.experts
        if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) >= (8, 0):
            # F.grouped_mm from torch 2.10 on; 2.9 has the op only (transformers takes either).
            grouped_mm = getattr(F, "grouped_mm", torch._grouped_mm)
            h = grouped_mm(x.to(w.dtype), w, offs=offs)
        else:
            h = torch.cat([x[2 * i : 2 * i + 2].to(w.dtype) @ w[i] for i in range(4)])
        return self.out(self.act(h)) + logits.sum()


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_forward_that_asks_the_gpu_its_capability(name: str, dtype: str) -> None:
    model = ModelInputs("by-capability", ByCapability().eval(), (torch.randn(8, 16),))
    setting = Setting.parse(name, amp_dtype=dtype)
    lines = _agree(model, setting)
    if name != "half":  # half raises at the router: fp32 input, 16-bit weight
        assert any(line.startswith("[act]") for line in lines)


class Grouped(nn.Module):
    """transformers' grouped experts (``integrations/moe.py``, ``_grouped_mm``): the tokens cast
    to the experts' weight dtype, then ``F.grouped_mm``, which autocast has no rule for."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.Parameter(torch.randn(4, 16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32, device=x.device)
        return F.grouped_mm(x.to(self.experts.dtype), self.experts, offs=offs)


@pytest.mark.skipif(not hasattr(F, "grouped_mm"), reason="F.grouped_mm is torch 2.10's")
@pytest.mark.parametrize(("name", "want"), [("amp-fp32", "float32"), ("amp-half", "bfloat16"),
                                            ("half", "bfloat16")])  # fmt: skip
@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_grouped_experts_run_in_their_weights_dtype(device_type: str, name: str, want: str) -> None:
    """No autocast kernel on either device: under ``amp-fp32`` the experts' matmuls run in fp32
    (autocast makes none of them 16-bit), in ``amp-half`` and ``half`` in the weights' bf16;
    the dispatcher (CUDA) or the real CPU kernels agree."""
    from ampgraph import analyze
    from ampgraph.verify import verify

    key = "AutocastCUDA" if device_type == "cuda" else "AutocastCPU"
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_grouped_mm", key)
    setting = Setting.parse(name, device_type=device_type, amp_dtype="bfloat16")
    model = ModelInputs("grouped", Grouped().eval(), (torch.randn(8, 16),))
    report = analyze(model, setting)
    (node,) = [r for r in report.nodes if r.op == "aten._grouped_mm.default"]
    assert (node.policy, node.outputs) == (None, [want])
    if device_type == "cuda":
        assert report.check is not None and report.check["disagreements"] == 0
    else:
        assert verify(model, setting, device="cpu").ok


def test_the_virtual_gpu_is_a_bf16_capable_one_only_while_tracing() -> None:
    with simulated_cuda_amp("cuda"):
        assert torch.cuda.get_device_capability() == VIRTUAL_GPU_CAPABILITY >= (8, 0)
        assert torch.cuda.get_device_properties(0).major == VIRTUAL_GPU_CAPABILITY[0]
    if not torch.cuda.is_available():  # outside, the query reaches the (absent) driver again
        with pytest.raises((RuntimeError, AssertionError)):
            torch.cuda.get_device_capability()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_jamba_hybrid_moe_and_mamba(name: str, dtype: str) -> None:
    """transformers' Jamba (Mamba layers and MoE experts): its experts ask the GPU's capability
    and, in bf16, run ``_grouped_mm``."""
    transformers = pytest.importorskip("transformers")
    config = transformers.JambaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
    )  # fmt: skip
    torch.manual_seed(0)
    module = transformers.JambaForCausalLM(config).eval()
    model = ModelInputs("jamba", module, kwargs={"input_ids": torch.randint(0, 128, (1, 8))})
    _agree(model, Setting.parse(name, amp_dtype=dtype))


#: Ops whose reference (the Python decomposition fake tensors ran) types otherwise than the real
#: kernels, which share the rule on every device (``addr``'s ``build_addr_iter``, the losses'
#: ``Loss.cpp``): the call on two floating dtypes.
RETYPED = {
    "addr_scalar_self": lambda a, b, dev: torch.addr(
        torch.randn((), dtype=a).to(dev), torch.randn(3, dtype=b).to(dev),
        torch.randn(2, dtype=b).to(dev),
    ),
    "addr_vector_self": lambda a, b, dev: torch.addr(
        torch.randn(2, dtype=a).to(dev), torch.randn(3, dtype=b).to(dev),
        torch.randn(2, dtype=a).to(dev),
    ),
    "huber_loss": lambda a, b, dev: F.huber_loss(
        torch.randn(4, 3, dtype=a).to(dev), torch.randn(4, 3, dtype=b).to(dev), reduction="none"
    ),
    "huber_loss_mean": lambda a, b, dev: F.huber_loss(
        torch.randn(4, dtype=a).to(dev), torch.randn(4, dtype=b).to(dev)
    ),
    "soft_margin_loss": lambda a, b, dev: F.soft_margin_loss(
        torch.randn(4, 3, dtype=a).to(dev), torch.randn(4, 3, dtype=b).to(dev), reduction="none"
    ),
    "soft_margin_loss_sum": lambda a, b, dev: F.soft_margin_loss(
        torch.randn((), dtype=a).to(dev), torch.randn((), dtype=b).to(dev), reduction="sum"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RETYPED))
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fake_retyped_ops_type_as_the_real_kernel(case: str, device: str) -> None:
    """Every pair of floating dtypes: the fake output's dtype and shape are the real CPU
    kernel's (fake CUDA too: the rule is device-generic code)."""
    for a, b in itertools.product(DTYPES[:3], repeat=2):
        real = RETYPED[case](a, b, "cpu")
        with fake_mode():
            fake = RETYPED[case](a, b, device)
        assert (fake.dtype, fake.shape) == (real.dtype, real.shape), (a, b)


#: The backward kernels a training step's joint trace replays: gradient dtype ``a``, the saved
#: input (and target) dtype ``b``.
RETYPED_BACKWARD = {
    "threshold_backward": lambda a, b, dev: torch.ops.aten.threshold_backward(
        torch.randn(4, dtype=a).to(dev), torch.randn(4, dtype=b).to(dev), 0.0
    ),
    "mse_loss_backward": lambda a, b, dev: torch.ops.aten.mse_loss_backward(
        torch.randn((), dtype=a).to(dev), torch.randn(4, dtype=b).to(dev),
        torch.randn(4, dtype=a).to(dev), 1,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RETYPED_BACKWARD))
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fake_retyped_backwards_type_as_the_real_kernel(case: str, device: str) -> None:
    """The dtype and shape, or the error where the real kernel refuses the pair (torch 2.10 and
    2.11's ``mse_loss_backward`` takes no mixed dtypes; 2.12's does)."""

    def outcome(a: torch.dtype, b: torch.dtype, dev: str) -> object:
        try:
            out = RETYPED_BACKWARD[case](a, b, dev)
        except RuntimeError as exc:
            return str(exc).splitlines()[0]
        return out.dtype, out.shape

    for a, b in itertools.product(DTYPES[:3], repeat=2):
        real = outcome(a, b, "cpu")
        with fake_mode():
            fake = outcome(a, b, device)
        assert fake == real, (a, b)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fake_layer_norm_backward_gives_each_gradient_its_tensors_dtype(device: str) -> None:
    """``native_layer_norm_backward``: the input's gradient in the input's dtype, the weight's and
    bias's in theirs, as the real kernel gives them (torch 2.9's meta kernel gave all three the
    input's: ``compat.layer_norm_backward_meta_is_right``)."""

    def grads(a: torch.dtype, b: torch.dtype, dev: str) -> list[tuple[torch.dtype, torch.Size]]:
        x, g = torch.randn(4, 8, dtype=a).to(dev), torch.randn(4, 8, dtype=a).to(dev)
        w, bias = torch.randn(8, dtype=b).to(dev), torch.randn(8, dtype=b).to(dev)
        mean, rstd = torch.zeros(4, 1).to(dev), torch.ones(4, 1).to(dev)
        out = torch.ops.aten.native_layer_norm_backward(
            g, x, [8], mean, rstd, w, bias, [True, True, True]
        )
        return [(t.dtype, t.shape) for t in out]

    ran = 0
    for a, b in itertools.product(DTYPES[:3], repeat=2):
        try:
            real = grads(a, b, "cpu")
        except RuntimeError:  # a pair (with these fp32 statistics) the real kernel refuses
            continue
        with fake_mode():
            fake = grads(a, b, device)
        assert fake == real, (a, b)
        ran += 1
    assert ran == 3  # fp32 parameters with an fp32, bf16 or fp16 input (the mixed LayerNorm)
