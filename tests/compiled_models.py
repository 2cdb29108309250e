"""Small models for the compiled-flow tests (specs ``tests.compiled_models:NAME``)."""

from __future__ import annotations

import torch
from torch import nn


class GeluChain(nn.Module):
    """DESIGN.md fact 22: a Linear, then ``gelu(y) * 1.7 + y``: one fused pointwise chain."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.f(x)
        return nn.functional.gelu(y) * 1.7 + y


class MatmulSoftmax(nn.Module):
    """Extern kernels (two matmuls) around one pointwise op and a reduction (softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.b(torch.relu(self.a(x))), dim=-1)


def gelu_chain() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return GeluChain().eval(), torch.randn(32, 64)


def matmul_softmax() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MatmulSoftmax().eval(), torch.randn(32, 64)


class MoeShaped(nn.Module):
    """The expert dispatch and rotary halves of a Mixtral layer, small: a bf16 router (a Linear
    under autocast) read by an fp32 softmax, top-2 gates scattered over 4 experts, and the
    rotation ``cat((-h2, h1))`` of a 16-bit projection, which Inductor computes straight into
    its slices of the concatenation's buffer."""

    def __init__(self, width: int = 32, experts: int = 4) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.q(x)
        half = h.shape[-1] // 2
        rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float)
        weights, chosen = probs.topk(2, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, chosen, weights / weights.sum(-1, keepdim=True))
        mixed = sum(gates[:, e : e + 1] * expert(rotated) for e, expert in enumerate(self.experts))
        return mixed + x


def moe_shaped() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MoeShaped().eval(), torch.randn(16, 32)


class Fp32Region(nn.Module):
    """A Linear under autocast, then one with autocast turned off inside the forward (an fp32
    region, as in a loss head or a router): its backward's matmuls are fp32 in eager's AMP recipe
    (``backward()`` outside the context) and 16-bit where the backward is traced in the forward's
    autocast (``backward_pass_autocast="same_as_forward"``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        with torch.autocast("cpu", enabled=False):
            return self.b(h.float())


def fp32_region() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Fp32Region(), torch.randn(32, 64)


class ScaledSoftmax(nn.Module):
    """A Linear under autocast (a bf16 output), then ``softmax(y * 1.5)``: Inductor's pattern
    matcher folds the scale into the softmax (``_softmax``'s replacement in its joint-graph
    passes), so the multiply has no lowered value of its own; eager rounds it to bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.f(x) * 1.5, dim=-1)


def scaled_softmax() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return ScaledSoftmax().eval(), torch.randn(32, 64)


class GeluScaledSoftmax(nn.Module):
    """``softmax(gelu(y) * 1.5)``: one kernel drops two bf16 roundings, the gelu's (a node that
    ``emulate_precision_casts`` rounds) and the multiply's (folded into the softmax by the
    pattern replacement of :class:`ScaledSoftmax`, which emulation cannot round)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(nn.functional.gelu(self.f(x)) * 1.5, dim=-1)


def gelu_scaled_softmax() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return GeluScaledSoftmax().eval(), torch.randn(32, 64)
