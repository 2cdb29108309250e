"""Run a captured graph node by node on real tensors under real ``torch.autocast``.

Each node's output dtypes, or its error message, are recorded (:class:`Observed`), with the casts
autocast made there (:mod:`ampgraph.verify.cast_log`); ``wrap_with_autocast`` regions run under the
real nested ``torch.autocast`` they stand for.

A graph traced along a data path (``export-data-path``, ``draft-export``) holds export's runtime
assertions on the sizes the draft run's values gave (``_assert_scalar`` on ``Ne(u1, 0)``: the
forward's ``if boxes.numel() == 0`` decided False). Where the real values decide one of them the
other way, the real run leaves the captured path there: every node after it is recorded *not
comparable*, with why (:class:`OffPath`), never run on a path the model does not take.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ampgraph.annotate.replay import Failed, FakeReplay, dtype_names, is_assert
from ampgraph.capture.regions import region_args
from ampgraph.capture.trace import Capture
from ampgraph.report.records import NodeRecord
from ampgraph.settings import Setting
from ampgraph.torchutil import autocast_state, tensor_leaves, torch_dtype
from ampgraph.verify.cast_log import CastKey, CastLog, autocast_casts


@dataclass
class Observed:
    """What one node really did."""

    outputs: list[str | None] | None = None
    error: str | None = None
    skipped: str | None = None
    casts: list[CastKey] = field(default_factory=list)
    checked_casts: bool = False
    #: Why the node cannot be compared: the real run left the captured path before it.
    not_comparable: str | None = None


@dataclass
class OffPath:
    """Where the real run left the path the graph was captured along, shared by a graph's
    interpreter and its regions' (a branch decided inside a region ends the path after it)."""

    #: The assertion's node and why, once one failed; None while on the path.
    why: str | None = None
    #: Each ``sym_size`` node the run met -> the real size it read.
    sizes: dict[fx.Node, int] = field(default_factory=dict)

    def left(self, n: fx.Node, name: str, message: str, captured: dict[str, int | float]) -> None:
        """The real run fails the assertion at ``n``: say which sizes it read here, and which
        values the capture's draft run gave the size symbols the assertion names."""
        upstream = _ancestors(n)
        here = ", ".join(
            f"{size.args[0]}.size({size.args[1]}) = {value}"
            for size, value in self.sizes.items()
            if size in upstream
        )
        symbols = sorted(set(re.findall(r"\bu\d+\b", message)), key=lambda u: int(u[1:]))
        draft = ", ".join(f"{u} = {captured[u]}" for u in symbols if u in captured)
        parts = [
            f"here {here}" if here else "",
            f"{draft} in the capture's draft run" if draft else "",
        ]
        said = "; ".join(part for part in parts if part)
        self.why = (
            f"the real run leaves the captured path at {name} ({message.strip()}"
            f"{'; ' + said if said else ''}): the graph after it is another path's"
        )


def _ancestors(n: fx.Node) -> set[fx.Node]:
    """The nodes ``n`` is computed from, up to the tensors its sizes are read from."""
    seen: set[fx.Node] = set()
    todo = list(n.all_input_nodes)
    while todo:
        a = todo.pop()
        if a in seen:
            continue
        seen.add(a)
        if not isinstance(a.meta.get("val"), torch.Tensor):
            todo.extend(a.all_input_nodes)  # a size's arithmetic, not a tensor
    return seen


class RealExecution(FakeReplay):
    """Run a captured graph node by node on real tensors under real autocast.

    Records, per qualified node name, the output dtypes or the error (:class:`Observed`), and the
    casts autocast made there (:mod:`ampgraph.verify.cast_log` says how they are told apart).
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        setting: Setting,
        device: torch.device,
        predicted: dict[str, NodeRecord],
        observed: dict[str, Observed] | None = None,
        prefix: str = "",
        autocast_device: str | None = None,
        path: OffPath | None = None,
        captured: dict[str, int | float] | None = None,
    ) -> None:
        super().__init__(gm, setting, prefix)
        self.device = device  # baked device= arguments go to this very device
        self.predicted = predicted
        self.observed: dict[str, Observed] = observed if observed is not None else {}
        #: The device type whose autocast the predicted policies are for (regions may change it).
        self.autocast_device = autocast_device or setting.device_type
        self.path = path if path is not None else OffPath()
        #: The value each data-dependent size took in the capture's draft run.
        self.captured = captured or {}

    # -- bookkeeping --------------------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        if self.path.why is not None and n.op in ("call_function", "output"):
            # Past a branch the real values decide otherwise: nothing to compare, nothing to run.
            self.observed[self.qualified(n)] = Observed(not_comparable=self.path.why)
            return Failed(self.qualified(n), self.path.why, analysed=False)
        if n.op == "call_function" and is_assert(n.target):
            self._check_path(n)
        value = super().run_node(n)
        name = self.qualified(n)
        if n.target is torch.ops.aten.sym_size.int and isinstance(value, int):
            self.path.sizes[n] = value  # a size an assertion on the path may read
        if n.op == "call_function" and self.path.why is not None and isinstance(value, Failed):
            # A region whose body left the path: the region is past that branch as well.
            self.observed[name] = Observed(not_comparable=self.path.why)
        elif n.op == "call_function":
            obs = self.observed.setdefault(name, Observed())
            if obs.error is None and obs.skipped is None:
                if isinstance(value, Failed):
                    # A region whose body failed returns the failure without failing itself:
                    # the error is recorded at the body's node, and the region counts as not run.
                    obs.skipped = value.node
                else:
                    obs.outputs = dtype_names(value)
        elif n.op == "output" and not self.prefix:
            failed = [v for v in pytree.tree_leaves(value) if isinstance(v, Failed)]
            self.observed[name] = (
                Observed(skipped=failed[0].node) if failed else Observed(outputs=dtype_names(value))
            )
        return value

    def _check_path(self, n: fx.Node) -> None:
        """A runtime assertion on data-dependent sizes: the real values hold it, or the real run
        leaves the captured path here."""
        if n.target is not torch.ops.aten._assert_scalar.default:
            return
        args, _kwargs = self.fetch_args_kwargs_from_env(n)
        if args and isinstance(args[0], (bool, int, torch.SymBool)) and not bool(args[0]):
            message = str(args[1]) if len(args) > 1 else n.name
            self.path.left(n, self.qualified(n), message, self.captured)

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        self.observed.setdefault(self.qualified(n), Observed()).error = failure.message

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        self.observed[self.qualified(n)] = Observed(skipped=failure.node)

    # -- running one node -------------------------------------------------------------------------
    def execute(self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if n.op != "call_function":
            return super().execute(n, args, kwargs)
        log = CastLog()
        try:
            with log:
                return super().execute(n, args, kwargs)
        finally:
            # Runs on success and on the op's own error alike: casts made before a failure count.
            obs = self.observed.setdefault(self.qualified(n), Observed())
            obs.checked_casts = True
            if log.casts:
                rec = self.predicted.get(self.qualified(n))
                obs.casts = autocast_casts(
                    n.target, rec, args, kwargs, log.casts, self._labels(n), self.autocast_device
                )

    def _labels(self, n: fx.Node) -> dict[int, str]:
        """id(tensor) -> qualified name of the input node that produced it (as annotate does)."""
        labels: dict[int, str] = {}
        for a in n.all_input_nodes:
            value = self.env.get(a)
            for t in tensor_leaves(value):
                labels.setdefault(id(t), self.qualified(a))
        return labels

    # -- autocast regions -------------------------------------------------------------------------
    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        region = region_args(n, args)
        if region.is_autocast:
            with warnings.catch_warnings():
                # torch.autocast("cuda", enabled=False) warns without CUDA; it is a no-op then.
                warnings.simplefilter("ignore")
                scope: Any = torch.autocast(
                    device_type=region.device_type, dtype=region.dtype, enabled=region.enabled
                )
            device_type = region.device_type
        else:
            # A grad-mode region keeps the autocast around it (and the device type it applies to).
            device_type, scope = self.autocast_device, contextlib.nullcontext()
        child = RealExecution(
            region.body,
            self.setting,
            self.device,
            self.predicted,
            self.observed,
            prefix=f"{self.prefix}{n.name}.",
            autocast_device=device_type,
            path=self.path,
            captured=self.captured,
        )
        with scope:
            value = self.run_body(child, region.body, region.operands, n)
        self.observed.setdefault(self.qualified(n), Observed()).checked_casts = True
        return value


@contextlib.contextmanager
def real_autocast(setting: Setting) -> Iterator[None]:
    """``torch.autocast`` as the setting says; autocast off on the other device type.

    Without autocast's cast cache: parameters require grad here as in the model (``matmul``
    folds by it, :mod:`ampgraph.capture.grad_params`), and the cache would cast such a leaf once
    per autocast region, where ampgraph predicts (and logs) a cast at every op that takes it (a
    GRU's recurrent weights at every step). The cache changes how often, never the dtypes."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if device_type != setting.device_type:
                dtype = torch.get_autocast_dtype(device_type)
                stack.enter_context(autocast_state(device_type, False, dtype))
        stack.enter_context(
            torch.autocast(
                device_type=setting.device_type,
                dtype=torch_dtype(setting.amp_dtype),
                enabled=setting.autocast,
                cache_enabled=False,
            )
        )
        yield


def run_graph(
    cap: Capture, records: Sequence[NodeRecord], values: Sequence[Any], device: torch.device
) -> dict[str, Observed]:
    """Run the captured graph on real ``values`` under the setting's real autocast."""
    predicted = {r.name: r for r in records}
    interp = RealExecution(
        cap.graph_module, cap.setting, device, predicted, captured=cap.unbacked_values
    )
    with torch.no_grad(), real_autocast(cap.setting):
        interp.run(*values)
    return interp.observed


__all__ = ["Observed", "OffPath", "RealExecution", "real_autocast", "run_graph"]
