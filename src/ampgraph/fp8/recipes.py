"""torchao's float8 training recipes: which Linears convert, and each GEMM operand's format.

A recipe is spelled ``torchao:NAME[,filter_fqns=A+B][,filter_file=PATH][,auto_filter=true]``: ``NAME`` is one of
torchao's ``Float8LinearRecipeName`` values (``tensorwise``, ``rowwise``,
``rowwise_with_gw_hp``), torchao's MX names (``mxfp8``, ``mxfp8_floor``: dense Linears, the
inference workflow) or its ``MXFP8TrainingRecipe`` values (``mxfp8_rceil``,
``mxfp8_rceil_wgrad_with_hp``: MXFP8 training of a MoE's grouped GEMMs or, in a model without
experts, of its ``nn.Linear`` s, :mod:`ampgraph.fp8.moe`);
``filter_fqns`` are module-name fragments kept in bf16, matched as torchtitan's ``filter_fqns``
are (a fragment anywhere in the name); ``auto_filter`` adds torchao's own size rule
(``_auto_filter_for_recipe``: dims not multiples of 16, or too small to gain on an H100). Nothing here re-implements torchao: the formats are read from its
``Float8LinearConfig``, the decisions are its filter's, the conversion is its
``convert_to_float8_training``; this module only says why, in words.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

from ampgraph.errors import SettingError, clip
from ampgraph.fp8.moe import MOE_NAMES
from ampgraph.torchutil import quiet_library_imports

#: torchao's recipe names (``Float8LinearRecipeName``'s values), in the order of the docs.
RECIPE_NAMES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: MXFP8 (one E8M0 scale per 32 values): ``mxfp8`` scales by torchao's MXFP8 training rule
#: (RCEIL), ``mxfp8_floor`` by the OCP spec's (``MXTensor.to_mx``'s default). Their survival is
#: predicted and proved (:mod:`ampgraph.ranges.fp8`); their graph is the forward of torchao's MX
#: inference workflow (:mod:`ampgraph.fp8.mx`, see MX_GRAPH).
MX_NAMES = ("mxfp8", "mxfp8_floor")
MX_GRAPH = (
    "mxfp8 and mxfp8_floor are torchao's MX inference workflow (MXDynamicActivationMXWeightConfig"
    "), a forward, and fp8-ranges predicts the forward's survival; MXFP8 training (forward and "
    "backward) is torchao:mxfp8_rceil[_wgrad_with_hp] (MXFP8TrainingOpConfig: a dense model's "
    "nn.Linears, a MoE's grouped experts)"
)
#: Every name after ``torchao:``.
ALL_NAMES = RECIPE_NAMES + MX_NAMES + MOE_NAMES
#: The three GEMMs of a Linear and their operands, as ``Float8LinearConfig`` names their casts:
#: ``output = input @ weight.t()``, ``grad_input = grad_output @ weight``,
#: ``grad_weight = grad_output.t() @ input``.
GEMMS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("output", ("input", "weight")),
    ("grad_input", ("grad_output", "weight_for_grad_input")),
    ("grad_weight", ("grad_output_for_grad_weight", "input_for_grad_weight")),
)
INSTALL = "pip install 'ampgraph[fp8]' (torchao 0.18)"


def torchao_float8() -> Any:
    """``torchao.float8``, or a one-line :class:`SettingError` saying what to install.

    torchao 0.18 registers enums that torch 2.14 logs a deprecation warning for, a line each on
    stderr at import: quietened here, since they say nothing about the user's model.
    """
    try:
        with quiet_library_imports():
            import torchao.float8 as float8
            import torchao.prototype.mx_formats.mx_tensor  # noqa: F401  (the MX casts)
    except ImportError as exc:
        raise SettingError(f"FP8 recipes need torchao, which is not installed: {INSTALL}") from exc
    return float8


@dataclass(frozen=True)
class Fp8Recipe:
    """One torchao float8 training recipe with its module filter.

    >>> r = parse_fp8_recipe("torchao:rowwise,filter_fqns=lm_head+fc2")
    >>> r.name, r.filter_fqns, r.auto_filter, r.spelling
    ('rowwise', ('lm_head', 'fc2'), False, 'torchao:rowwise,filter_fqns=lm_head+fc2')
    """

    name: str
    filter_fqns: tuple[str, ...] = ()
    auto_filter: bool = False
    #: MX and MoE only: torchao's ``KernelPreference`` (``auto``: ``_scaled_mm`` on E8M0 block scales,
    #: an SM100 GPU's GEMM; ``emulated``: dequantized to bf16, which the CPU runs).
    kernel: str = "auto"

    @property
    def spelling(self) -> str:
        """The recipe as :func:`parse_fp8_recipe` reads it back."""
        out = f"torchao:{self.name}"
        if self.filter_fqns:
            out += ",filter_fqns=" + "+".join(self.filter_fqns)
        if self.auto_filter:
            out += ",auto_filter=true"
        if self.kernel != "auto":
            out += f",kernel={self.kernel}"
        return out

    @property
    def converted_reason(self) -> str:
        """What happens to a Linear the recipe takes."""
        if self.name in MX_NAMES:
            return "weight quantized to an MXTensor (MXDynamicActivationMXWeightConfig)"
        if self.name in MOE_NAMES:
            from ampgraph.fp8.moe import CONVERTED

            return CONVERTED
        return "converted to Float8Linear"

    def with_filter(self, fqns: tuple[str, ...]) -> Fp8Recipe:
        """This recipe keeping ``fqns`` in bf16 too (the advisor's filter)."""
        merged = tuple(dict.fromkeys(self.filter_fqns + fqns))
        return Fp8Recipe(self.name, merged, self.auto_filter, self.kernel)

    def config(self) -> Any:
        """torchao's ``Float8LinearConfig`` for this recipe."""
        if self.name in MX_NAMES + MOE_NAMES:
            raise SettingError(f"{self.name} has no Float8LinearConfig: {MX_GRAPH}")
        return torchao_float8().Float8LinearConfig.from_recipe_name(self.name)

    def module_filter_fn(self) -> Callable[[nn.Module, str], bool]:
        """The ``module_filter_fn`` handed to ``convert_to_float8_training``: True converts."""
        if self.auto_filter:
            if self.name in MX_NAMES + MOE_NAMES:
                raise SettingError(f"torchao has no auto filter for {self.name}: give filter_fqns=")
            torchao_float8()
            from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

            try:
                return _auto_filter_for_recipe(self.name, list(self.filter_fqns))  # type: ignore[no-any-return]
            except NotImplementedError:
                raise SettingError(
                    f"torchao has no auto filter for {self.name}: give filter_fqns= alone"
                ) from None
        fqns = self.filter_fqns
        return lambda mod, fqn: not any(f in fqn for f in fqns)


def parse_fp8_recipe(text: str) -> Fp8Recipe:
    """Parse ``torchao:NAME[,filter_fqns=A+B][,auto_filter=true]``.

    >>> parse_fp8_recipe("torchao:tensorwise,auto_filter=true").auto_filter
    True
    >>> parse_fp8_recipe("torchao:fp4")
    Traceback (most recent call last):
    ...
    ampgraph.errors.SettingError: unknown torchao float8 recipe 'fp4': write torchao: with one of tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, mxfp8_floor, mxfp8_rceil, mxfp8_rceil_wgrad_with_hp
    """
    family, sep, rest = text.strip().partition(":")
    if family.strip().lower() != "torchao" or not sep:
        raise SettingError(f"malformed FP8 recipe {clip(text)}: write e.g. torchao:rowwise")
    name, *parts = [p.strip() for p in rest.split(",")]
    if name.lower() not in ALL_NAMES:
        raise SettingError(
            f"unknown torchao float8 recipe {clip(name)}: write torchao: with one of "
            + ", ".join(ALL_NAMES)
        )
    fqns: tuple[str, ...] = ()
    auto = False
    kernel = "auto"
    for part in filter(None, parts):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if key == "filter_fqns" and eq:
            fqns += tuple(f for f in (v.strip() for v in value.split("+")) if f)
        elif key == "filter_file" and value.strip():
            fqns += read_filter_file(value.strip())
        elif key == "auto_filter" and value.strip().lower() in ("true", "false", "1", "0"):
            auto = value.strip().lower() in ("true", "1")
        elif key == "kernel" and name.lower() in MX_NAMES + MOE_NAMES and value.strip().lower() in (
                "auto", "emulated"):
            kernel = value.strip().lower()
        else:
            raise SettingError(
                f"malformed FP8 recipe option {clip(part)}: write filter_fqns=A+B, "
                "filter_file=PATH, auto_filter=true or (MX) kernel=auto|emulated"
            )
    return Fp8Recipe(name.lower(), tuple(dict.fromkeys(fqns)), auto, kernel)


def read_filter_file(path: str) -> tuple[str, ...]:
    """The module-name fragments a filter file keeps in bf16: the advisor's Python (``ampgraph
    fp8-ranges --advise --write-filter FILE``: its ``KEEP_BF16 = [...]``, read as a literal,
    never run), or one fragment a line (``#`` starts a comment).

    >>> import tempfile
    >>> f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    >>> _ = f.write("KEEP_BF16 = ['lm_head', 'layers.0.fc2']\\n"); f.close()
    >>> read_filter_file(f.name)
    ('lm_head', 'layers.0.fc2')
    """
    import ast

    try:
        text = open(path, encoding="utf-8").read()  # noqa: SIM115  (read at once)
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(f"cannot read the filter file {clip(path)}: "
                           f"{exc.strerror if isinstance(exc, OSError) else exc}") from None
    if "KEEP_BF16" in text:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            raise SettingError(f"filter file {clip(path)} is not Python") from None
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and getattr(node.targets[0], "id", None) == "KEEP_BF16"):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    break
                if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                    return tuple(value)
        raise SettingError(f"filter file {clip(path)}: KEEP_BF16 is not a list of names")
    return tuple(line.split("#", 1)[0].strip() for line in text.splitlines()
                 if line.split("#", 1)[0].strip())


def operand_formats(recipe: Fp8Recipe) -> dict[str, tuple[str, str]]:
    """Each GEMM operand -> (format, scaling), read from torchao's ``Float8LinearConfig``.

    A disabled cast leaves the operand in the autocast dtype (``bf16``, scaling ``none``).

    >>> f = operand_formats(parse_fp8_recipe("torchao:tensorwise"))
    >>> f["input"], f["grad_output"]
    (('e4m3', 'tensorwise'), ('e5m2', 'tensorwise'))
    >>> operand_formats(parse_fp8_recipe("torchao:rowwise_with_gw_hp"))["input_for_grad_weight"]
    ('bf16', 'none')
    """
    config = recipe.config()
    out: dict[str, tuple[str, str]] = {}
    for _gemm, roles in GEMMS:
        for role in roles:
            cast = getattr(config, f"cast_config_{role}")
            if cast.scaling_type.value == "disabled":
                out[role] = ("bf16", "none")
                continue
            dtype = str(cast.target_dtype).removeprefix("torch.float8_").removesuffix("fn")
            granularity = cast.scaling_granularity.value
            out[role] = (dtype, "rowwise" if granularity == "axiswise" else granularity)
    return out


class FilteredRecipe(Protocol):
    """What :func:`plan_model` reads of a recipe: torchao's, or TransformerEngine's
    (:class:`ampgraph.fp8.te.TeRecipe`, which also says how it reads a kept ``nn.Linear``)."""

    name: str
    filter_fqns: tuple[str, ...]

    def module_filter_fn(self) -> Callable[[nn.Module, str], bool]: ...


@dataclass(frozen=True)
class LinearPlan:
    """One module with a matrix weight: converted to ``Float8Linear``, or kept, and why."""

    fqn: str
    kind: str
    out_features: int
    in_features: int
    converted: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return dict(self.__dict__)


def _auto_reason(name: str, n: int, k: int) -> str:
    """Why torchao's size rule kept an ``N x K`` Linear (the rule as its source states it)."""
    if n % 16 or k % 16:
        return f"auto filter: {n}x{k} is not a multiple of 16 (FP8 GEMMs need that)"
    if name == "tensorwise":
        return f"auto filter: K={k} <= 4096 and N={n} <= 1024 (too small to gain, tensorwise)"
    return f"auto filter: N={n}, K={k} under the rowwise thresholds (too small to gain)"


def plan_model(module: nn.Module, recipe: FilteredRecipe) -> list[LinearPlan]:
    """Every module with a 2-D weight, as ``convert_to_float8_training`` would treat it.

    The decision is the recipe's own ``module_filter_fn`` (torchao's auto filter included);
    only the reason is worded here.

    >>> m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 10))
    >>> [(p.fqn, p.converted) for p in plan_model(m, parse_fp8_recipe("torchao:tensorwise"))]
    [('0', True), ('1', True)]
    >>> plan_model(m, parse_fp8_recipe("torchao:tensorwise,filter_fqns=1"))[1].reason
    "filtered by name (matches '1')"
    """
    keep = recipe.module_filter_fn()
    if recipe.name in MOE_NAMES:
        from ampgraph.fp8.moe import expert_plans

        return [LinearPlan(*p) for p in expert_plans(module, keep, recipe.filter_fqns)]
    plans = []
    for fqn, mod in module.named_modules():
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
            continue
        n, k = weight.shape
        kind = type(mod).__name__
        if type(mod) is not nn.Linear:
            # convert_to_float8_training swaps exact nn.Linear instances only.
            plans.append(LinearPlan(fqn, kind, n, k, False, f"not an nn.Linear ({kind})"))
            continue
        if recipe.name in MX_NAMES and k % 32:
            plans.append(LinearPlan(fqn, kind, n, k, False,
                                    f"K={k} is not a multiple of 32 (one MX block)"))
            continue
        if keep(mod, fqn):
            # A TransformerEngine recipe (ampgraph.fp8.te) says how it reads a kept nn.Linear.
            how = getattr(recipe, "converted_reason", "converted to Float8Linear")
            plans.append(LinearPlan(fqn, kind, n, k, True, how))
            continue
        named = [f for f in recipe.filter_fqns if f in fqn]
        reason = (
            f"filtered by name (matches {named[0]!r})" if named else _auto_reason(recipe.name, n, k)
        )
        plans.append(LinearPlan(fqn, kind, n, k, False, reason))
    return plans


def convert(module: nn.Module, recipe: Fp8Recipe) -> nn.Module:
    """A copy of ``module`` converted by torchao's ``convert_to_float8_training`` (works on meta).

    >>> m = convert(nn.Sequential(nn.Linear(16, 16)), parse_fp8_recipe("torchao:rowwise"))
    >>> type(m[0]).__name__
    'Float8Linear'
    """
    float8 = torchao_float8()
    if recipe.name in MX_NAMES:
        from ampgraph.fp8.mx import quantize_mx

        return quantize_mx(module, recipe.name, recipe.kernel, recipe.module_filter_fn())
    if recipe.name in MOE_NAMES:
        from ampgraph.fp8.moe import convert_moe

        return convert_moe(module, recipe.name, recipe.kernel, recipe.module_filter_fn())
    out = copy.deepcopy(module)
    return float8.convert_to_float8_training(  # type: ignore[no-any-return]
        out, config=recipe.config(), module_filter_fn=recipe.module_filter_fn()
    )
