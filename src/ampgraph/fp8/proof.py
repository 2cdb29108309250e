"""The FP8 graph against a real CPU run: every GEMM's operand dtypes, in order.

The converted model runs for real on the CPU (torchao's ``Float8Linear``, ``torch._scaled_mm``
on ``float8_e4m3fn`` / ``float8_e5m2`` tensors) under CPU bf16 autocast, with real fp32 weights;
a dispatch mode records each matrix product the kernels ran and its operands' dtypes. The traced
graph (:func:`ampgraph.fp8.graph.trace_fp8`) must list the same products in the same order with
the same dtypes: a difference is a bug, not a tolerance.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.fp8.graph import GEMM_OPS, Fp8Graph, short, train_loss
from ampgraph.errors import SettingError
from ampgraph.fp8.recipes import MOE_NAMES, MX_NAMES, Fp8Recipe, convert
from ampgraph.model.build import ModelInputs


def _is_subclass(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and type(x) not in (torch.Tensor, torch.nn.Parameter)


MIXED = "mixed operand dtypes"


class _GemmLog(TorchDispatchMode):
    """Records (op, operand dtypes, output dtype) of each matrix product that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[str, ...], str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_leaves

        if any(_is_subclass(a) for a in tree_leaves((args, kwargs))):
            # torchao's Float8TrainingTensor: let it run its own dispatch (the casts and the
            # _scaled_mm it issues come back through this mode), as make_fx's proxy mode does.
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func._opname
        if name in GEMM_OPS:
            ins = tuple(short(a.dtype) for a in args if isinstance(a, torch.Tensor))
            self.calls.append((name, ins, short(out.dtype)))
        return out


@dataclass(frozen=True)
class GemmProof:
    """The traced GEMMs beside the real run's, and where they first differ."""

    predicted: list[tuple[str, tuple[str, ...], str]]
    real: list[tuple[str, tuple[str, ...], str]]

    @property
    def ok(self) -> bool:
        """Every GEMM, in order, with the same op and dtypes."""
        return self.predicted == self.real

    def first_difference(self) -> str | None:
        """The first GEMM that differs, in words (None: none)."""
        for i, (p, r) in enumerate(zip(self.predicted, self.real, strict=False)):
            if p != r:
                return f"GEMM {i}: predicted {p}, ran {r}"
        if len(self.predicted) != len(self.real):
            return f"{len(self.predicted)} GEMMs predicted, {len(self.real)} ran"
        return None


def real_gemms(
    model: ModelInputs, recipe: Fp8Recipe, state: dict[str, torch.Tensor], *, train: bool = False
) -> list[tuple[str, tuple[str, ...], str]]:
    """The GEMMs a real CPU run of the converted model makes, under CPU bf16 autocast.

    ``state`` holds real CPU tensors for every parameter and buffer (fp32 weights).
    """
    if recipe.name in MX_NAMES + MOE_NAMES:
        # torchao quantizes the real weights once (MXTensor) or wraps them (MXFP8 training
        # weights, a Linear's or a MoE's): the run takes them as they are.
        if recipe.kernel != "emulated" or (train and recipe.name in MX_NAMES):
            raise SettingError(f"{recipe.spelling}: the CPU's _scaled_mm refuses E8M0 block "
                               "scales (an SM100 GPU's GEMM) and the inference workflow does "
                               "not train: check kernel=emulated (mxfp8 forward; "
                               "torchao:mxfp8_rceil trains Linears and a MoE's experts)")
        real = copy.deepcopy(model.module).to_empty(device="cpu")
        real.load_state_dict(state, strict=False, assign=True)
        converted = convert(real, recipe)
        state = {**dict(converted.named_parameters()), **dict(converted.named_buffers())}
    else:
        converted = convert(model.module, recipe)
    # Tied weights once (named_parameters' names), as functional_call takes them.
    names = [k for k, _ in converted.named_parameters()]
    buffers = [k for k, _ in converted.named_buffers()]
    state = {k: state[k].detach().clone() for k in names + buffers if k in state}
    # Not MXTensors (frozen); the wrapped MXFP8 training weights train.
    wants = {k for k, p in converted.named_parameters() if p.requires_grad}
    params = {k: state[k].requires_grad_() for k in names if k in state and k in wants}
    log = _GemmLog()
    try:
        with log:
            with torch.autocast("cpu", torch.bfloat16):
                out = torch.func.functional_call(converted, state, model.args, model.kwargs)
            if train:
                torch.autograd.grad(train_loss(out), [p for p in params.values()], allow_unused=True)
    except RuntimeError as exc:
        # A kernel that refuses its operands (torch.mm of bf16 and fp32) is a result: the
        # proof compares it with the graph's prediction of a mixed-dtype GEMM.
        text = str(exc).splitlines()[0]
        log.calls.append(("raised", (MIXED if "same dtype" in text else text,), "-"))
    return log.calls


def prove_gemms(graph: Fp8Graph, model: ModelInputs, state: dict[str, torch.Tensor],
                *, train: bool = False) -> GemmProof:
    """The traced graph's GEMMs against a real run's (:func:`real_gemms`).

    >>> from torch import nn
    >>> from ampgraph.fp8.graph import trace_fp8
    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    >>> m = ModelInputs("mlp", net, (torch.randn(8, 32),))
    >>> r = parse_fp8_recipe("torchao:rowwise")
    >>> proof = prove_gemms(trace_fp8(m, r), m, dict(net.state_dict()))
    >>> proof.ok, proof.real[0]
    (True, ('_scaled_mm', ('e4m3', 'e4m3', 'fp32', 'fp32'), 'bf16'))
    """
    predicted = []
    for n in graph.gemms():
        if n.role == "gemm-mixed":  # the real kernel raises here, and nothing after it runs
            predicted.append(("raised", (MIXED,), "-"))
            break
        predicted.append((n.op, n.dtype_in, n.dtype_out))
    return GemmProof(predicted, real_gemms(model, recipe=graph.recipe, state=state, train=train))
