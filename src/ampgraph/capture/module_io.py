"""The module IO recorder: which graph node each leaf module call took in and gave back first.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
>>> with ModuleIORecorder(model) as recorder:
...     gm = make_fx(model)(torch.ones(1, 2))
>>> recorder.resolve(gm)
{'0': [('arg0_1', 'addmm')], '1': [('addmm', 'relu')]}
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from ampgraph.errors import first_line
from ampgraph.torchutil import dtype_name, traced_node

#: In :attr:`Capture.module_io`: the hook's value is no tensor (a detector's ``transform`` takes a
#: list of images and returns an ``ImageList``), so its hook prints ``None``; not "unknown".
NO_TENSOR = ""

#: ``graph_module.meta`` key of what each leaf call's hook saw while that graph was traced
#: (:meth:`ModuleIORecorder.observed`), kept with the graph it was traced with for the check.
HOOK_DTYPES = "ampgraph_hook_dtypes"


def _hook_tensor(value: Any) -> torch.Tensor | None:
    """The tensor whose dtype the seed's hook prints for ``value`` (None: no tensor). Its dtype
    is read after the trace: a read during it would count as the code reading its setting
    (:mod:`ampgraph.capture.reads`), and keep the graph from serving other settings."""
    value = _hook_value(value)
    return value if isinstance(value, torch.Tensor) else None


def error_line(exc: BaseException) -> str:
    """One line for an exception that stopped a trace: its type and its message's first line.

    >>> error_line(RuntimeError("expected dtype\\nsecond line"))
    'RuntimeError: expected dtype'
    """
    return f"{type(exc).__name__}: {first_line(exc, default='')}".rstrip(": ")


def _hook_value(value: Any) -> Any:
    """What the seed's hook reads of a call's input or output: its first item if a tuple or list
    (as :func:`ampgraph.verify.hooks.first_dtype` reads it)."""
    return value[0] if isinstance(value, (tuple, list)) and value else value


def _final_nodes(gm: fx.GraphModule, prefix: str = "") -> list[tuple[str, fx.Node]]:
    """Every node of ``gm`` by the name the annotation gives it, the bodies of autocast and grad
    regions included (``wrap_with_set_grad_enabled.to_2``, as :func:`reads.record_names`)."""
    from ampgraph.capture.regions import REGION_OPS

    out: list[tuple[str, fx.Node]] = []
    for n in gm.graph.nodes:
        out.append((f"{prefix}{n.name}", n))
        if n.op == "call_function" and n.target in REGION_OPS:
            body_arg = n.args[REGION_OPS[n.target]]
            body = getattr(gm, body_arg.target, None) if isinstance(body_arg, fx.Node) else None
            if isinstance(body, fx.GraphModule):
                out += _final_nodes(body, f"{prefix}{n.name}.")
    return out


def _same_value(a: fx.Node, b: fx.Node) -> bool:
    """Whether two nodes' recorded values have one dtype and one shape (None if either has none)."""
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
        return False
    return va.dtype == vb.dtype and tuple(va.shape) == tuple(vb.shape)


class ModuleIORecorder:
    """Remember which graph node each leaf module call received first and returned first.

    A forward hook sees ``inp[0]`` even when the module only reads its dtype or device (Llama's
    rotary embedding takes ``x`` for ``x.dtype``), so the graph alone cannot say what the hook
    would print. Hooks during the trace look up the node that produced each tensor. The
    annotation reads graph identities only (:meth:`resolve`), never dtypes, so it stays
    independent of the dispatcher; the dtypes the hooks saw (:meth:`observed`) are kept apart,
    for the check to compare the module view with.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        #: path -> per call: [input node, output node, input tensor, output tensor] (the tensors
        #: the hook saw while tracing, None where no tensor).
        self.calls: dict[str, list[list[Any]]] = {}
        #: (path, call index, graph size when the call began or None, whether it added no node),
        #: in the order the calls returned (their hooks' order), then those still open
        self.order: list[list[Any]] = []
        #: The leaf calls begun and not yet returned: where a trace that raises stopped.
        self.open: list[tuple[str, int]] = []
        self._handles: list[Any] = []

    @staticmethod
    def _graph_size() -> int | None:
        from torch.fx.experimental import proxy_tensor

        mode = proxy_tensor.get_proxy_mode()
        graph = getattr(getattr(mode, "tracer", None), "graph", None)
        return len(graph.nodes) if graph is not None else None

    @staticmethod
    def _node_of(value: Any) -> fx.Node | str | None:
        """The node of what a hook prints for ``value`` (its first item if a tuple or list, as
        :func:`ampgraph.verify.hooks.first_dtype` reads it); :data:`NO_TENSOR` if that is no tensor."""
        value = _hook_value(value)
        if not isinstance(value, torch.Tensor):
            return NO_TENSOR
        # Not a traced tensor (a leaf called inside torch.vmap sees batched views): no node.
        return traced_node(value)

    def __enter__(self) -> ModuleIORecorder:  # noqa: PYI034 - Self needs Python 3.11
        for path, mod in self.module.named_modules():
            if next(iter(mod.children()), None) is not None:
                continue

            def pre(
                _mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], path: str = path
            ) -> None:
                # The hook's ``inp[0]`` is args[0] itself (a list of images is no tensor); a
                # call by keywords only gives the eager hooks its keyword values instead.
                inp = args if args else list(kwargs.values())
                calls = self.calls.setdefault(path, [])
                self.order.append([path, len(calls), self._graph_size(), False])
                self.open.append((path, len(calls)))
                calls.append([self._node_of(inp), None, _hook_tensor(inp), None])

            def post(_mod: nn.Module, _args: Any, out: Any, path: str = path) -> None:
                self.calls[path][-1][1] = self._node_of(out)
                self.calls[path][-1][3] = _hook_tensor(out)
                if self.open and self.open[-1][0] == path:
                    self.open.pop()
                entry = next(e for e in reversed(self.order) if e[0] == path)
                size = self._graph_size()
                entry[3] = size is not None and entry[2] == size
                # A hook prints as its call returns: a leaf that calls leaves it is given (DoRA's
                # magnitude layer calls lora_A and lora_B) prints after them, so the order is the
                # calls' completion. Every call begun inside this one has returned by now.
                if self.order[-1] is not entry:
                    self.order.remove(entry)
                    self.order.append(entry)

            self._handles += [
                mod.register_forward_pre_hook(pre, with_kwargs=True),
                mod.register_forward_hook(post),
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def resolve(self, gm: fx.GraphModule) -> dict[str, list[tuple[str | None, str | None]]]:
        """Trace-time nodes -> the names the annotation gives them in the exported graph.

        Export's passes after the trace (the grad and autocast regions split out and inlined
        back) copy nodes and renumber their names: a trace-time ``getitem_10`` may be another
        ``getitem`` of the final graph (a ``topk``'s values, a ``sort``'s indices). A copy keeps
        the value its node recorded (``meta["val"]``, the same tensor object), so that is what
        finds the node; a name alone is trusted only where its value has the same dtype and
        shape, and placeholders go by position (export renames them).
        """
        nodes = _final_nodes(gm)
        final = {n.name: n for n in gm.graph.nodes}
        final_placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        by_value: dict[int, list[tuple[str, fx.Node]]] = {}
        for qualified, n in nodes:
            if isinstance(value := n.meta.get("val"), torch.Tensor):
                by_value.setdefault(id(value), []).append((qualified, n))

        def name(node: fx.Node | str | None) -> str | None:
            if node is None or isinstance(node, str):
                return node
            if node.op == "placeholder":
                traced = [n for n in node.graph.nodes if n.op == "placeholder"]
                index = traced.index(node)
                return final_placeholders[index].name if index < len(final_placeholders) else None
            value = node.meta.get("val")
            found = by_value.get(id(value), []) if isinstance(value, torch.Tensor) else []
            if found:
                # The same value in a region's body and outside it (its output): the outside
                # one, which the calls after the region read, unless the name says otherwise.
                same_name = [q for q, n in found if n.name == node.name and q == n.name]
                top = [q for q, n in found if q == n.name]
                return (same_name or top or [found[0][0]])[0]
            match = final.get(node.name)
            if match is not None and match.target == node.target and _same_value(match, node):
                return node.name
            return None

        # What the hooks saw goes with the graph, apart from the names the annotation reads.
        gm.meta[HOOK_DTYPES] = self.observed()
        return {
            path: [(name(c[0]), name(c[1])) for c in calls] for path, calls in self.calls.items()
        }

    def observed(self) -> dict[str, list[tuple[str | None, str | None]]]:
        """Per leaf call, the dtypes its hook saw while tracing (``inp[0]``, ``out[0]``; None where
        no tensor): in a trace in the setting, the dispatcher's own, for the check only.

        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> with ModuleIORecorder(model) as recorder:
        ...     _ = model(torch.ones(1, 2, dtype=torch.float64).float())
        >>> recorder.observed()
        {'0': [('float32', 'float32')]}
        """

        def name(t: torch.Tensor | None) -> str | None:
            return dtype_name(t.dtype) if t is not None else None

        return {
            path: [(name(c[2]), name(c[3])) for c in calls] for path, calls in self.calls.items()
        }

    def reset(self) -> None:
        """Forget a trace that failed, before the next one runs under the same hooks."""
        self.calls.clear()
        self.order.clear()
        self.open.clear()

    def raised(self, exc: BaseException) -> dict[str, Any]:
        """Where a trace that raised ``exc`` stopped (see :attr:`Capture.raised_in_setting`), and
        what the hooks of the calls before it saw there (:meth:`observed`; ``out`` None for the
        call open when it raised): the setting's own lines, for the check of a graph traced again
        in another dtype."""
        seen = {path: [list(call) for call in calls] for path, calls in self.observed().items()}
        return {
            "error": error_line(exc),
            "calls_begun": len(self.order),
            "call": list(self.open[-1]) if self.open else None,
            "seen": seen,
        }

    def call_order(self) -> list[tuple[str, int, bool]]:
        """Every leaf call in order, and whether it added no graph node (see Capture)."""
        return [(path, index, empty) for path, index, _size, empty in self.order]



@contextlib.contextmanager
def modules_kept(root: nn.Module) -> Iterator[None]:
    """``root`` and every module in it as they were on entry, on exit: each one's attributes
    (its submodules, parameters, plain fields) and torch's tables of them and of its hooks, put
    back one level deep. A forward that swaps a submodule for a new one and sets a field saying
    so (BigBird's ``set_attention_type``) is undone; so is one that registers hooks on its first
    call and sets a field saying so (transformers' output capturing): undoing the field alone
    left the hooks, and the next call registered them a second time. So is what a forward
    adds to a container among a module's plain fields, or among those of a plain object there
    (OmDet-Turbo's cache of text embeddings, keyed by the ids' values: filled by the capture's
    call, it made the real run take the cached branch and skip the text encoder). What a
    forward changed inside a tensor, or deeper, is not undone.

    >>> lin = nn.Linear(2, 2)
    >>> lin.seen = {}
    >>> with modules_kept(lin):
    ...     lin.extra = nn.ReLU()
    ...     _ = lin.register_forward_hook(lambda mod, args, out: None)
    ...     lin.seen["ids"] = 1
    >>> hasattr(lin, "extra"), len(lin._forward_hooks), lin.seen
    (False, 0, {})
    """
    saved = [(mod, dict(vars(mod)), _tables(mod)) for mod in root.modules()]
    found = {id(c): c for _, attributes, _ in saved for c in _containers(attributes)}
    contents = [_contents(c) for c in found.values()]  # each once: modules share a config
    try:
        yield
    finally:
        for mod, attributes, tables in saved:  # every one: a changed tensor attribute has no ==
            vars(mod).clear()
            vars(mod).update(attributes)
            for name, table in tables.items():  # in place: hooks and views hold these dicts
                attributes[name].clear()
                attributes[name].update(table)
        for container, content in contents:  # in place: the module and others hold them
            _put_back(container, content)


#: Containers a forward may fill in place.
CONTAINERS = (dict, list, set)


def _containers(attributes: dict[str, Any]) -> Iterator[Any]:
    """The containers among a module's plain fields ``attributes`` and among the fields of a
    plain object there (an LRU cache object holding its dict), not torch's own tables."""
    for name, value in attributes.items():
        if name in TABLES or isinstance(value, (nn.Module, torch.Tensor, type)):
            continue
        if isinstance(value, CONTAINERS):
            yield value
        elif type(value).__module__ != "builtins" and isinstance(_vars_of(value), dict):
            yield from (v for v in vars(value).values() if isinstance(v, CONTAINERS))


def _vars_of(value: Any) -> dict[str, Any] | None:
    """``value``'s attributes where it has a ``__dict__``, else None.

    >>> _vars_of(1) is None, _vars_of(nn.Module()) is not None
    (True, True)
    """
    return getattr(value, "__dict__", None)


def _contents(container: Any) -> tuple[Any, Any]:
    return container, (list(container.items()) if isinstance(container, dict) else list(container))


def _put_back(container: Any, content: Any) -> None:
    """``container`` holding ``content`` again, written only where the forward changed it: a
    container that refuses writes (diffusers' ``FrozenDict`` config, whose ``update`` raises)
    is one no forward changed, and writing it back would fail every capture of its model.

    >>> class Frozen(dict):
    ...     def update(self, *args, **kwargs):
    ...         raise TypeError("frozen")
    >>> frozen = Frozen(a=1)
    >>> _put_back(frozen, list(frozen.items()))
    >>> kept = {"a": 1}
    >>> saved = _contents(kept)[1]
    >>> kept["b"] = 2
    >>> _put_back(kept, saved)
    >>> kept
    {'a': 1}
    """
    if _unchanged(container, content):
        return
    if isinstance(container, list):
        container[:] = content
        return
    container.clear()
    container.update(content)  # a dict's items, a set's members


def _unchanged(container: Any, content: list[Any]) -> bool:
    """Whether ``container`` holds the very objects of ``content``, in order (by identity: a
    tensor's ``==`` is not a bool)."""
    now = _contents(container)[1]
    if len(now) != len(content):
        return False
    if isinstance(container, dict):
        return all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(now, content))
    return all(a is b for a, b in zip(now, content))


#: A module's tables, which torch changes in place: what ``setattr`` assigns (``self.attn =
#: Full()`` writes ``_modules``) and the hooks ``register_*_hook`` adds (a hook's handle holds
#: its table). Read from a bare ``nn.Module``, so that a torch with another table has it here.
TABLES = tuple(name for name, v in vars(nn.Module()).items() if isinstance(v, (dict, set)))


def _tables(mod: nn.Module) -> dict[str, Any]:
    return {name: type(vars(mod)[name])(vars(mod)[name]) for name in TABLES if name in vars(mod)}


__all__ = ["HOOK_DTYPES", "NO_TENSOR", "ModuleIORecorder", "error_line", "modules_kept"]
