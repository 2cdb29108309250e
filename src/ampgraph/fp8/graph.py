"""The FP8 forward (and backward), traced from torchao's own module code on fake tensors.

The model is converted by torchao (:func:`ampgraph.fp8.recipes.convert`), then traced with
``make_fx`` over ``functional_call`` on fake CPU tensors under CPU bf16 autocast, forward alone
or forward + loss + ``torch.autograd.grad``. What the graph holds is torchao's real code: its
``abs``/``amax``, its scale arithmetic (``reciprocal``, ``clamp``, power-of-two rounding), the
``_to_copy`` to ``float8_e4m3fn`` / ``float8_e5m2`` and ``_scaled_mm``. Every node is annotated
with the module that made it (forward hooks mark the nodes each module's call added) and a role:
an FP8 GEMM and its operand formats, a bf16 GEMM, a scale computation, a cast to FP8, or other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.errors import SettingError
from ampgraph.fp8.mx import flatten, unflatten
from ampgraph.fp8.recipes import (
    MOE_NAMES,
    MX_GRAPH,
    MX_NAMES,
    Fp8Recipe,
    LinearPlan,
    convert,
    plan_model,
)
from ampgraph.model.build import ModelInputs

#: Matrix products (after make_fx's decomposition of linear/matmul); the grouped ones are a
#: MoE's experts (``_grouped_mm(tokens, weights, offs)``: their matrices come first).
GEMM_OPS = frozenset({"_scaled_mm", "mm", "addmm", "bmm", "baddbmm", "_grouped_mm",
                      "_scaled_grouped_mm"})
GROUPED = frozenset({"_grouped_mm", "_scaled_grouped_mm"})
#: Ops that move or reshape values without changing them: walked through to an operand's
#: origin (an emulated MX GEMM's dequantized operand is a view of ``e4m3 * e8m0``).
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "unsqueeze",
                   "expand", "clone", "alias", "contiguous", "slice"})
#: Ops whose values do not depend on their tensor argument's (only its dtype and device): what a
#: scale is computed from is not found past them.
CONSTANTS = frozenset({"new_ones", "new_zeros", "new_full", "new_empty", "ones_like",
                       "zeros_like", "full_like", "empty_like"})
FP8_DTYPES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float8_e8m0fnu": "e8m0"}


def short(dtype: Any) -> str:
    """``e4m3``, ``e5m2``, ``bf16``, ``fp32`` for a torch dtype (or its name).

    >>> short(torch.float8_e4m3fn), short(torch.bfloat16)
    ('e4m3', 'bf16')
    """
    name = str(dtype).removeprefix("torch.")
    return FP8_DTYPES.get(name, {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(
        name, name))


@dataclass(frozen=True)
class Fp8Node:
    """One node of the traced graph, annotated."""

    name: str
    op: str
    module: str
    phase: str
    role: str
    dtype_in: tuple[str, ...]
    dtype_out: str
    #: For a GEMM: each matrix operand's scaling (``tensorwise``, ``rowwise``, ``none``).
    scaling: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return dict(self.__dict__)


@dataclass
class Fp8Graph:
    """The annotated FP8 graph of one model under one recipe."""

    recipe: Fp8Recipe
    plans: list[LinearPlan]
    nodes: list[Fp8Node]
    graph: fx.GraphModule

    def gemms(self, phase: str | None = None) -> list[Fp8Node]:
        """The matrix products, in graph order (of one phase when given)."""
        return [n for n in self.nodes if n.role.startswith("gemm") and phase in (None, n.phase)]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {
            "recipe": self.recipe.spelling,
            "linears": [p.to_dict() for p in self.plans],
            "nodes": [n.to_dict() for n in self.nodes],
        }


def _val_dtype(arg: Any) -> str | None:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return short(val.dtype) if isinstance(val, torch.Tensor) else None


def _scaling(scale: Any, operand: Any) -> str:
    """A ``_scaled_mm`` scale's granularity, from its shape beside its operand's."""
    val = scale.meta.get("val") if isinstance(scale, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return "none"
    if val.dtype == torch.float8_e8m0fnu:
        return "mx-1x32"  # one E8M0 (power-of-two) scale per 32 values along K
    return "tensorwise" if val.numel() == 1 else "rowwise"


def _opname(n: Any) -> str:
    return getattr(n.target, "_opname", "") if isinstance(n, fx.Node) else ""


def _through_views(n: Any) -> Any:
    """The node ``n``'s values come from, past views that keep the dtype (not ``view(dtype)``)."""
    while _opname(n) in VIEWS and _val_dtype(n.args[0]) == _val_dtype(n):
        n = n.args[0]
    return n


def _e8m0_source(factor: Any, limit: int = 12) -> Any:
    """The E8M0 scale tensor a dequantization factor is computed from, walking back at most
    ``limit`` nodes (None: none so near). torchao has two dequantizations: the grouped GEMM's
    emulated kernel casts the E8M0 scale up (``_to_copy``), ``MXTensor``'s ``to_dtype`` (a
    dense Linear's ``mx_mm``) reads its exponent byte (``view(uint8)``, ``- 127``, ``2 **``)."""
    todo, walked = [factor], 0
    while todo and walked <= limit:
        n = todo.pop(0)
        if not isinstance(n, fx.Node) or n.op != "call_function":
            continue
        if _val_dtype(n) == "e8m0":
            return n
        walked += 1
        todo.extend(n.all_input_nodes)
    return None


def _mx_parts(operand: Any) -> tuple[Any, Any, Any, str] | None:
    """(the ``mul``, its values factor, its scale factor, the FP8 format) when ``operand`` is
    torchao's emulated MX dequantization (FP8 values cast up, times the power of two its E8M0
    scales give, reshaped), else None: found by data flow."""
    mul = _through_views(operand)
    if _opname(mul) != "mul":
        return None
    factors = [_through_views(f) for f in mul.args[:2]]
    for values, scale in (factors, factors[::-1]):
        fmt = _val_dtype(values.args[0]) if _opname(values) == "_to_copy" else None
        if fmt in ("e4m3", "e5m2") and _e8m0_source(scale) is not None:
            return mul, values, scale, fmt
    return None


def _mx_dequantized(operand: Any) -> str | None:
    """``e4m3 mx-1x32`` when ``operand`` is torchao's emulated MX dequantization, else None."""
    parts = _mx_parts(operand)
    return None if parts is None else f"{parts[3]} mx-1x32"


def _post_scales(n: fx.Node) -> list[Any]:
    """What a ``_scaled_mm``'s output is multiplied by in place (torchao's ``output *=
    post_inverse_scale``), if anything."""
    return [u.args[1] for u in n.users if _opname(u) in ("mul", "mul_") and u.args[0] is n]


def _role(n: fx.Node, out: str) -> tuple[str, tuple[str, ...]]:
    name = getattr(n.target, "_opname", str(n.target))
    if name in ("_scaled_mm", "_scaled_grouped_mm"):
        a, b, sa, sb = n.args[:4]
        post = _post_scales(n)
        if _opname(sa) in CONSTANTS and len(post) == 1 and _opname(post[0]) == "mul":
            # torchao's rowwise GEMM without fast accumulation: ones here, and the output
            # multiplied after by a's scales times b's (``a_inverse_scale * b_inverse_scale``).
            sa, sb = post[0].args[:2]
        return "gemm-fp8", (_scaling(sa, a), _scaling(sb, b))
    if name in GEMM_OPS:
        # mm/bmm take their matrices last (addmm's first argument is the bias), a grouped
        # GEMM first (its group offsets follow).
        operands = n.args[:2] if name in GROUPED else n.args[-2:]
        mats = {_val_dtype(a) for a in operands}
        if len(mats) > 1:
            # Fake kernels accept mm(bf16, fp32); the real CPU and CUDA kernels raise (a dense
            # mx_mm dequantizes each operand to its own dtype: a bf16 input, an fp32 weight).
            return "gemm-mixed", ()
        mx = [_mx_dequantized(a) for a in operands]
        if all(mx):
            # torchao's emulated MXFP8 kernel: both operands quantized, then dequantized
            # for this GEMM (where an SM100 GPU runs the scaled GEMM on them).
            return "gemm-mx-emulated", tuple(m for m in mx if m)
        return f"gemm-{out}", ()
    if name == "_to_copy" and out in FP8_DTYPES.values():
        return "cast-fp8", ()
    return "other", ()


def _walk_back(start: Any, stop: set[str], until: str = "", limit: int = 64,
               leaves: frozenset[str] = frozenset()) -> set[str]:
    """Names of ``start`` and its ancestors, up to (and with) an ``until`` op, not past
    ``stop`` nor past a ``leaves`` op; empty when more than ``limit`` nodes would be marked
    (not torchao's ``to_mx``)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        if not isinstance(n, fx.Node) or n.op != "call_function" or n.name in seen | stop:
            continue
        seen.add(n.name)
        if len(seen) > limit:
            return set()
        if _opname(n) != until and _opname(n) not in leaves:
            todo.extend(n.all_input_nodes)
    return seen


def _fp8_cast(operand: Any, limit: int = 16) -> Any:
    """The cast to FP8 a ``_scaled_mm`` operand's values come from, past the views and copies
    that keep them FP8 (torchao's ``t().contiguous().t()``), or None."""
    n = operand
    for _ in range(limit):
        if not isinstance(n, fx.Node) or n.op != "call_function" or not n.args:
            return None
        if _val_dtype(n) not in ("e4m3", "e5m2"):
            return None
        if _opname(n) == "_to_copy" and _val_dtype(n.args[0]) not in ("e4m3", "e5m2"):
            return n
        n = n.args[0]
    return None


def _scale_roles(gm: fx.GraphModule) -> dict[str, str]:
    """By data flow, not op name: ``scale`` for the nodes that compute a ``_scaled_mm``'s
    scales (from the operand's ``abs`` and amax to 448/amax, rounding and the reciprocal the
    GEMM takes), ``scaling`` for those that scale and clamp the operand before its cast to FP8.

    Each walk runs from the GEMM's own scale and operand back to the operand's high-precision
    values and stops there: in the backward, where no module's call bounds the graph, a walk
    over all ancestors would take every gradient computed before.
    """
    roles: dict[str, str] = {}
    nodes = {n.name: n for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        if _opname(n) != "_scaled_mm":
            continue
        # torchao's rowwise GEMM without fast accumulation (its backward's) passes ones
        # (``new_ones``, no data flow) and scales the output after: ``output *= a_inv * b_inv``.
        scales: set[str] = set()
        for start in [*n.args[2:4], *_post_scales(n)]:
            scales |= _walk_back(start, set(), until="abs", leaves=CONSTANTS)
        sources = {nodes[m].args[0].name for m in scales if _opname(nodes[m]) == "abs"}
        roles.update(dict.fromkeys(scales, "scale"))
        for operand in n.args[:2]:
            cast = _fp8_cast(operand)
            if cast is not None:
                # The cast keeps its own role (cast-fp8); what feeds it is the scaling.
                for m in _walk_back(cast.args[0], scales | sources):
                    roles.setdefault(m, "scaling")
    return roles


def _mx_roles(gm: fx.GraphModule) -> dict[str, str]:
    """For each emulated MX GEMM's operands, by data flow: ``scale`` for torchao's ``to_mx``
    nodes from the block's ``abs``/``amax`` to the E8M0 scale, ``scaling`` for those that scale
    and clamp the values before their FP8 cast, ``dequant`` for the casts back to bf16."""
    roles: dict[str, str] = {}
    for n in gm.graph.nodes:
        name = _opname(n)
        if name not in GEMM_OPS or name == "_scaled_mm":
            continue
        for operand in n.args[:2] if name in GROUPED else n.args[-2:]:
            if _mx_dequantized(operand) is None:
                continue
            mul, cast, factor, _fmt = _mx_parts(operand)  # type: ignore[misc]
            scale = _e8m0_source(factor)
            values = cast.args[0]
            scales = _walk_back(scale, set(), until="abs")
            sources = {a.args[0].name for a in gm.graph.nodes
                       if a.name in scales and _opname(a) == "abs"}
            roles.update(dict.fromkeys(scales, "scale"))
            # The FP8 cast keeps its own role (cast-fp8); what feeds it is the scaling.
            for m in _walk_back(values, scales | sources) - {values.name}:
                roles.setdefault(m, "scaling")
            # The dequantization: the mul, the values' cast up, the scale's power of two.
            for m in _walk_back(factor, {scale.name}) | {mul.name, cast.name}:
                roles.setdefault(m, "dequant")
    return roles


def annotate(gm: fx.GraphModule) -> list[Fp8Node]:
    """Each call node of a traced graph as an :class:`Fp8Node` (module from the hooks' marks).

    A node with no module mark comes after the forward: the backward (or the loss).
    """
    out = []
    flow = {**_mx_roles(gm), **_scale_roles(gm)}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        val = n.meta.get("val")
        dtype_out = short(val.dtype) if isinstance(val, torch.Tensor) else "-"
        role, scaling = _role(n, dtype_out)
        if role == "other":
            role = flow.get(n.name, role)
        module = n.meta.get("fp8_module")
        phase = "forward" if n.meta.get("fp8_forward") else "backward"
        ins = tuple(d for d in (_val_dtype(a) for a in n.args) if d is not None)
        op = getattr(n.target, "_opname", str(n.target))
        out.append(Fp8Node(n.name, op, module or "", phase, role, ins, dtype_out, scaling))
    return out


@contextmanager
def _marking(module: nn.Module) -> Iterator[list[Any]]:
    """Forward hooks that mark the nodes each module's call adds to the graph being traced.

    The innermost module marks first (its hook ends first), so a node keeps its innermost
    module; the yielded list collects the graphs seen.
    """
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    starts: dict[int, list[Any]] = {}
    graphs: list[Any] = []

    def pre(mod: nn.Module, _args: Any) -> None:
        mode = get_proxy_mode()
        if mode is not None:
            graph = mode.tracer.graph
            starts.setdefault(id(mod), []).append(next(reversed(graph.nodes)))

    def post(fqn: str) -> Any:
        def hook(mod: nn.Module, _args: Any, _out: Any) -> None:
            mode = get_proxy_mode()
            if mode is None or not starts.get(id(mod)):
                return
            node = starts[id(mod)].pop().next
            graphs.append(mode.tracer.graph)
            while node.op != "root":
                node.meta.setdefault("fp8_module", fqn)
                node.meta["fp8_forward"] = True
                node = node.next
        return hook

    handles = []
    for fqn, mod in module.named_modules():
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post(fqn or "(root)")))
    try:
        yield graphs
    finally:
        for h in handles:
            h.remove()


def _fake_inputs(module: nn.Module, model: ModelInputs,
                 named: dict[str, torch.Tensor] | None = None) -> tuple[Any, ...]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    if named is None:
        named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    with mode:
        state = {
            k: torch.empty(v.shape, dtype=v.dtype, device="cpu", requires_grad=v.requires_grad)
            for k, v in named.items()
        }

    def fake(x: Any) -> Any:
        return mode.from_tensor(x.to("cpu")) if isinstance(x, torch.Tensor) else x

    return state, tuple(fake(a) for a in model.args), {k: fake(v) for k, v in model.kwargs.items()}


def first_tensor(out: Any) -> torch.Tensor:
    """The first floating tensor of a model's output (HF's logits), for the loss."""
    from torch.utils._pytree import tree_leaves

    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    raise TypeError("the model returned no floating tensor to take a loss of")


#: The seed of the loss's projection: fixed, so the traced, the checked and the ranged backward
#: differentiate the same loss whatever ``--seed`` gave the weights.
LOSS_SEED = 0


def train_loss(out: Any) -> torch.Tensor:
    """The loss ``--pass train`` differentiates: the model's own when it returns one (an output
    named ``loss``, as Hugging Face models do when the inputs carry labels), else the mean of the
    first floating output times a fixed-seed standard normal tensor of its shape.

    The projection's gradient is what a real loss's is and a sum's is not: every output element
    gets its own zero-mean value (a sum sends all ones, so the last Linear's ``grad_output`` has
    one value and its FP8 scales see none of a real gradient's spread), deterministic, and
    scaled as a mean-reduced loss's (one over the elements).

    >>> y = torch.ones(2, 3, requires_grad=True)
    >>> g, = torch.autograd.grad(train_loss(y), [y])
    >>> bool((g != g[0, 0]).any()), torch.equal(g, torch.autograd.grad(train_loss(y), [y])[0])
    (True, True)
    """
    own = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(own, torch.Tensor) and own.is_floating_point() and own.numel() == 1:
        return own.float().reshape(())
    y = first_tensor(out).float()
    gen = torch.Generator().manual_seed(LOSS_SEED)
    return (y * torch.randn(y.shape, generator=gen, device=y.device)).mean()


def _mx_training_refusal(recipe: Fp8Recipe, exc: AssertionError) -> SettingError | None:
    """torchao's MXFP8 training refusing to run, as one line: its AUTO kernels (SM100 GEMMs, the
    Triton casts) or a dimension no multiple of 32; None for any other assertion."""
    from ampgraph.fp8 import moe

    text = str(exc)
    if recipe.name not in MOE_NAMES:
        return None
    if "SM100" in text:
        return SettingError(f"{recipe.spelling}: {moe.SM100}")
    if "needs triton" in text:
        return SettingError(f"{recipe.spelling}: {moe.TRITON}")
    if "divisible by block_size" in text:
        return SettingError(f"{recipe.spelling}: {moe.TOKENS} ({text})")
    return None


@in_analysis_environment
def trace_fp8(model: ModelInputs, recipe: Fp8Recipe, *, train: bool = False) -> Fp8Graph:
    """Convert ``model`` with torchao, trace it on fake tensors under CPU bf16 autocast.

    The trace is an analysis: its fake tensors run ampgraph's meta kernels, which type as the
    real kernels do (:mod:`ampgraph.capture.meta_kernels`; a MoE's experts left in fp32 run
    ``torch._grouped_mm`` on fp32 operands, which the CPU kernel runs and torch 2.14's meta
    kernel refuses), and torch's own are back after it.

    ``train`` traces forward + :func:`train_loss` + ``torch.autograd.grad`` of the parameters
    (the backward outside autocast, as PyTorch's AMP recipe runs it).

    >>> m = ModelInputs("mlp", nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)),
    ...                 (torch.randn(8, 32),))
    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> g = trace_fp8(m, parse_fp8_recipe("torchao:tensorwise"), train=True)
    >>> [(n.module, n.dtype_in[:2]) for n in g.gemms("forward")]
    [('0', ('e4m3', 'e4m3')), ('2', ('e4m3', 'e4m3'))]
    >>> sorted({n.dtype_in[:2] for n in g.gemms("backward")})  # grad_output is e5m2
    [('e5m2', 'e4m3')]
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    plans = plan_model(model.module, recipe)
    converted = convert(model.module, recipe)
    # MX: each MXTensor weight (MoE: each MXFP8 training wrapper) enters as its inner tensors
    # and is rebuilt inside the trace, so torchao's dispatch on it (activation quantization,
    # GEMM; the MoE's autograd function, forward and backward) is traced too.
    mx = recipe.name in MX_NAMES + MOE_NAMES
    if recipe.name in MX_NAMES and train:
        raise SettingError(f"{recipe.spelling}: {MX_GRAPH}; give --pass forward")
    named = {**dict(converted.named_parameters()), **dict(converted.named_buffers())}
    flat, subclasses = flatten(named) if mx else (named, {})
    state, args, kwargs = _fake_inputs(converted, model, flat)

    def forward(state: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        full = unflatten(state, subclasses)
        with torch.autocast("cpu", torch.bfloat16):
            out = torch.func.functional_call(converted, full, args, kwargs)
        if not train:
            return out
        params = [v for v in full.values() if v.requires_grad]
        return out, torch.autograd.grad(train_loss(out), params, allow_unused=True)

    import logging

    # A fake kernel that refuses its operands is logged by torch before it raises: the
    # SettingError below says it in one line.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    was, fake_log.disabled = fake_log.disabled, recipe.name in MOE_NAMES
    try:
        with _marking(converted):
            gm = make_fx(forward, tracing_mode="fake")(state, args, kwargs)
    except AssertionError as exc:
        refused = _mx_training_refusal(recipe, exc)
        if refused is not None:
            raise refused from None
        raise
    except RuntimeError as exc:
        # ampgraph's _grouped_mm kernel refuses what the CPU kernel refuses, in its words: a
        # mix of dtypes as mm does, any other operand as _grouped_mm_validate_inputs does.
        text = str(exc).splitlines()[0]
        mixed = "to have the same dtype" in text
        if recipe.name in MOE_NAMES and (mixed or "mat_" in text):
            from ampgraph.fp8.moe import MIXED_GROUPED

            why = MIXED_GROUPED if mixed else "torch._grouped_mm refuses its operands"
            raise SettingError(f"{recipe.spelling}: {why} ({text})") from None
        raise
    finally:
        fake_log.disabled = was
    return Fp8Graph(recipe, plans, annotate(gm), gm)


@dataclass(frozen=True)
class FlowStep:
    """One node of a module's forward flow (``ampgraph fp8 --dot`` draws it): its op (a node
    that is no call, its name), the dtype it makes (empty where it makes no tensor), its role,
    and the nodes it reads."""

    name: str
    op: str
    dtype: str
    role: str
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModuleFlow:
    """One module's forward nodes in graph order (torchao's amax, scale arithmetic, casts to FP8
    and ``_scaled_mm``), and the nodes outside it they read, by name
    (:func:`ampgraph.formats.fp8.flow_dot` draws them)."""

    module: str
    steps: tuple[FlowStep, ...]
    sources: dict[str, FlowStep]


def _step(n: fx.Node, roles: dict[str, str]) -> FlowStep:
    val = n.meta.get("val")
    dtype = short(val.dtype) if isinstance(val, torch.Tensor) else ""
    op = getattr(n.target, "_opname", str(n.target)) if n.op == "call_function" else n.name
    return FlowStep(n.name, op, dtype, roles.get(n.name, ""),
                    tuple(a.name for a in n.all_input_nodes))  # fmt: skip


def module_flow(graph: Fp8Graph, module: str) -> ModuleFlow:
    """The forward nodes ``module``'s call added, and what they read from outside it.

    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> from ampgraph.model.build import ModelInputs
    >>> mlp = ModelInputs("mlp", nn.Sequential(nn.Linear(32, 32)), (torch.randn(16, 32),))
    >>> flow = module_flow(trace_fp8(mlp, parse_fp8_recipe("torchao:tensorwise")), "0")
    >>> [s.op for s in flow.steps if s.role == "gemm-fp8"], len(flow.sources) > 0
    (['_scaled_mm'], True)
    """
    roles = {n.name: n.role for n in graph.nodes}
    inside = [n for n in graph.graph.graph.nodes if n.meta.get("fp8_module") == module
              and n.op == "call_function"]  # fmt: skip
    names = {n.name for n in inside}
    sources = {a.name: _step(a, roles) for n in inside for a in n.all_input_nodes
               if a.name not in names}  # fmt: skip
    return ModuleFlow(module, tuple(_step(n, roles) for n in inside), sources)
