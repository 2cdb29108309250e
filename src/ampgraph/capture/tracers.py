"""Tracers: what turns a model into the torch.fx graph that ampgraph analyses (``--tracer``).

========== ================================================================================
tracer     what it does
========== ================================================================================
make-fx    the graph ``torch.export`` makes of the model itself, in each setting, traced by
           ``make_fx`` and export's own passes in half the time (the default; see
           :mod:`ampgraph.capture.trace`).
export     ``torch.export.export`` on the model itself, in each setting: the same graph.
hf-fx      Hugging Face's FX tracer (``transformers.utils.fx.symbolic_trace``; transformers
           before 4.50 only), once per model, then lowered to ATen by ``torch.export``.
fx         ``torch.fx.symbolic_trace``, once per model, then lowered the same way: for simple
           modules without data-dependent Python control flow.
========== ================================================================================

Why lower: the later stages replay an ATen-level graph (the level autocast dispatches on), and a
torch-level FX graph says ``call_module fc1`` or ``getattr(x, 'dtype')`` instead. A tracer's graph
is run by an ``fx.Interpreter`` inside ``torch.export`` (see :class:`GraphForward`), so

* the *ops and control flow* are the tracer's: the graph the FX tracer recorded, with its
  branches resolved when it traced (fp32, no autocast), is what gets lowered, node by node;
* the *dtypes* are the setting's: FX graphs keep dtypes symbolic (``getattr(x, 'dtype')`` nodes),
  so they are evaluated again in each setting, as the export tracer does;
* every ATen node keeps the ``nn_module_stack`` of the FX node it came from, rewritten to
  export's per-call keys, so module paths and classes read as with the export tracer
  (including modules the FX tracer traced through, such as GPT-2's ``Conv1D``).

A branch the FX tracer took on a dtype (``if x.dtype == torch.float16:``) stays the fp32 branch
in every setting: that is what an FX-traced graph is. :attr:`Capture.method` says which tracer
made a capture (``hf-fx+export``).

>>> from ampgraph.model.build import ModelInputs
>>> model = ModelInputs("mlp", nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
>>> lowered = apply_tracer(model, "fx")
>>> lowered.module.tracer, type(lowered.module).__name__
('fx', 'GraphForward')
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

import torch
import torch.fx.traceback as fx_traceback
from torch import fx, nn

from ampgraph.errors import CaptureError, first_line
from ampgraph.model.build import ModelInputs
from ampgraph.torchutil import quiet_logging, simulated_cuda_amp

MAKE_FX = "make-fx"
EXPORT = "export"
HF_FX = "hf-fx"
FX = "fx"
#: transformers removed ``transformers.utils.fx`` in 4.50 (DESIGN.md fact 1).
HF_FX_MAX_TRANSFORMERS = "4.50"


@dataclass(frozen=True)
class Tracer:
    """One tracer: its name, a one-line description, and the function that traces (None: export)."""

    name: str
    description: str
    trace: Callable[[ModelInputs], fx.GraphModule] | None


def _one_line(exc: BaseException) -> str:
    message = first_line(exc, default="")
    # The HF tracer appends every class it supports: "Model X is not supported yet, supported
    # models: AlbertForMaskedLM, ...". The first clause is the news.
    message = message.split(", supported models:")[0]
    return f"{type(exc).__name__}: {message[:160]}".rstrip(": ")


def hf_fx_available() -> bool:
    """Whether the installed transformers still has its FX tracer (before 4.50).

    >>> isinstance(hf_fx_available(), bool)
    True
    """
    try:
        return importlib.util.find_spec("transformers.utils.fx") is not None
    except (ImportError, ValueError):
        return False


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "not installed"
    return str(transformers.__version__)


def enter_autocast(
    device_type: str, dtype: torch.dtype | None, enabled: bool, cache_enabled: bool | None
) -> torch.autocast:
    """Graph node target: enter an autocast region as ``with torch.autocast(...)`` does.

    Run inside ``torch.export``, entering a real ``torch.autocast`` is what model code does, so
    export records the region (``wrap_with_autocast``) exactly as for the original forward.
    """
    mode = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    mode.__enter__()
    return mode


def exit_autocast(mode: torch.autocast) -> None:
    """Graph node target: leave the region :func:`enter_autocast` entered."""
    mode.__exit__(None, None, None)


@contextlib.contextmanager
def recording_autocast(tracer: fx.Tracer) -> Iterator[None]:
    """Record ``with torch.autocast(...)`` regions as graph nodes while an FX tracer runs.

    FX tracers run the forward as Python, so a context manager takes effect at trace time and
    leaves nothing in the graph: Llama's fp32 rotary embedding or seed 002's fp32 wrapper would
    vanish. Here entering and leaving one also emits :func:`enter_autocast` / :func:`exit_autocast`
    nodes, which the lowering runs for real. CUDA autocast is taken as available (as in capture),
    so a ``torch.autocast("cuda")`` region is recorded as the model asks, not disabled.
    """
    cls = torch.amp.autocast_mode.autocast
    original_enter, original_exit = cls.__enter__, cls.__exit__

    def enter(self: Any) -> Any:
        result = original_enter(self)
        args = (self.device, self.fast_dtype, self._enabled, self._cache_enabled)
        self._ampgraph_proxy = tracer.create_proxy("call_function", enter_autocast, args, {})
        return result

    def exit_(self: Any, *exc: Any) -> Any:
        proxy = getattr(self, "_ampgraph_proxy", None)
        if proxy is not None:
            tracer.create_proxy("call_function", exit_autocast, (proxy,), {})
        return original_exit(self, *exc)

    with simulated_cuda_amp("cuda"), mock.patch.object(cls, "__enter__", enter), \
            mock.patch.object(cls, "__exit__", exit_):  # fmt: skip
        yield


def _no_meta(*args: Any) -> None:
    return None


#: GraphModule.meta key: module paths where the HF tracer decided a branch on a dtype.
DTYPE_BRANCHES = "ampgraph_dtype_branches"


def _reads_dtype(node: fx.Node) -> bool:
    """Whether a node compares dtypes: ``x.dtype`` among its inputs, or a dtype constant."""
    if any(isinstance(a, torch.dtype) for a in torch.utils._pytree.tree_leaves((node.args,))):
        return True
    return any(
        a.op == "call_function" and a.target is getattr and a.args[1:2] == ("dtype",)
        for a in node.all_input_nodes
    )


@contextlib.contextmanager
def recording_dtype_branches(proxy_class: type[fx.Proxy], found: list[str]) -> Iterator[None]:
    """Note where a tracer that resolves control flow from metadata branches on a dtype.

    The HF tracer answers ``if x.dtype == torch.float16:`` from its meta values, computed once
    in fp32 without autocast, and records only the branch it took. Each such decision is noted
    by module path, so that a report can say which parts of the graph may differ in a setting
    whose dtypes would take the other branch (T5's ``T5LayerNorm`` casts to a 16-bit weight's
    dtype; ``--tracer export`` traces every setting and takes the right one).
    """
    original = proxy_class.__bool__

    def bool_(self: Any) -> bool:
        value = original(self)
        if _reads_dtype(self.node):
            stack = list(getattr(self.tracer, "module_stack", {}).values())
            path = stack[-1][0] if stack else ""
            if path not in found:
                found.append(path)
        return value

    with mock.patch.object(proxy_class, "__bool__", bool_):
        yield


#: Node metadata keys: module calls the FX tracer traced through, whose hooks the lowering runs.
CALL_STARTS = "ampgraph_call_starts"
CALL_ENDS = "ampgraph_call_ends"


def _first_node(value: Any) -> fx.Node | None:
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, fx.Proxy):
            return leaf.node
    return None


def _region_tracer(base: type[fx.Tracer]) -> type[fx.Tracer]:
    """``base`` with :func:`recording_autocast` around its ``trace``, and a note of every module
    call it traces through (its first and last node, first input and first output)."""

    class RegionTracer(base):  # type: ignore[misc,valid-type]
        def trace(self, root: Any, *args: Any, **kwargs: Any) -> fx.Graph:
            with recording_autocast(self):
                return super().trace(root, *args, **kwargs)

        def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
            path = self.path_of_module(m)
            if self.is_leaf_module(m, path):
                return super().call_module(m, forward, args, kwargs)
            before = self.graph._root.prev  # the graph's last node so far
            out = super().call_module(m, forward, args, kwargs)
            first, last = before.next, self.graph._root.prev
            if first is not self.graph._root and last is not before:
                inp, result = _first_node(args), _first_node(out)
                first.meta.setdefault(CALL_STARTS, []).append((path, inp))
                last.meta.setdefault(CALL_ENDS, []).insert(0, (path, inp, result))
            return out

    return RegionTracer


def trace_hf_fx(model: ModelInputs) -> fx.GraphModule:
    """Trace a Hugging Face model with ``transformers.utils.fx.symbolic_trace``.

    The tensor keyword inputs are the traced inputs; the rest (``use_cache=False``) are left to
    the tracer, which turns the cache off itself.
    """
    if not hf_fx_available():
        raise CaptureError(
            f"--tracer hf-fx needs transformers < {HF_FX_MAX_TRANSFORMERS} (installed: "
            f"{_transformers_version()}, which has no transformers.utils.fx): run it where "
            "transformers==4.45.2 is installed (scripts/hf_fx_env.sh makes such an overlay, "
            ".venv-hf45: PYTHONPATH=.venv-hf45) or use --tracer export"
        )
    from transformers import PreTrainedModel
    from transformers.utils import fx as hf_fx

    if not isinstance(model.module, PreTrainedModel) or model.args:
        raise CaptureError(
            f"--tracer hf-fx traces Hugging Face models fed by keyword, and {model.name!r} is "
            f"{type(model.module).__name__}: use --tracer fx or --tracer export"
        )
    names = [k for k, v in model.kwargs.items() if isinstance(v, torch.Tensor)]
    config = model.module.config
    use_cache = getattr(config, "use_cache", None)
    try:
        # HFTracer computes each node's metadata by calling its target on meta values: the
        # region markers must not enter a real autocast region while tracing.
        no_meta = {enter_autocast: _no_meta, exit_autocast: _no_meta}
        branches: list[str] = []
        with warnings.catch_warnings(), quiet_logging(), \
                mock.patch.dict(hf_fx._MANUAL_META_OVERRIDES, no_meta), \
                recording_dtype_branches(hf_fx.HFProxy, branches):  # fmt: skip
            warnings.simplefilter("ignore")
            traced = hf_fx.symbolic_trace(
                model.module, input_names=names, tracer_cls=_region_tracer(hf_fx.HFTracer)
            )
        traced.meta[DTYPE_BRANCHES] = tuple(branches)
        return traced
    except Exception as exc:  # noqa: BLE001 - the tracer raises many types; all mean "not traced"
        raise CaptureError(
            f"Hugging Face's FX tracer could not trace {model.name!r} "
            f"({type(model.module).__name__}): {_one_line(exc)}; use --tracer export"
        ) from None
    finally:
        # symbolic_trace turns use_cache off in the caller's config: put it back.
        if use_cache is not None:
            config.use_cache = use_cache


def trace_fx(model: ModelInputs) -> fx.GraphModule:
    """Trace with ``torch.fx.symbolic_trace``; non-tensor keyword inputs become constants."""
    concrete = {k: v for k, v in model.kwargs.items() if not isinstance(v, torch.Tensor)}
    try:
        with warnings.catch_warnings(), quiet_logging():
            warnings.simplefilter("ignore")
            tracer = _region_tracer(fx.Tracer)()
            graph = tracer.trace(model.module, concrete_args=concrete or None)
            return fx.GraphModule(tracer.root, graph, type(model.module).__name__)
    except Exception as exc:  # noqa: BLE001 - data-dependent control flow, unsupported Python
        raise CaptureError(
            f"torch.fx.symbolic_trace could not trace {model.name!r}: {_one_line(exc)}; "
            "use --tracer export (or --tracer hf-fx for Hugging Face models)"
        ) from None


TRACERS: dict[str, Tracer] = {
    MAKE_FX: Tracer(
        MAKE_FX, "torch.export's graph, traced by make_fx and export's passes (default)", None
    ),
    EXPORT: Tracer(EXPORT, "torch.export.export in each setting", None),
    HF_FX: Tracer(
        HF_FX, "Hugging Face's FX tracer (transformers < 4.50), lowered by export", trace_hf_fx
    ),
    FX: Tracer(FX, "torch.fx.symbolic_trace for simple modules, lowered by export", trace_fx),
}


def _type_name(cls: Any) -> str:
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return str(cls)


def number_module_calls(graph: fx.Graph) -> None:
    """Rewrite FX ``nn_module_stack`` metadata to export's form: one key per module *call*.

    The FX tracers key the stack by module path, so two calls of one module share a key; export
    keys the second call ``path@1``. A call starts where a path enters the stack, and every
    ``call_module`` node is a call of its own (a leaf called twice in a row is two calls).
    """
    counts: dict[str, int] = {}
    open_keys: dict[str, str] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            open_keys.clear()
            continue
        paths = [path for path, _cls in stack.values()]
        for path in [p for p in open_keys if p not in paths]:
            del open_keys[path]
        leaf = paths[-1] if node.op == "call_module" else None
        new: dict[str, tuple[str, str]] = {}
        for path, cls in stack.values():
            if path not in open_keys or path == leaf:
                n = counts.get(path, 0)
                counts[path] = n + 1
                open_keys[path] = path if n == 0 else f"{path}@{n}"
            new[open_keys[path]] = (path, _type_name(cls))
        if leaf is not None:
            del open_keys[leaf]  # the next node, even a call of the same leaf, is a new call
        node.meta["nn_module_stack"] = new


class _MetaInterpreter(fx.Interpreter):
    """Run a graph over a module's attributes, falling back to the traced GraphModule's own
    (tensor constants the FX tracer stored on it).

    Modules the FX tracer traced through (GPT-2's ``Conv1D``, Llama's rotary embedding) are never
    called here, so their forward hooks would not fire; the interpreter runs them where the call
    began and ended, with its first input and output, so that whatever hooks the original
    model's modules (ampgraph's own hook view among them) sees every call as in eager mode.
    """

    def __init__(self, module: nn.Module, graph: fx.Graph, traced: fx.GraphModule) -> None:
        # Values are kept: a hook may want a call's input after its last use in the graph.
        super().__init__(module, garbage_collect_values=False, graph=graph)
        self.traced = traced

    def run_node(self, n: fx.Node) -> Any:
        for path, inp in n.meta.get(CALL_STARTS, ()):
            mod = self.module.get_submodule(path)
            args = (self.env[inp],) if inp is not None else ()
            for hook_id, hook in list(mod._forward_pre_hooks.items()):
                if hook_id in mod._forward_pre_hooks_with_kwargs:
                    hook(mod, args, {})
                else:
                    hook(mod, args)
        value = super().run_node(n)
        for path, inp, out in n.meta.get(CALL_ENDS, ()):
            mod = self.module.get_submodule(path)
            args = (self.env[inp],) if inp is not None else ()
            result = self.env.get(out, value) if out is not None else None
            for hook_id, hook in list(mod._forward_hooks.items()):
                if hook_id in mod._forward_hooks_with_kwargs:
                    hook(mod, args, {}, result)
                else:
                    hook(mod, args, result)
        return value

    def fetch_attr(self, target: str) -> Any:
        try:
            return super().fetch_attr(target)
        except AttributeError:
            return fx.Interpreter.fetch_attr(_Fetcher(self.traced), target)


class _Fetcher:
    """The one attribute fx.Interpreter.fetch_attr reads from ``self``."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module


class GraphForward(nn.Module):
    """A module whose forward runs a tracer's FX graph over the original model's own modules.

    Its submodules, parameters and buffers *are* the original model's (shared, not copied), so
    qualified names, module classes and tied weights stay as they are, and capture's fake-tensor
    swap reaches them. Its forward takes the traced inputs by name and runs the graph node by node
    with each node's metadata current, so that ``torch.export`` copies every FX node's
    ``nn_module_stack`` onto the ATen nodes it lowers to.
    """

    def __init__(self, original: nn.Module, traced: fx.GraphModule, tracer: str) -> None:
        super().__init__()
        #: The tracer that traced the graph (:attr:`Capture.method` reads ``hf-fx+export``).
        self.tracer = tracer
        #: Module paths where that tracer decided a Python branch on a dtype once, at its trace
        #: time (hf-fx traces in fp32 without autocast): other settings may take the other branch.
        self.dtype_branches: tuple[str, ...] = tuple(traced.meta.get(DTYPE_BRANCHES, ()))
        # Share the original's tables: named_modules()/named_parameters() read as the original.
        self.__dict__["_modules"] = original._modules
        self.__dict__["_parameters"] = original._parameters
        self.__dict__["_buffers"] = original._buffers
        self.__dict__["_traced"] = traced  # not a submodule: its copies would be found twice
        self.__dict__["_original_type"] = type(original)
        self.input_names = [n.target for n in traced.graph.nodes if n.op == "placeholder"]

    def forward(self, **inputs: Any) -> Any:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise TypeError(f"missing traced inputs: {', '.join(missing)}")
        traced: fx.GraphModule = self.__dict__["_traced"]
        with fx_traceback.preserve_node_meta():
            interp = _MetaInterpreter(self, traced.graph, traced)
            return interp.run(*(inputs[n] for n in self.input_names))


def _bound_inputs(model: ModelInputs, traced: fx.GraphModule) -> dict[str, Any]:
    """The example inputs keyed by the traced graph's placeholder names."""
    try:
        bound = inspect.signature(model.module.forward).bind_partial(*model.args, **model.kwargs)
    except TypeError as exc:
        raise CaptureError(f"example inputs do not fit {model.name!r}'s forward: {exc}") from None
    values = dict(bound.arguments)
    out: dict[str, Any] = {}
    for node in traced.graph.nodes:
        if node.op != "placeholder":
            continue
        name = str(node.target).lstrip("*")
        # torch.fx names the placeholder of a concrete (non-tensor) argument ``name_<n>``.
        base = re.sub(r"_\d+$", "", name)
        if name in values or base in values:
            out[node.target] = values[name if name in values else base]
        elif node.args:  # a placeholder with a default: the traced forward's own default
            out[node.target] = node.args[0]
        else:
            raise CaptureError(
                f"the traced graph of {model.name!r} wants input {name!r} that the example "
                "inputs do not give: pass it (factory example inputs) or use --tracer export"
            )
    return out


def apply_tracer(model: ModelInputs, tracer: str = EXPORT) -> ModelInputs:
    """Trace ``model`` with ``tracer`` once; the result is captured per setting like any model.

    For ``export`` the model is returned as it is. Otherwise its module becomes a
    :class:`GraphForward` over the traced graph, which remembers the tracer, so that
    :attr:`Capture.method` reads ``hf-fx+export``. The analysis calls this
    (:func:`ampgraph.analyze`'s ``tracer``); the loader never does.

    >>> import torch
    >>> m = ModelInputs("lin", torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    >>> apply_tracer(m, "fx").module.tracer
    'fx'
    """
    if tracer not in TRACERS:
        raise CaptureError(f"unknown tracer {tracer!r}: use one of {', '.join(TRACERS)}")
    chosen = TRACERS[tracer]
    if isinstance(model.module, GraphForward):
        return model  # a tracer's graph is traced once
    if chosen.trace is None:
        return replace(model, engine=tracer)  # make-fx and export trace in each setting
    traced = chosen.trace(model)
    number_module_calls(traced.graph)
    inputs = _bound_inputs(model, traced)
    return replace(model, module=GraphForward(model.module, traced, tracer), args=(), kwargs=inputs)


def traced_by(model: ModelInputs) -> tuple[str, tuple[str, ...]]:
    """The tracer that traced ``model`` and where it fixed a dtype branch (export: none).

    >>> import torch
    >>> traced_by(ModelInputs("lin", torch.nn.Linear(4, 4)))
    ('export', ())
    """
    module = model.module
    if isinstance(module, GraphForward):
        return module.tracer, module.dtype_branches
    return EXPORT, ()


__all__ = [
    "TRACERS",
    "GraphForward",
    "Tracer",
    "apply_tracer",
    "hf_fx_available",
    "number_module_calls",
    "trace_fx",
    "trace_hf_fx",
    "traced_by",
]
