"""The fp32 reference run: the captured graph run for real on the CPU, each output reduced, dropped.

:class:`RangeRun` is an ``fx.Interpreter`` (through :class:`~ampgraph.annotate.replay.FakeReplay`,
whose failure handling, device retargeting and region walking it shares with the annotator and
``verify``) that runs each node on real tensors with autocast off everywhere, reduces every
floating output to a :class:`~ampgraph.ranges.data.ValueRange` (a handful of reductions) and
keeps nothing else: ``fx.Interpreter`` frees each value after its last use, so memory is the
weights plus the live activations, as in an eager forward.

>>> import torch
>>> reduce_tensor(torch.tensor([0.0, -3.0, 1e-3, float("inf")]))        # doctest: +ELLIPSIS
ValueRange(dtype='float32', numel=4, max_abs=3.0, min_nonzero=0.0010..., zeros=1, infs=1, ...)
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ampgraph.annotate.replay import Failed, FakeReplay, op_name
from ampgraph.capture.regions import REGION_OPS, region_args
from ampgraph.capture.trace import Capture
from ampgraph.ranges.data import NodeRange, ValueRange
from ampgraph.ranges.stream import Lazy, return_freed_memory
from ampgraph.settings import Setting
from ampgraph.torchutil import autocast_state, dtype_name

#: Products: fp32 itself underflows a product of many small factors (seed 000's ``prod`` of
#: 40,000 normal values is ``-0.`` in fp32), so their true magnitude is summed in log space.
PRODUCTS = {"aten.prod.default", "aten.prod.dim_int"}
#: Magnitudes at fp32's own extreme are sentinels, not results: a mask of
#: ``torch.finfo(torch.float32).min``, which the model's code makes ``finfo(its dtype).min`` in
#: another setting. They are counted apart (``extremes``) and left out of ``max_abs``; the
#: constants that make them are checked in each setting's own graph instead.
EXTREME = 1e38


#: Elements per chunk of |x|: a reused buffer that stays in cache, instead of a new tensor as large
#: as a weight matrix (whose allocation and page faults cost ten times the arithmetic).
CHUNK = 1 << 20


def _chunk_range(part: torch.Tensor) -> tuple[float, float, int]:
    """(max, min non-zero, zeros) of a chunk of magnitudes (``part`` is overwritten)."""
    lo, hi = torch.stack(list(torch.aminmax(part))).tolist()
    if lo != 0 or math.isnan(hi):
        return hi, lo, 0
    zero = part == 0
    zeros = int(zero.sum())
    low = float(part.masked_fill_(zero, math.inf).amin()) if zeros < part.numel() else math.inf
    return hi, low, zeros


def _magnitudes(x: torch.Tensor) -> tuple[float, float, int]:
    """(max |x|, min non-zero |x|, zeros) in one read of the values, a chunk at a time into a
    reused buffer; NaN for the maximum where x has a NaN, inf for the minimum where all are 0."""
    if x.numel() <= CHUNK:  # one chunk: no buffer, no copy of a non-contiguous view
        return _chunk_range(x.abs())
    flat = x.reshape(-1)
    buf = torch.empty(CHUNK, dtype=x.dtype)
    top, low, zeros = 0.0, math.inf, 0
    for start in range(0, flat.numel(), CHUNK):
        chunk = flat[start : start + CHUNK]
        hi, lo, z = _chunk_range(torch.abs(chunk, out=buf[: chunk.numel()]))
        if math.isnan(hi):
            return math.nan, math.nan, 0
        top, low, zeros = max(top, hi), min(low, lo), zeros + z
    return top, low, zeros


def reduce_tensor(t: torch.Tensor) -> ValueRange:
    """A floating tensor's range, in one pass of a few reductions (values read once each).

    >>> reduce_tensor(torch.zeros(3)).min_nonzero is None
    True
    """
    t = t.detach()
    out = ValueRange(dtype_name(t.dtype), numel=t.numel())
    if t.numel() == 0:
        return out
    x = t if t.dtype in (torch.float32, torch.float64) else t.float()
    top, low, out.zeros = _magnitudes(x)
    if not top < EXTREME:  # NaN, inf or a sentinel: the slow path, rarely taken
        a = x.abs()
        finite = torch.isfinite(a)
        out.zeros = int((a == 0).sum())
        out.nans = int(torch.isnan(a).sum())
        out.infs = int(torch.isinf(a).sum())
        extreme = finite & (a >= EXTREME)
        out.extremes = int(extreme.sum())
        a = a[finite & (a != 0) & ~extreme]
        top = float(a.amax()) if a.numel() else None
        low = float(a.amin()) if a.numel() else math.inf
    out.max_abs = top if top is not None and top > 0 else None
    out.min_nonzero = low if math.isfinite(low) else None
    return out


def _product_truth(rng: ValueRange, args: tuple[Any, ...], value: torch.Tensor) -> None:
    """For a product: zeros of the result that no zero factor explains underflowed in fp32."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or rng.zeros == 0:
        return
    dims = args[1:2] if len(args) > 1 else ()
    keep = bool(args[2]) if len(args) > 2 else False
    logs = torch.log10(x.detach().abs().double())
    if dims:
        has_zero = (x == 0).any(dim=int(dims[0]), keepdim=keep)
        log_sum = logs.sum(dim=int(dims[0]), keepdim=keep)
    else:
        has_zero, log_sum = (x == 0).any(), logs.sum()
    lost = (value == 0) & ~has_zero
    rng.underflowed = int(lost.sum())
    if rng.underflowed:
        rng.log10_true = float(log_sum[lost].min())


def _is_product(n: fx.Node) -> bool:
    return n.op == "call_function" and op_name(n.target) in PRODUCTS


def graph_constants(gm: fx.GraphModule, prefix: str = "") -> dict[str, list[float]]:
    """Node name -> the scalar numbers among its arguments (sizes and dims in lists left out),
    region bodies included: what :mod:`ampgraph.ranges.judge` checks against each node's dtype.

    >>> g = fx.symbolic_trace(lambda x: torch.ops.aten.masked_fill(x, x > 0, -1e9))
    >>> graph_constants(g)
    {'gt': [0.0], 'masked_fill': [-1000000000.0]}
    """
    found: dict[str, list[float]] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target in REGION_OPS:
            body = n.args[REGION_OPS[n.target]]
            if isinstance(body, fx.Node) and body.op == "get_attr":
                body = getattr(gm, str(body.target))
            if isinstance(body, fx.GraphModule):
                found.update(graph_constants(body, f"{prefix}{n.name}."))
            continue
        numbers = [
            float(a) for a in (*n.args, *n.kwargs.values())
            if isinstance(a, (int, float)) and not isinstance(a, bool)
        ]  # fmt: skip
        if numbers:
            found[f"{prefix}{n.name}"] = numbers
    return found


class RangeRun(FakeReplay):
    """Run a captured graph on real CPU tensors and record each node's :class:`NodeRange`.

    ``ranges`` is shared with region bodies (their nodes are named ``region.node``, as in the
    reports). A node that raises is recorded with its error; nodes after it are not run.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        setting: Setting,
        modules: dict[str, str | None],
        kinds: dict[str, str],
        ranges: dict[str, NodeRange] | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(gm, setting, prefix)
        self.device = torch.device("cpu")  # baked device= arguments go to the real device
        self.modules = modules
        self.kinds = kinds
        self.ranges: dict[str, NodeRange] = ranges if ranges is not None else {}
        #: Ranges of the graph inputs' memory (weights live for the whole run), by what makes a
        #: view read the same values: a tied weight or an alias of one is not read again.
        self.seen: dict[tuple[Any, ...], ValueRange] = {}
        self.input_storages: set[int] = set()
        #: Placeholder name -> its weight not yet made (a run too large for memory).
        self.lazy: dict[str, Lazy] = {}

    def _reduce(self, v: torch.Tensor, placeholder: bool) -> ValueRange:
        storage = v.untyped_storage().data_ptr()
        if placeholder:
            self.input_storages.add(storage)
        if storage not in self.input_storages:
            return reduce_tensor(v)
        key = (storage, v.storage_offset(), tuple(v.shape), tuple(v.stride()), v.dtype, v._version)
        if key not in self.seen:
            self.seen[key] = reduce_tensor(v)
        return copy.copy(self.seen[key])

    def _record(
        self, n: fx.Node, value: Any, error: str | None = None, lazy: bool = False
    ) -> None:
        name = self.qualified(n)
        rec = NodeRange(
            name, op_name(n.target) if n.op == "call_function" else n.op,
            self.kinds.get(name, "op"), self.modules.get(name), error=error,
        )  # fmt: skip
        if error is None:
            # A weight made for one node (lazy) is freed after it: its memory is no key to
            # remember a range by (the next tensor may get the same address).
            rec.outputs = [
                self._reduce(v, n.op == "placeholder" and not lazy)
                if isinstance(v, torch.Tensor) and v.is_floating_point()
                else None
                for v in pytree.tree_leaves(value)
            ]
        self.ranges[name] = rec

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The node's arguments, each :class:`~ampgraph.ranges.stream.Lazy` weight made for it
        (and its range recorded the first time): it is freed with the arguments."""
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        lazy = [a for a in n.all_input_nodes if isinstance(self.env.get(a), Lazy)]
        if not lazy:
            return args, kwargs
        made: dict[int, torch.Tensor] = {}
        for a in lazy:
            handle = self.env[a]
            if id(handle) not in made:
                made[id(handle)] = handle.load()
            if self.qualified(a) not in self.ranges:
                self._record(a, made[id(handle)], lazy=True)
        swapped = pytree.tree_map_only(Lazy, lambda v: made[id(v)], (args, kwargs))
        return swapped  # type: ignore[return-value]

    def record_unread(self) -> None:
        """The ranges of lazy weights no node read (in memory, every graph input has one)."""
        for n in self.graph.nodes:
            if n.op == "placeholder" and self.qualified(n) not in self.ranges:
                handle = self.lazy.get(n.name)
                if handle is not None:
                    self._record(n, handle.load(), lazy=True)

    def run_node(self, n: fx.Node) -> Any:
        read_weights = any(isinstance(self.env.get(a), Lazy) for a in n.all_input_nodes)
        value = super().run_node(n)
        if read_weights:  # the weights made for it are freed now: their pages go back
            return_freed_memory()
        if n.op == "placeholder" and isinstance(value, Lazy):
            self.lazy[n.name] = value  # recorded where a node first reads it
            return value
        if isinstance(value, Failed) or n.op in ("output", "get_attr"):
            return value
        if n.op == "placeholder" and n.name in self.outer_names:
            return value  # a region's operand: recorded where the outer graph made it
        self._record(n, value)
        first = self.ranges[self.qualified(n)].outputs[:1]
        if _is_product(n) and first and first[0] is not None and isinstance(value, torch.Tensor):
            args, _ = self.fetch_args_kwargs_from_env(n)
            _product_truth(first[0], tuple(args), value)
        return value

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        self._record(n, None, error=failure.message)

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        # The reference is fp32 throughout: a region's autocast is not applied here.
        region = region_args(n, args)
        child = RangeRun(
            region.body, self.setting, self.modules, self.kinds, self.ranges,
            prefix=f"{self.prefix}{n.name}.",
        )  # fmt: skip
        return self.run_body(child, region.body, region.operands, n)


def run_ranges(
    cap: Capture,
    values: Sequence[Any],
    modules: dict[str, str | None],
    kinds: dict[str, str],
) -> dict[str, NodeRange]:
    """Run ``cap``'s graph on ``values`` (one per placeholder) with autocast off; each node's range.

    ``modules`` and ``kinds`` (node name -> module path / record kind) come from the capture's
    report, so the records name nodes and modules as the reports and diagrams do.
    """
    interp = RangeRun(cap.graph_module, cap.setting, modules, kinds)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for device in ("cpu", "cuda"):
            stack.enter_context(autocast_state(device, False, torch.get_autocast_dtype(device)))
        interp.run(*values)
        interp.record_unread()
    return interp.ranges


__all__ = ["EXTREME", "PRODUCTS", "RangeRun", "graph_constants", "reduce_tensor", "run_ranges"]
