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

from typing import Any

import torch
from torch import fx, nn

from ampgraph.errors import first_line

#: In :attr:`Capture.module_io`: the hook's value is no tensor (a detector's ``transform`` takes a
#: list of images and returns an ``ImageList``), so its hook prints ``None``; not "unknown".
NO_TENSOR = ""


def error_line(exc: BaseException) -> str:
    """One line for an exception that stopped a trace: its type and its message's first line.

    >>> error_line(RuntimeError("expected dtype\\nsecond line"))
    'RuntimeError: expected dtype'
    """
    return f"{type(exc).__name__}: {first_line(exc, default='')}".rstrip(": ")


class ModuleIORecorder:
    """Remember which graph node each leaf module call received first and returned first.

    A forward hook sees ``inp[0]`` even when the module only reads its dtype or device (Llama's
    rotary embedding takes ``x`` for ``x.dtype``), so the graph alone cannot say what the hook
    would print. Hooks during the trace look up the node that produced each tensor; they record
    graph identities only, never dtypes, so the annotation stays independent of the dispatcher.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.calls: dict[str, list[list[fx.Node | str | None]]] = {}
        #: (path, call index, graph size when the call began or None, whether it added no node)
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
        from torch.fx.experimental import proxy_tensor

        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if not isinstance(value, torch.Tensor):
            return NO_TENSOR
        mode = proxy_tensor.get_proxy_mode()
        if mode is None:
            return None
        try:
            return proxy_tensor.get_proxy_slot(value, mode.tracer).proxy.node
        except Exception:  # noqa: BLE001 - not a traced tensor: the hook view has no node
            return None

    def __enter__(self) -> ModuleIORecorder:  # noqa: PYI034 - Self needs Python 3.11
        for path, mod in self.module.named_modules():
            if next(iter(mod.children()), None) is not None:
                continue

            def pre(_mod: nn.Module, args: tuple[Any, ...], path: str = path) -> None:
                # The hook's ``inp[0]`` is args[0] itself: a list of images is no tensor.
                first = self._node_of(args) if args else None
                calls = self.calls.setdefault(path, [])
                self.order.append([path, len(calls), self._graph_size(), False])
                self.open.append((path, len(calls)))
                calls.append([first, None])

            def post(_mod: nn.Module, _args: Any, out: Any, path: str = path) -> None:
                self.calls[path][-1][1] = self._node_of(out)
                if self.open and self.open[-1][0] == path:
                    self.open.pop()
                entry = next(e for e in reversed(self.order) if e[0] == path)
                size = self._graph_size()
                entry[3] = size is not None and entry[2] == size

            self._handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def resolve(self, gm: fx.GraphModule) -> dict[str, list[tuple[str | None, str | None]]]:
        """Trace-time nodes -> names in the exported graph (export renames placeholders only)."""
        final = {n.name: n for n in gm.graph.nodes}
        final_placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

        def name(node: fx.Node | str | None) -> str | None:
            if node is None or isinstance(node, str):
                return node
            if node.op == "placeholder":
                traced = [n for n in node.graph.nodes if n.op == "placeholder"]
                index = traced.index(node)
                return final_placeholders[index].name if index < len(final_placeholders) else None
            match = final.get(node.name)
            return node.name if match is not None and match.target == node.target else None

        return {path: [(name(i), name(o)) for i, o in calls] for path, calls in self.calls.items()}

    def reset(self) -> None:
        """Forget a trace that failed, before the next one runs under the same hooks."""
        self.calls.clear()
        self.order.clear()
        self.open.clear()

    def raised(self, exc: BaseException) -> dict[str, Any]:
        """Where a trace that raised ``exc`` stopped (see :attr:`Capture.raised_in_setting`)."""
        return {
            "error": error_line(exc),
            "calls_begun": len(self.order),
            "call": list(self.open[-1]) if self.open else None,
        }

    def call_order(self) -> list[tuple[str, int, bool]]:
        """Every leaf call in order, and whether it added no graph node (see Capture)."""
        return [(path, index, empty) for path, index, _size, empty in self.order]


__all__ = ["NO_TENSOR", "ModuleIORecorder", "error_line"]
