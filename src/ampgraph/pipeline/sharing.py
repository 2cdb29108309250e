"""Which settings can share one captured graph: a graph traced in one setting is another's
where it is the graph a capture in that setting would give (:func:`shared_capture`), so
:func:`ampgraph.pipeline.stages.analyze_group` captures once per such group.

>>> import torch
>>> from ampgraph.capture.trace import capture
>>> from ampgraph.model.build import ModelInputs
>>> from ampgraph.settings import Setting
>>> base = capture(ModelInputs("lin", torch.nn.Linear(4, 4), (torch.randn(2, 4),)),
...                Setting.parse("fp32"))
>>> cap, records = shared_capture(base, Setting.parse("amp-fp32"))
>>> cap.graph_of, [r.out_dtype for r in records if r.op == "aten.linear.default"]
('fp32', ['bfloat16'])
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ampgraph.annotate.annotator import annotate
from ampgraph.capture.trace import Capture
from ampgraph.report.records import NodeRecord
from ampgraph.settings import Setting


def shared_capture(base: Capture, setting: Setting) -> tuple[Capture, list[NodeRecord]] | str:
    """``base``'s graph for ``setting``, with its annotation there, if it is the graph a capture
    in ``setting`` would give; else why not, in one line.

    It is when both settings have one :attr:`~ampgraph.settings.Setting.graph_key` (device type,
    parameter dtype, a recipe's input, buffer and output dtypes) and everything the
    traced code read of its setting reads the same in ``setting`` (:mod:`ampgraph.capture.reads`). A
    graph traced on the meta device was traced without autocast: the same for any such setting.
    """
    from ampgraph.capture.reads import why_not_shared
    from ampgraph.capture.trace import EXPORT_META_REPLAY, IN_SETTING

    if base.setting.graph_key != setting.graph_key:
        # Input, buffer and output dtypes (a recipe's) change the graph as parameters do.
        return "another device type or parameter, buffer, input or output dtype"
    method = base.method.rsplit("+", 1)[-1]
    own_only = base.graph_of is not None or base.real_run is not None
    if own_only or method not in (*IN_SETTING, EXPORT_META_REPLAY):
        return f"a graph captured by {base.method} serves only its own setting"
    shared = replace(base, setting=setting, graph_of=base.setting.name)
    if base.reads is None:
        return shared, annotate(shared)
    layout_nodes = {r.node for r in base.reads if r.kind == "layout" and r.node}
    records, layouts = annotate_observing(shared, layout_nodes)
    why = why_not_shared(base.reads, setting, records, layouts)
    if why is None and any(r.error for r in records):
        # A capture in this setting raises and is traced again (capture.EXPORT_RETYPED); so is
        # this one, so that its report reads as it always has.
        why = f"the forward raises in {setting.name}"
    return why if why is not None else (shared, records)


def annotate_observing(
    capture: Capture, names: set[str]
) -> tuple[list[NodeRecord], dict[str, str]]:
    """Annotate ``capture`` (:func:`ampgraph.annotate.annotator.annotate`), noting the layout of the values
    of the top-level nodes in ``names`` as the annotation computes them."""
    from torch import fx

    from ampgraph.annotate.annotator import AutocastAnnotator
    from ampgraph.annotate.replay import fake_session
    from ampgraph.capture.reads import layout_of

    layouts: dict[str, str] = {}

    class Observing(AutocastAnnotator):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if n.name in names and isinstance(value, torch.Tensor):
                layouts[n.name] = layout_of(value)
            return value

    annotator = Observing(capture)
    with fake_session(capture.setting):
        annotator.run_graph()
    return annotator.records, layouts


__all__ = ["annotate_observing", "shared_capture"]
