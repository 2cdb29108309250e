"""The cast log: which ``aten._to_copy`` calls autocast itself made at a node.

While a node runs for real, :class:`CastLog` logs every dtype-changing ``aten._to_copy`` (what
autocast's ``cached_cast`` reaches, and what seed 001 logged with ``LoggingTensorMode``) and
every ``aten.copy_`` into a tensor of another dtype (how cuDNN RNNs' autocast kernel casts the
weights). Ops also
convert on their own (``softmax(x, dtype=float)`` does ``x.to(float)``; explicit ``aten.to`` nodes
are nothing but a ``_to_copy``), and from inside the dispatcher the two look alike. So a node that
logged a cast is called a second time with autocast *off*, the way the annotation says autocast
calls it (:func:`predicted_call`: the predicted casts made beforehand, outside the log, and
:mod:`ampgraph.policy.rules`' ``dtype=`` or redispatch): that log holds only the op's own
conversions, and autocast's casts are the first log minus the second (:func:`autocast_casts`, a
multiset difference on ``(source, from, to)``). A wrong prediction cannot hide this way: a cast
autocast makes that was not predicted stays in the difference, and a predicted one autocast does
not make is missing from it. Autocast's weight cache is out of play: the tensors do not require
grad, so every cast of a node is a real cast of that node.

>>> lin, x = torch.nn.Linear(16, 16), torch.randn(1, 16)
>>> with torch.autocast("cpu", dtype=torch.bfloat16), CastLog() as log:
...     _ = lin(x)
>>> [(dtype_name(c.from_dtype), dtype_name(c.to_dtype)) for c in log.casts]
[('float32', 'bfloat16'), ('float32', 'bfloat16'), ('float32', 'bfloat16')]
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import policy as P
from ampgraph.policy import rules
from ampgraph.report.records import NodeRecord
from ampgraph.settings import short_dtype
from ampgraph.torchutil import autocast_state, dtype_name, tensor_leaves, torch_dtype

#: Where a cast's source tensor was made during the call rather than by an input node.
INTERNAL = "(internal)"
#: One cast as the annotation writes it: (source node, from dtype, to dtype).
CastKey = tuple[str, str, str]


@dataclass(frozen=True)
class LoggedCast:
    """One dtype-changing ``aten._to_copy`` seen at the dispatcher."""

    source: torch.Tensor
    from_dtype: torch.dtype
    to_dtype: torch.dtype


class CastLog(TorchDispatchMode):
    """Log every ``aten._to_copy`` that changes a dtype, as seed 001's ``LoggingTensorMode`` did.

    The mode sits at the Python dispatch key, below the Autocast keys, so it sees the casts that
    autocast's kernels make as well as the op's own.

    >>> lin, x = torch.nn.Linear(16, 16), torch.randn(1, 16)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16), CastLog() as log:
    ...     _ = lin(x)
    >>> len(log.casts)
    3
    """

    #: A higher-order op (``flex_attention``) comes here whole, after its autocast kernel's casts
    #: (logged as they pass): it runs with the mode popped, so the casts inside its own
    #: implementation, which are not autocast's, are not logged.
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[LoggedCast] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(out, torch.Tensor):
            source = args[0]
            if isinstance(source, torch.Tensor) and source.dtype != out.dtype:
                self.casts.append(LoggedCast(source, source.dtype, out.dtype))
        elif func is torch.ops.aten.copy_.default:
            # A copy into a tensor of another dtype casts its source too: cuDNN RNNs' autocast
            # kernel (``_cudnn_rnn_cast_reflatten``) casts the weights so, copying each into an
            # fp16 buffer laid out for cuDNN (seen on an H100: the weights' casts were missing).
            target, source = args[0], args[1]
            if isinstance(source, torch.Tensor) and source.dtype != target.dtype:
                self.casts.append(LoggedCast(source, source.dtype, target.dtype))
        return out


#: cuDNN RNNs by their node's op, with how many ``hx`` tensors precede the weights in the node's
#: inputs (``input, *hx, *params``).
CUDNN_RNNS = {"aten.lstm.input": 2, "aten.gru.input": 1, "aten.rnn_tanh.input": 1,
              "aten.rnn_relu.input": 1}  # fmt: skip
#: The weights' casts of a cuDNN RNN, compared as one: see :func:`weights_as_one`.
WEIGHTS = "(weights, into cuDNN's fp16 buffer)"


def weights_as_one(
    op: str, inputs: Sequence[str], predicted: Sequence[CastKey], observed: Sequence[CastKey]
) -> tuple[list[CastKey], list[CastKey]]:
    """A cuDNN RNN's weight casts as one cast per dtype pair, on both sides.

    Its CUDA autocast kernel (``_cudnn_rnn_cast_reflatten``) copies the weights into one fp16
    buffer laid out for cuDNN: a real run logs those copies from views of the weights, one per
    weight, all ``(internal)`` (seen on an H100 for a GRU and an LSTM), and no cast of a weight
    by name. The annotation names each weight it casts. What both say is the same: the weights
    go to fp16 inside the kernel, from their dtype. So where the real run cast no weight by
    name, each side's weight casts (the internal ones, on its side) count once per ``(from,
    to)``; elsewhere (the CPU's composite RNNs cast each weight at each step, by name) nothing
    changes. The input's and ``hx``'s casts are compared one by one as everywhere.

    >>> weights_as_one("aten.gru.input", ["x", "h", "w1", "w2"],
    ...                [("x", "float32", "float16"), ("w1", "float32", "float16"),
    ...                 ("w2", "float32", "float16")],
    ...                [("x", "float32", "float16"), ("(internal)", "float32", "float16"),
    ...                 ("(internal)", "float32", "float16")])[1]
    [('x', 'float32', 'float16'), ("(weights, into cuDNN's fp16 buffer)", 'float32', 'float16')]
    """
    hx = CUDNN_RNNS.get(op)
    weights = set(inputs[1 + hx:]) if hx is not None else set()
    if not weights or any(source in weights for source, _, _ in observed):
        return list(predicted), list(observed)
    return _one(predicted, lambda s: s in weights), _one(observed, lambda s: s == INTERNAL)


def _one(casts: Sequence[CastKey], is_weight: Callable[[str], bool]) -> list[CastKey]:
    out: list[CastKey] = []
    for source, from_dtype, to_dtype in casts:
        key = (WEIGHTS if is_weight(source) else source, from_dtype, to_dtype)
        if key[0] != WEIGHTS or key not in out:
            out.append(key)
    return out


def labelled(casts: list[LoggedCast], labels: dict[int, str]) -> list[tuple[str, str, str]]:
    return [
        (labels.get(id(c.source), INTERNAL), dtype_name(c.from_dtype), dtype_name(c.to_dtype))
        for c in casts
    ]


def cast_text(casts: Sequence[tuple[str, str, str]]) -> str:
    if not casts:
        return "no casts"
    return ", ".join(f"{n} {short_dtype(f)}->{short_dtype(t)}" for n, f, t in casts)


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast off on every device type: how the annotation says an op is called."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            dtype = torch.get_autocast_dtype(device_type)
            stack.enter_context(autocast_state(device_type, False, dtype))
        yield


def predicted_call(
    op: Any,
    rec: NodeRecord | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    labels: dict[int, str],
    autocast_device: str,
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], set[int]]:
    """The call the annotation says autocast makes: predicted casts and dtype= applied.

    Returns the target, its arguments, and the ids of the tensors that were replaced by casts.
    """
    target: Any = op
    pending = Counter((c.node, c.from_dtype, c.to_dtype) for c in (rec.casts if rec else []))
    replaced: set[int] = set()

    def cast(t: torch.Tensor) -> torch.Tensor:
        label = labels.get(id(t))
        for key in list(pending):
            if pending[key] > 0 and key[0] == label and key[1] == dtype_name(t.dtype):
                pending[key] -= 1
                replaced.add(id(t))
                return t.to(torch_dtype(key[2]))
        return t

    # Casts are made out here, outside the log, so only the op's own conversions are logged.
    with autocast_off():
        call_args, call_kwargs = pytree.tree_map_only(torch.Tensor, cast, (args, kwargs))
    call_args, call_kwargs = tuple(call_args), dict(call_kwargs)
    policy = rec.policy if rec else None
    if policy == P.FP32_OUTPUT_AS_INPUT:
        target = _cast_back(target, next(iter(tensor_leaves((args, kwargs))), None))
    if isinstance(target, torch._ops.OpOverload):
        if policy == P.FP32_SET_OPT_DTYPE:
            called = rules.set_opt_dtype(target, call_args, call_kwargs, autocast_device)
            if called is not None:
                call_args, call_kwargs = called
        elif policy == P.FP32_APPEND_DTYPE:
            target, _name, call_kwargs = rules.append_dtype(
                target, call_args, call_kwargs, autocast_device
            )
    return target, call_args, call_kwargs, replaced


def _cast_back(op: Any, first: torch.Tensor | None) -> Callable[..., Any]:
    """``op`` as a library's autocast wrapper calls it (torchvision's roi ops): run in fp32, the
    output cast back to the first input's dtype. That cast is the wrapper's, made inside the call
    on a tensor the op made: part of the op as the annotation calls it, not a cast of its inputs."""
    back = first.dtype if first is not None else torch.float32

    def call(*args: Any, **kwargs: Any) -> Any:
        out = op(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(back), out)

    return call


def own_casts(
    op: Any,
    rec: NodeRecord | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    labels: dict[int, str],
    autocast_device: str,
) -> list[CastKey]:
    """The node's own conversions: run it with autocast off, called as the annotation says."""
    target, call_args, call_kwargs, replaced = predicted_call(
        op, rec, args, kwargs, labels, autocast_device
    )
    own_labels = {k: v for k, v in labels.items() if k not in replaced}
    log = CastLog()
    with autocast_off(), log, contextlib.suppress(Exception):
        # The op may fail here where a prediction was wrong; casts before that still count.
        target(*call_args, **call_kwargs)
    return labelled(log.casts, own_labels)


def autocast_casts(
    op: Any,
    rec: NodeRecord | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    logged: list[LoggedCast],
    labels: dict[int, str],
    autocast_device: str,
) -> list[CastKey]:
    """The casts autocast made at a node: what it logged less the op's own conversions.

    ``labels`` maps ``id(tensor)`` to the input node that produced it, as the annotation names
    casts' sources.
    """
    own = Counter(own_casts(op, rec, args, kwargs, labels, autocast_device))
    out: list[CastKey] = []
    for item in labelled(logged, labels):  # the multiset difference
        if own[item] > 0:
            own[item] -= 1
        else:
            out.append(item)
    # The log's order is C++'s argument evaluation order (right to left with GCC): list the
    # casts in the op's argument order instead, as the annotation does.
    order = {label: i for i, label in enumerate(dict.fromkeys(
        labels.get(id(t), INTERNAL) for t in tensor_leaves((args, kwargs))
    ))}  # fmt: skip
    return sorted(out, key=lambda item: order.get(item[0], len(order)))


__all__ = [
    "CUDNN_RNNS",
    "INTERNAL",
    "WEIGHTS",
    "CastLog",
    "LoggedCast",
    "autocast_casts",
    "autocast_off",
    "cast_text",
    "weights_as_one",
]
