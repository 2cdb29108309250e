"""Will it survive FP8? Each FP8/MX GEMM operand's real fp32 values under the recipe's scaling.

One real fp32 run records every Linear's input (and its weight); for each operand the recipe
casts to FP8, the recipe's scaling is applied as torchao applies it: one scale per tensor
(``448 / amax``), one per row (rounded down to a power of two in torchao's rowwise recipes), or
one power-of-two (E8M0) scale per block of 32 values along the reduction dimension (MXFP8; the
``floor`` rule of the OCP spec and ``MXTensor.to_mx``, or ``rceil``, torchao's MXFP8 training
recipe). Then it counts, of the non-zero values, those that **flush to zero** (below half of the
format's smallest subnormal, 2^-10 for e4m3, after scaling), those that **saturate** (at or past
the format's largest value plus half an ulp, 464 for e4m3: clamped beyond rounding), and the
**precision lost** (the round trip's RMS error relative to the tensor's RMS). :func:`prove`
counts the same on torchao's real conversion of the same tensors.

>>> x = torch.full((4, 32), 1e-5); x[0, 0] = 30.0
>>> s = predict(x, "e4m3", "tensorwise")
>>> s.zeros, s.nonzero                 # one scale per tensor: the outlier sets it
(127, 128)
>>> predict(x, "e4m3", "rowwise", pow2=True).zeros      # one per row: only row 0 loses
31
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampgraph.errors import SettingError
from ampgraph.fp8.graph import train_loss
from ampgraph.fp8.recipes import (
    MOE_NAMES,
    MX_GRAPH,
    Fp8Recipe,
    operand_formats,
    plan_model,
    torchao_float8,
)
from ampgraph.fp8.te import NOT_IMPORTED, TeRecipe
from ampgraph.model.build import ModelInputs

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: Half of the smallest subnormal (values at or below it round to zero, ties to even) and the
#: largest finite value plus half an ulp (values at or past it are clamped beyond rounding).
FLUSH = {"e4m3": 2.0**-10, "e5m2": 2.0**-17}
CLAMP = {"e4m3": 464.0, "e5m2": 61440.0}
MX_BLOCK = 32
#: torchao's recipes, and TransformerEngine's (their rules as data: ampgraph.fp8.te).
AnyRecipe = Fp8Recipe | TeRecipe
#: ``MXFP8``'s two scale rules (torchao's ``ScaleCalculationMode``), by recipe name.
MX_RECIPES = {"mxfp8": "rceil", "mxfp8_floor": "floor"}


@dataclass(frozen=True)
class Survival:
    """How one operand's values fare in one FP8 format and scaling."""

    values: int
    nonzero: int
    zeros: int
    saturated: int
    rel_error: float

    @property
    def zero_share(self) -> float:
        """Of the non-zero values, the share that flush to zero."""
        return self.zeros / self.nonzero if self.nonzero else 0.0

    @property
    def saturated_share(self) -> float:
        """Of the non-zero values, the share clamped at the format's largest value."""
        return self.saturated / self.nonzero if self.nonzero else 0.0


def _rowwise_scale(x: torch.Tensor, fmt: str, per_row: bool, pow2: bool) -> torch.Tensor:
    """``max / amax`` in float64 then fp32 (torchao's order), optionally rounded down to 2^k."""
    a = x.abs()
    amax = a.amax(dim=-1, keepdim=True) if per_row else a.amax()
    scale = (torch.finfo(FP8[fmt]).max / amax.double().clamp(min=1e-12)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if pow2 else scale


def _mx_multiplier(blocks: torch.Tensor, fmt: str, rule: str) -> torch.Tensor:
    """Per block of 32, the power of two the values are multiplied by (1 / the E8M0 scale)."""
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    if rule == "rceil":
        descale = amax / torch.finfo(FP8[fmt]).max
        exponent = torch.ceil(torch.log2(descale)).clamp(-127, 127)
        # E8M0 byte 0 (a zero block) multiplies by one.
        return torch.where(exponent == -127, torch.ones_like(amax), torch.exp2(-exponent))
    # floor: the block amax's own exponent field, less the format's largest power of two.
    emax = {"e4m3": 8, "e5m2": 15}[fmt]
    exponent = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - emax
    scale = torch.exp2(exponent.clamp(-127, 128).float()).clamp(min=2.0**-126)
    return 1.0 / scale


def _te_e8m0_multiplier(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """TransformerEngine's MXFP8 rule: the E8M0 byte of ``amax * (1 / max)`` rounded up
    (``float_to_e8m0``), and the values multiplied by ``2^(127 - byte)`` (``exp2f_rcp``)."""
    rcp = torch.tensor(1.0 / torch.finfo(FP8[fmt]).max, dtype=torch.float32)
    bits = (blocks.abs().amax(dim=-1, keepdim=True) * rcp).view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    return torch.ldexp(torch.ones_like(blocks[..., :1]), 127 - (exponent + up.int()))


def _te_scale(amax: torch.Tensor, fmt: str, pow2: bool) -> torch.Tensor:
    """``compute_scale_from_amax`` (TE's recipe_common.cuh): ``max / amax`` in fp32 (1 where
    amax is 0), a power of two by masking the mantissa bits off."""
    amax = amax.float()
    scale = torch.where(amax == 0, 1.0, torch.finfo(FP8[fmt]).max / amax.where(amax != 0, 1.0))
    return (scale.view(torch.int32) & -0x800000).view(torch.float32) if pow2 else scale


def _block_scaled(x: torch.Tensor, fmt: str, rows: int, cols: int, pow2: bool) -> torch.Tensor:
    """``x`` (2-D) times one TE scale per ``rows x cols`` tile (a partial tile at the edges)."""
    r, c = x.shape
    padded = torch.nn.functional.pad(x, (0, -c % cols, 0, -r % rows))
    tiles = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
    scale = _te_scale(tiles.abs().amax(dim=(1, 3), keepdim=True), fmt, pow2)
    return (tiles * scale).reshape(padded.shape)[:r, :c]


def scaled(x: torch.Tensor, fmt: str, scaling: str, *, pow2: bool = False) -> torch.Tensor:
    """``x`` (fp32) multiplied by the recipe's scale, before the clamp and the cast.

    >>> x = torch.zeros(2, 256); x[0, 0], x[0, 200], x[1, 5] = 448.0, 1.0, 1e-9
    >>> scaled(x, "e4m3", "block-1x128")[:, [0, 5, 200]].tolist()   # 1x128 tiles
    [[448.0, 0.0, 448.0], [0.0, 448.0, 0.0]]
    """
    x = x.float()
    if scaling.startswith("mx-"):
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
        rule = scaling[3:]
        multiplier = (_te_e8m0_multiplier(blocks, fmt) if rule == "te"
                      else _mx_multiplier(blocks, fmt, rule))
        return (blocks * multiplier).reshape(x.shape)
    if scaling.startswith("block-"):
        rows, _, cols = scaling[6:].partition("x")
        return _block_scaled(x, fmt, int(rows), int(cols), pow2)
    if scaling == "tensorwise-te":
        return x * _te_scale(x.abs().amax(), fmt, pow2)
    return x * _rowwise_scale(x, fmt, scaling == "rowwise", pow2)


def _count(x: torch.Tensor, s: torch.Tensor, q: torch.Tensor | None, fmt: str) -> Survival:
    """Counts from the scaled values ``s`` (and the cast values ``q``, else cast here)."""
    nonzero = x != 0
    if q is None:
        q = s.clamp(-torch.finfo(FP8[fmt]).max, torch.finfo(FP8[fmt]).max).to(FP8[fmt])
    qf = q.float()
    zeros = int((nonzero & (qf == 0)).sum())
    saturated = int((s.abs() >= CLAMP[fmt]).sum())
    # Dequantise through the same scale: s / x is the scale wherever x is non-zero.
    deq = torch.where(nonzero, qf * (x.float() / s.where(s != 0, 1.0)), 0.0)
    norm = float(x.double().norm())
    err = float((deq.double() - x.double()).norm()) / norm if norm else 0.0
    return Survival(x.numel(), int(nonzero.sum()), zeros, saturated, err)


def predict(x: torch.Tensor, fmt: str, scaling: str, *, pow2: bool = False) -> Survival:
    """Flush-to-zero, saturation and precision loss of ``x`` in ``fmt`` under ``scaling``.

    ``scaling`` is ``tensorwise``, ``rowwise`` (one scale per row, the last dim reduced) or
    ``mx-floor`` / ``mx-rceil`` (one per 32 values along the last dim). The zero count is the
    threshold rule (``|x * scale| <= 2^-10`` for e4m3), not a cast.
    """
    s = scaled(x, fmt, scaling, pow2=pow2)
    survival = _count(x, s, None, fmt)
    zeros = int(((x != 0) & (s.abs() <= FLUSH[fmt])).sum())
    return Survival(survival.values, survival.nonzero, zeros, survival.saturated,
                    survival.rel_error)


def torchao_counts(x: torch.Tensor, fmt: str, scaling: str, *, pow2: bool = False) -> Survival:
    """The same counts on torchao's real conversion of ``x`` (its scale, its FP8 values).

    >>> x = torch.randn(8, 64) * torch.logspace(-6, 1, 64)
    >>> for scaling in ("tensorwise", "rowwise", "mx-floor", "mx-rceil"):
    ...     assert predict(x, "e4m3", scaling) == torchao_counts(x, "e4m3", scaling), scaling
    """
    x = x.float().contiguous()
    torchao_float8()  # torchao installed (else one line saying what to install), imported quietly
    if scaling.startswith("mx-"):
        from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx

        mode = ScaleCalculationMode.RCEIL if scaling == "mx-rceil" else ScaleCalculationMode.FLOOR
        e8m0, data = to_mx(x, FP8[fmt], MX_BLOCK, mode)
        biased = e8m0.view(torch.uint8).int()  # the E8M0 byte: 2^(byte - 127)
        multiplier = torch.exp2(127 - biased.float())
        if scaling == "mx-rceil":
            multiplier = torch.where(biased == 0, 1.0, multiplier)
        else:
            multiplier = 1.0 / (2.0 ** (biased.float() - 127)).clamp(min=2.0**-126)
        blocks = x.reshape(*x.shape[:-1], -1, MX_BLOCK)
        s = (blocks * multiplier.reshape(*blocks.shape[:-1], 1)).reshape(x.shape)
        return _count(x, s, data.reshape(x.shape), fmt)
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    rowwise = scaling == "rowwise"
    t = hp_tensor_to_float8_dynamic(
        x, FP8[fmt], LinearMMConfig(),
        scaling_granularity=ScalingGranularity.AXISWISE if rowwise else ScalingGranularity.TENSORWISE,
        axiswise_dim=-1 if rowwise else None, round_scales_to_power_of_2=pow2,
    )
    return _count(x, x * t._scale, t._data, fmt)


@dataclass(frozen=True)
class OperandRow:
    """One GEMM operand of one Linear under the recipe: its format, scaling and survival."""

    module: str
    operand: str
    fmt: str
    scaling: str
    pow2: bool
    survival: Survival

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        s = self.survival
        return {"module": self.module, "operand": self.operand, "format": self.fmt,
                "scaling": self.scaling, "values": s.values, "nonzero": s.nonzero,
                "zeros": s.zeros, "zero_share": s.zero_share, "saturated": s.saturated,
                "saturated_share": s.saturated_share, "rel_error": s.rel_error}


#: Each operand torchao casts -> (the tensor it is cast from, transposed?). Rows hold the
#: reduction dimension last, so ``rowwise`` is torchao's ``axiswise_dim`` (per row of the
#: forward's input and weight and of ``grad_output`` for ``grad_input``; per column of
#: ``grad_output`` and of the input for ``grad_weight``; per column of the weight for
#: ``grad_input``) and an MX block runs along the reduction.
OPERAND_SOURCES = {
    "input": ("input", False), "weight": ("weight", False),
    "grad_output": ("grad_output", False), "weight_for_grad_input": ("weight", True),
    "grad_output_for_grad_weight": ("grad_output", True), "input_for_grad_weight": ("input", True),
}


def recipe_operands(recipe: AnyRecipe, *, train: bool = False) -> dict[str, tuple[str, str, bool]]:
    """Each operand the recipe casts -> (format, scaling, power-of-two scales).

    The forward's two, and with ``train`` the backward's as torchao's ``Float8LinearConfig``
    casts them: an operand it leaves in high precision is not listed, nor one whose cast is
    the same as one listed (one scale per tensor does not depend on the orientation).

    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> r = parse_fp8_recipe("torchao:tensorwise")
    >>> recipe_operands(r, train=True)["grad_output"]
    ('e5m2', 'tensorwise', False)
    >>> sorted(recipe_operands(r, train=True))
    ['grad_output', 'input', 'weight']
    >>> sorted(recipe_operands(parse_fp8_recipe("torchao:rowwise_with_gw_hp"), train=True))
    ['grad_output', 'input', 'weight', 'weight_for_grad_input']
    """
    if isinstance(recipe, TeRecipe):
        return recipe.operands(train=train)
    if recipe.name in MOE_NAMES:
        from ampgraph.ranges.fp8_moe import moe_operand_formats

        return moe_operand_formats(recipe, train=train)
    if recipe.name in MX_RECIPES:
        if train:
            raise SettingError(f"{recipe.name}: {MX_GRAPH}; its backward operands are not "
                               "predicted (give --pass forward)")
        mx = f"mx-{MX_RECIPES[recipe.name]}"
        return {"input": ("e4m3", mx, True), "weight": ("e4m3", mx, True)}
    formats = operand_formats(recipe)
    pow2 = bool(recipe.config().round_scales_to_power_of_2)
    roles = list(OPERAND_SOURCES) if train else ["input", "weight"]
    out: dict[str, tuple[str, str, bool]] = {}
    casts = set()
    for role in roles:
        fmt, scaling = formats[role]
        source, transposed = OPERAND_SOURCES[role]
        cast = (source, fmt, scaling, transposed and scaling != "tensorwise")
        if fmt == "bf16" or cast in casts:
            continue
        casts.add(cast)
        out[role] = (fmt, scaling, pow2)
    return out


def _capture_grad_output(seen: dict[str, dict[str, torch.Tensor]], fqn: str) -> Any:
    """A forward hook keeping the gradient of the module's output (``grad_output``)."""

    def hook(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad and "grad_output" not in seen.get(
                fqn, {}):
            def keep(grad: torch.Tensor) -> None:
                seen[fqn]["grad_output"] = grad.detach().float().reshape(-1, grad.shape[-1])

            out.register_hook(keep)

    return hook


def linear_operands(
    model: ModelInputs, recipe: AnyRecipe, state: dict[str, torch.Tensor], *, train: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """Each converted Linear's input (rows of K) and weight from one real fp32 run; with
    ``train``, its ``grad_output`` (rows of N) too, from the real fp32 backward of the loss
    ``ampgraph fp8 --pass train`` traces (:func:`ampgraph.fp8.graph.train_loss`). A MoE
    recipe's records are its grouped GEMMs' (:func:`ampgraph.ranges.fp8_moe.moe_operands`)."""
    from ampgraph.fp8.moe import has_experts

    if recipe.name in MOE_NAMES and has_experts(model.module):
        from ampgraph.ranges.fp8_moe import moe_operands

        return moe_operands(model, recipe, state, train=train)  # type: ignore[arg-type]
    converted = {p.fqn for p in plan_model(model.module, recipe) if p.converted}
    if recipe.name in MX_RECIPES:  # MX blocks run along K: K must be a multiple of 32
        converted = {f for f in converted
                     if model.module.get_submodule(f).weight.shape[1] % MX_BLOCK == 0}
    seen: dict[str, dict[str, torch.Tensor]] = {}
    hooks = []
    for fqn in converted:
        mod = model.module.get_submodule(fqn)

        def hook(mod: nn.Module, args: tuple[Any, ...], fqn: str = fqn) -> None:
            x = args[0].detach().float()
            seen.setdefault(fqn, {"input": x.reshape(-1, x.shape[-1]).contiguous(),
                                  "weight": state[f"{fqn}.weight"].float().contiguous()})

        hooks.append(mod.register_forward_pre_hook(hook))
        if train:
            hooks.append(mod.register_forward_hook(_capture_grad_output(seen, fqn)))
    names = [k for k, _ in model.module.named_parameters()]
    names += [k for k, _ in model.module.named_buffers()]
    params = {k: state[k].detach().clone() for k in names if k in state}
    trainable = [params[k].requires_grad_() for k, p in model.module.named_parameters()
                 if k in params and params[k].is_floating_point()] if train else []
    try:
        with torch.set_grad_enabled(train):
            out = torch.func.functional_call(model.module, params, model.args, model.kwargs)
            if train:
                torch.autograd.grad(train_loss(out), trainable, allow_unused=True)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _operands(tensors: dict[str, torch.Tensor], role: str) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of each operand ``role`` of one record: a Linear's one, or each grouped
    GEMM's of a MoE record (``w1.input``, ``w2.input``)."""
    grouped = [(k, v) for k, v in tensors.items() if k.partition(".")[2] == role]
    if grouped:
        return grouped
    x = _operand(tensors, role)
    return [] if x is None else [(role, x)]  # no grad_output: the output misses the loss


def _operand(tensors: dict[str, torch.Tensor], role: str) -> torch.Tensor | None:
    """The operand ``role`` as torchao casts it, the reduction dimension last (a MoE record's
    ``WEIGHT.ROLE``, laid out so already)."""
    if "." in role:
        return tensors.get(role)
    source, transposed = OPERAND_SOURCES[role]
    x = tensors.get(source)
    return x.t().contiguous() if x is not None and transposed else x


def survival_table(
    model: ModelInputs, recipe: AnyRecipe, state: dict[str, torch.Tensor], *,
    train: bool = False, operands: dict[str, dict[str, torch.Tensor]] | None = None,
) -> list[OperandRow]:
    """Every FP8 GEMM operand of the forward (and with ``train`` the backward's), the worst
    (most values flushed) first. ``operands``: :func:`linear_operands`' record, if made."""
    ops = recipe_operands(recipe, train=train)
    if operands is None:
        operands = linear_operands(model, recipe, state, train=train)
    converted = {p.fqn for p in plan_model(model.module, recipe) if p.converted}
    rows = []
    for fqn, tensors in operands.items():
        if fqn not in converted:  # a record made before the advisor's filter
            continue
        for role, (fmt, scaling, pow2) in ops.items():
            for name, x in _operands(tensors, role):
                rows.append(OperandRow(fqn, name, fmt, scaling, pow2,
                                       predict(x, fmt, scaling, pow2=pow2)))
    return sorted(rows, key=lambda r: (-r.survival.zero_share, -r.survival.saturated_share,
                                       -r.survival.rel_error, r.module, r.operand))


def prove(
    model: ModelInputs, recipe: AnyRecipe, state: dict[str, torch.Tensor], *,
    train: bool = False, operands: dict[str, dict[str, torch.Tensor]] | None = None,
) -> list[tuple[OperandRow, Survival]]:
    """Each row beside torchao's real counts on the same tensors (they must be equal)."""
    if isinstance(recipe, TeRecipe):
        raise SettingError(f"{recipe.spelling}: {NOT_IMPORTED}: nothing to prove against")
    if operands is None:
        operands = linear_operands(model, recipe, state, train=train)
    return [
        (row, torchao_counts(_operand(operands[row.module], row.operand), row.fmt,  # type: ignore[arg-type]
                             row.scaling, pow2=row.pow2))
        for row in survival_table(model, recipe, state, train=train, operands=operands)
    ]


def advise(rows: Sequence[OperandRow], *, max_zero_share: float = 0.01) -> tuple[str, ...]:
    """The Linears to keep in bf16: any operand flushing more than ``max_zero_share`` of its
    non-zero values, or saturating any, worst first.

    >>> s = Survival(10, 10, 5, 0, 0.1)
    >>> advise([OperandRow("fc2", "input", "e4m3", "tensorwise", False, s)])
    ('fc2',)
    """
    keep = [r.module for r in rows
            if r.survival.zero_share > max_zero_share or r.survival.saturated]
    return tuple(dict.fromkeys(keep))


def findings(rows: Sequence[OperandRow], *, max_zero_share: float = 0.01
             ) -> list[tuple[str, OperandRow, str]]:
    """``audit``'s findings under an FP8 recipe, worst first: an operand that saturates
    (error: values clamped) or flushes more than ``max_zero_share`` of its values (warning).

    >>> row = OperandRow("fc2", "input", "e4m3", "tensorwise", False, Survival(10, 10, 5, 0, 0.1))
    >>> findings([row])[0][0::2]
    ('warning', '50.00% of its non-zero values flush to zero in e4m3 (tensorwise scaling): keep fc2 in bf16 (filter_fqns=fc2)')
    """
    out = []
    for r in rows:
        s, fix = r.survival, f"keep {r.module} in bf16 (filter_fqns={r.module})"
        if s.saturated:
            out.append(("error", r, f"{s.saturated_share:.2%} of its non-zero values saturate "
                        f"in {r.fmt} ({r.scaling} scaling): {fix}"))
        elif s.zero_share > max_zero_share:
            out.append(("warning", r, f"{s.zero_share:.2%} of its non-zero values flush to zero "
                        f"in {r.fmt} ({r.scaling} scaling): {fix}"))
    return sorted(out, key=lambda f: f[0] != "error")
