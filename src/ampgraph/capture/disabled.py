"""Where a model's ``torch.compiler.disable`` regions are, marked on the captured graph's nodes.

Eager runs such a function as any other, and the capture traces through it; ``torch.compile``
breaks the graph there and runs it eagerly between two compiled graphs. Each node traced inside
one gets ``node.meta[REGION]`` = the function's name, for the compiled analysis
(:mod:`ampgraph.compiled.breaks`) to split the graph where Dynamo does.

How: from torch 2.10, the wrapper ``torch.compiler.disable`` puts around a function
(``DisableContext``'s ``_fn``) annotates the nodes it traces (``fx.traceback.annotate``) when
``torch.compiler.is_exporting()``; during the capture that question answers yes to that wrapper
alone, and the annotation is recorded on the nodes the capture's tracer made inside it
(:func:`ampgraph.compat.compiler_disable_annotates`; on 2.9 nothing is marked).

>>> with marking_disabled_regions():
...     pass
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from ampgraph import compat

#: The node meta key: the name of the disabled function the node was traced in.
REGION = "ampgraph_compiler_disable"
_METHOD = "_torchdynamo_disable_method"


@contextlib.contextmanager
def marking_disabled_regions() -> Iterator[None]:
    """Mark the nodes traced inside ``torch.compiler.disable`` functions (see the module)."""
    if not compat.compiler_disable_annotates():
        yield
        return
    from torch._dynamo import eval_frame
    from torch.fx import traceback as fx_traceback

    exporting, annotate = torch.compiler.is_exporting, fx_traceback.annotate

    def is_exporting() -> bool:
        frame = sys._getframe(1)
        inside = (frame.f_code.co_name == "_fn" and frame.f_code.co_filename == eval_frame.__file__
                  and isinstance(frame.f_locals.get("self"), eval_frame.DisableContext))  # fmt: skip
        return inside or exporting()

    @contextlib.contextmanager
    def marking(annotation: dict[str, Any]) -> Iterator[None]:
        graph = _tracing_graph()
        if _METHOD not in annotation or graph is None:
            with annotate(annotation):
                yield
            return
        before = set(graph.nodes)
        try:
            yield
        finally:
            for n in graph.nodes:
                if n not in before:
                    n.meta.setdefault(REGION, annotation[_METHOD])

    with mock.patch.object(torch.compiler, "is_exporting", is_exporting), \
            mock.patch.object(fx_traceback, "annotate", marking):  # fmt: skip
        yield


def _tracing_graph() -> Any:
    """The graph the active ``make_fx`` tracer is building, None where none is (a tracer whose
    trace has not begun has no graph yet)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    return None if mode is None else getattr(mode.tracer, "graph", None)
