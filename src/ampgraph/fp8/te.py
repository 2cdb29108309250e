"""TransformerEngine's FP8 recipes as data, read from its source (TE cannot be imported here).

TransformerEngine needs CUDA to import, so nothing of it runs on this machine: these are its
recipes' rules, each cited from NVIDIA/TransformerEngine at commit
``d0067d0da6cb01811b8072a7d304f0e00344ce2b``, for :mod:`ampgraph.ranges.fp8` to predict the
survival of each GEMM operand. No graph is claimed: no TE code ran.

- ``te:delayed`` (``DelayedScaling``, recipe/__init__.py:173-284): one scale per tensor,
  ``FP8_MAX / amax / 2^margin`` (l.244-247) from the **largest amax of a history** of
  ``amax_history_len=1024`` steps (``amax_compute_algo="max"``, pytorch/quantization.py:1082-1083),
  format ``HYBRID`` by default (l.254): e4m3 forward, e5m2 backward (recipe/__init__.py:29-51,
  pytorch/quantization.py:290-296). Predicted with a history holding this batch's amax alone
  (a larger past amax flushes more).
- ``te:current`` (``Float8CurrentScaling``, l.286-334): one scale per tensor from this
  tensor's amax, ``HYBRID``, scales not rounded to powers of two unless
  ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1`` (l.302-306). The scale is
  ``compute_scale_from_amax`` (common/recipe/recipe_common.cuh:14-40): ``max / amax`` in fp32,
  a power of two by masking the mantissa.
- ``te:mxfp8`` (``MXFP8BlockScaling``, l.337-389): one E8M0 scale per 32 consecutive values,
  ``E4M3`` for every tensor, gradients included (l.369); the exponent is
  ``float_to_e8m0(amax * (1 / max))`` rounded up (common/util/ptx_arch_spec.cuh:72-104), and
  rowwise and columnwise copies are both quantized from high precision (l.346-353).
- ``te:block`` (``Float8BlockScaling``, l.392-487): ``E4M3``, power-of-two fp32 scales
  (l.429-434), 1x128 blocks for inputs and gradients and 128x128 for weights (l.435-437;
  pytorch/quantization.py:1588-1636; common/transpose/quantize_transpose_square_blockwise.cu:33,
  158 and quantize_transpose_vector_blockwise.cu:151, 295), each scale ``compute_scale_from_amax``.

Which modules run in FP8: under ``fp8_autocast`` only TransformerEngine's own modules do
(``te.Linear``, ``te.LayerNormLinear``, ``te.LayerNormMLP``, ``te.GroupedLinear``, and the
``TransformerLayer`` / ``MultiheadAttention`` built of them; pytorch/module/linear.py:1474,
layernorm_linear.py:1207, layernorm_mlp.py:1834, grouped_linear.py:1533). A plain
``nn.Linear`` is not converted: the prediction is for each ``nn.Linear`` swapped for a
``te.Linear``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ampgraph.errors import SettingError, clip
from ampgraph.fp8.recipes import read_filter_file

TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"
NOT_IMPORTED = (
    "TransformerEngine cannot be imported here (it needs CUDA): predicted from its source's "
    f"rules (NVIDIA/TransformerEngine@{TE_COMMIT[:10]}), no TE code ran"
)
CONVERTED = "as a te.Linear (fp8_autocast converts no nn.Linear: swap it for te.Linear)"

#: Each recipe: the format of the forward's and of the backward's tensors ("hybrid": e4m3 then
#: e5m2), power-of-two scales, and each tensor's scaling granularity (input, weight, gradient).
TE_RECIPES: dict[str, dict[str, Any]] = {
    "delayed": {"class": "DelayedScaling", "format": "hybrid", "pow2": False,
                "scaling": ("tensorwise-te", "tensorwise-te", "tensorwise-te")},
    "current": {"class": "Float8CurrentScaling", "format": "hybrid", "pow2": False,
                "scaling": ("tensorwise-te", "tensorwise-te", "tensorwise-te")},
    "mxfp8": {"class": "MXFP8BlockScaling", "format": "e4m3", "pow2": True,
              "scaling": ("mx-te", "mx-te", "mx-te")},
    "block": {"class": "Float8BlockScaling", "format": "e4m3", "pow2": True,
              "scaling": ("block-1x128", "block-128x128", "block-1x128")},
}
#: The options each recipe takes, as TE's own fields and environment variables name them.
OPTIONS = {"format": ("delayed", "current", "mxfp8", "block"),
           "power_2_scales": ("current", "block")}


@dataclass(frozen=True)
class TeRecipe:
    """One TransformerEngine recipe, with the Linears kept out of FP8 (``filter_fqns``).

    >>> r = parse_te_recipe("te:current,format=e4m3,filter_fqns=lm_head")
    >>> r.spelling, r.formats
    ('te:current,format=e4m3,filter_fqns=lm_head', ('e4m3', 'e4m3'))
    """

    name: str
    fmt: str
    pow2: bool
    filter_fqns: tuple[str, ...] = ()
    auto_filter: bool = False  # TE has no size rule: always False

    @property
    def spelling(self) -> str:
        """The recipe as :func:`parse_te_recipe` reads it back."""
        out = f"te:{self.name}"
        if self.fmt != TE_RECIPES[self.name]["format"]:
            out += f",format={self.fmt}"
        if self.pow2 != TE_RECIPES[self.name]["pow2"]:
            out += f",power_2_scales={str(self.pow2).lower()}"
        if self.filter_fqns:
            out += ",filter_fqns=" + "+".join(self.filter_fqns)
        return out

    @property
    def formats(self) -> tuple[str, str]:
        """The forward's and the backward's FP8 format (``HYBRID``: e4m3, then e5m2)."""
        return ("e4m3", "e5m2") if self.fmt == "hybrid" else ("e4m3", "e4m3")

    @property
    def converted_reason(self) -> str:
        """How a kept ``nn.Linear`` is understood (TE converts none)."""
        return CONVERTED

    def with_filter(self, fqns: tuple[str, ...]) -> TeRecipe:
        """This recipe keeping ``fqns`` out of FP8 too (the advisor's filter)."""
        return TeRecipe(self.name, self.fmt, self.pow2,
                        tuple(dict.fromkeys(self.filter_fqns + fqns)))

    def module_filter_fn(self) -> Callable[[nn.Module, str], bool]:
        """True for a Linear predicted in FP8 (not named by ``filter_fqns``)."""
        fqns = self.filter_fqns
        return lambda mod, fqn: not any(f in fqn for f in fqns)

    def config(self) -> Any:
        """No config: TE cannot be imported here, and no graph is claimed without its code."""
        raise SettingError(f"{self.spelling}: {NOT_IMPORTED}; ampgraph fp8-ranges predicts "
                           "its survival, no graph is traced")

    def operands(self, *, train: bool = False) -> dict[str, tuple[str, str, bool]]:
        """Each GEMM operand -> (format, scaling, power-of-two scales), as
        :func:`ampgraph.ranges.fp8.recipe_operands` lists torchao's. Operands whose cast is the
        forward's (one scale per tensor, or the weight's square blocks) are not listed twice.

        >>> sorted(parse_te_recipe("te:block").operands(train=True))  # doctest: +NORMALIZE_WHITESPACE
        ['grad_output', 'grad_output_for_grad_weight', 'input', 'input_for_grad_weight',
         'weight']
        >>> parse_te_recipe("te:delayed").operands(train=True)["grad_output"]
        ('e5m2', 'tensorwise-te', False)
        """
        x, w, g = TE_RECIPES[self.name]["scaling"]
        fwd, bwd = self.formats
        out = {"input": (fwd, x, self.pow2), "weight": (fwd, w, self.pow2)}
        if not train:
            return out
        out["grad_output"] = (bwd, g, self.pow2)
        # The transposed copies: one scale per tensor or per 128x128 tile is the same cast.
        if w not in ("tensorwise-te", "block-128x128"):
            out["weight_for_grad_input"] = (fwd, w, self.pow2)
        if g != "tensorwise-te":
            out["grad_output_for_grad_weight"] = (bwd, g, self.pow2)
        if x != "tensorwise-te":
            out["input_for_grad_weight"] = (fwd, x, self.pow2)
        return out


def parse_te_recipe(text: str) -> TeRecipe:
    """Parse ``te:NAME[,format=e4m3|hybrid][,power_2_scales=true][,filter_fqns=A+B]``.

    >>> parse_te_recipe("te:mxfp8").formats
    ('e4m3', 'e4m3')
    >>> parse_te_recipe("te:fp4")
    Traceback (most recent call last):
    ...
    ampgraph.errors.SettingError: unknown TransformerEngine recipe 'fp4': write te: with one of delayed, current, mxfp8, block
    """
    _, _, rest = text.strip().partition(":")
    name, *parts = [p.strip() for p in rest.split(",")]
    name = name.lower()
    if name not in TE_RECIPES:
        raise SettingError(f"unknown TransformerEngine recipe {clip(name)}: write te: with one "
                           f"of {', '.join(TE_RECIPES)}")
    fmt, pow2 = TE_RECIPES[name]["format"], TE_RECIPES[name]["pow2"]
    fqns: tuple[str, ...] = ()
    for part in filter(None, parts):
        key, _, value = (p.strip().lower() for p in part.partition("="))
        if key == "format" and value in ("e4m3", "hybrid"):
            fmt = value  # TE refuses pure E5M2 training (recipe/__init__.py:264)
        elif key == "power_2_scales" and name in OPTIONS[key] and value in ("true", "false"):
            pow2 = value == "true"
        elif key == "filter_fqns" and value:
            fqns += tuple(f.strip() for f in part.partition("=")[2].split("+") if f.strip())
        elif key == "filter_file" and value:
            fqns += read_filter_file(part.partition("=")[2].strip())
        else:
            raise SettingError(f"malformed TransformerEngine recipe option {clip(part)}: write "
                               "format=e4m3|hybrid, power_2_scales=true|false (current, block), "
                               "filter_fqns=A+B or filter_file=PATH")
    return TeRecipe(name, fmt, pow2, tuple(dict.fromkeys(fqns)))
