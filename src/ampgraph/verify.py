"""Verify: prove the annotations against real execution, on CPU (and CUDA where there is one).

The dispatcher check (:mod:`ampgraph.check`) runs autocast's kernels on fake tensors; this module
runs everything for real: real tensors in real memory, real kernels, real ``torch.autocast``. It
materialises the captured graph's parameters and buffers with seeded random values (values never
change a dtype), then makes three independent cross-checks against the prediction of
:mod:`ampgraph.annotate`:

1. **Nodes.** The captured graph runs node by node under ``torch.autocast(device_type, dtype)``
   (and the real nested ``torch.autocast(...)`` of every ``wrap_with_autocast`` region). Each
   node's output dtypes, or its error message, are compared with its annotation. A node that
   raises (the seed's bf16 ``Linear`` fed fp32 without autocast) agrees only if the annotation
   predicted that very error.
2. **Modules.** The original eager model runs on the same tensors, with the seed notebook's
   forward hook on every leaf module (``inp[0].dtype -> out[0].dtype``), and the hook lines are
   compared in order with the annotation's module view (``Report.modules``). This catches a
   capture that drifted from the eager model.
3. **Casts.** While each node runs, a dispatch mode logs every dtype-changing ``aten._to_copy``
   (what autocast's ``cached_cast`` reaches, and what seed 001 logged with ``LoggingTensorMode``),
   and the casts attributed to autocast are compared with the node's predicted ``casts``.

How a logged ``_to_copy`` is attributed to autocast. Autocast's kernel casts the op's *arguments*
before the op runs; but ops convert on their own too (``softmax(x, dtype=float)`` does
``x.to(float)``; SDPA's math path upcasts; explicit ``aten.to`` nodes are nothing but a
``_to_copy``), and from inside the dispatcher the two look alike. So each node that logged a cast
is run a second time, with autocast *off*, exactly as the annotation says autocast calls it: the
predicted casts applied beforehand (outside the log), ``dtype=`` added where the policy is
``fp32_set_opt_dtype``, the redispatch overload for ``fp32_append_dtype``. That second log holds
only the op's own conversions. The casts autocast performed are the first log minus the second
(a multiset difference on ``(source, from, to)``, where the source is the input node that produced
the tensor, or ``(internal)`` for a tensor made during the call). A wrong prediction cannot hide
itself this way: a cast autocast makes that was not predicted stays in the difference, and a
predicted cast that autocast does not make is missing from it. The weight cache of autocast is out
of play, as under ``torch.inference_mode``: the tensors do not require grad, so every cast of a
node is a real cast of that node.

>>> import torch
>>> from ampgraph.models import ModelInputs
>>> from ampgraph.settings import Setting
>>> lin = ModelInputs("linear", torch.nn.Linear(16, 16), (torch.randn(1, 16),))
>>> result = verify(lin, Setting.parse("amp-fp32", device_type="cpu"))
>>> result.ok, result.casts.agree                     # input, weight and bias: seed 001's 3 casts
(True, 3)
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import os
import platform
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import policy as P
from ampgraph.capture import Capture, autocast_state, capture, dtype_name, torch_dtype
from ampgraph.errors import AmpgraphError, first_line
from ampgraph.files import atomic_write
from ampgraph.formats import call_error
from ampgraph.models import ModelInputs
from ampgraph.records import NodeRecord, Report
from ampgraph.replay import WRAP_WITH_AUTOCAST, Failed, FakeReplay, dtype_names, tensor_leaves
from ampgraph.settings import Setting, short_dtype

SCHEMA = "ampgraph.verify"
SCHEMA_VERSION = 1
#: Where a cast's source tensor was made during the call rather than by an input node.
INTERNAL = "(internal)"
SOURCE_KINDS = ("parameter", "buffer", "constant", "input")
NO_CUDA_MESSAGE = (
    "no CUDA device here: real CUDA verification needs a GPU; "
    "'ampgraph check --device cuda' checks against the dispatcher without one"
)


class VerifyError(AmpgraphError):
    """Real execution could not be set up (no such device, inputs that do not fit the graph)."""


class NoDeviceError(VerifyError):
    """The setting's device type has no device on this machine."""


# -- results ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """How many of the compared items agree."""

    agree: int
    total: int

    def __str__(self) -> str:
        return f"{self.agree}/{self.total}"

    def to_dict(self) -> dict[str, int]:
        return {"agree": self.agree, "total": self.total}


@dataclass(frozen=True)
class Disagreement:
    """One place where real execution contradicts the annotation."""

    kind: str  # "node" | "module" | "cast"
    node: str  # node name, or module path for kind "module"
    op: str  # op name, or module class
    predicted: str
    observed: str
    module: str | None = None

    def line(self) -> str:
        """``  node linear (aten.linear.default, fc1): predicted bf16, observed fp32``."""
        where = f"{self.op}, {self.module}" if self.module else self.op
        return (
            f"  {self.kind} {self.node or '(root)'} ({where}): predicted {self.predicted}, "
            f"observed {self.observed}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "node": self.node, "op": self.op, "module": self.module,
            "predicted": self.predicted, "observed": self.observed,
        }  # fmt: skip


@dataclass
class VerifyResult:
    """The three cross-checks of one model in one setting on one real device."""

    model: str
    setting: Setting
    device: str
    device_name: str
    versions: dict[str, str]
    date: str
    nodes: Figure
    modules: Figure
    casts: Figure
    disagreements: list[Disagreement]
    #: The seed notebook's hook lines, as the eager model printed them.
    eager_hooks: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    #: The prediction that was verified (not part of the JSON record: ``ampgraph table`` has it).
    report: Report | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.disagreements

    def summary_line(self) -> str:
        """``opt-125m amp-fp32 (cpu bf16) on <device>: nodes 354/354, ... 0 disagreements``."""
        n = len(self.disagreements)
        return (
            f"{self.model} {self.setting.name} ({self.setting.device_type} "
            f"{short_dtype(self.setting.amp_dtype)}) on {self.device_name}: "
            f"nodes {self.nodes}, modules {self.modules}, casts {self.casts} agree; "
            f"{n} disagreement{'s' if n != 1 else ''}"
        )

    def disagreement_lines(self) -> list[str]:
        return [d.line() for d in self.disagreements]

    def to_dict(self) -> dict[str, Any]:
        """The JSON record: device, versions and date, setting, figures, disagreements."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "model": self.model,
            "setting": self.setting.to_dict(),
            "device": self.device,
            "device_name": self.device_name,
            "versions": self.versions,
            "date": self.date,
            "ok": self.ok,
            "figures": {
                "nodes": self.nodes.to_dict(),
                "modules": self.modules.to_dict(),
                "casts": self.casts.to_dict(),
            },
            "disagreements": [d.to_dict() for d in self.disagreements],
            "eager_hooks": self.eager_hooks,
            "seconds": self.seconds,
        }


def verify_record(results: Sequence[VerifyResult], **extra: Any) -> dict[str, Any]:
    """One JSON record for several results (the file ``ampgraph verify --record`` writes).

    ``extra`` fields (a command line, timings) are added at the top level.

    >>> verify_record([], command="ampgraph verify")["command"]
    'ampgraph verify'
    """
    first = results[0] if results else None
    record = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "device": first.device if first else None,
        "device_name": first.device_name if first else None,
        "versions": first.versions if first else _versions(),
        "date": first.date if first else _now(),
        "ok": all(r.ok for r in results),
        "results": [r.to_dict() for r in results],
    }
    record.update(extra)
    return record


def write_record(
    results: Sequence[VerifyResult], path: str | os.PathLike[str], **extra: Any
) -> Path:
    """Write :func:`verify_record` as JSON to ``path`` atomically (a reader never sees half)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(verify_record(results, **extra), indent=1) + "\n"
    atomic_write(target, text.encode())
    return target


# -- the environment -------------------------------------------------------------------------------
def device_name(device: str | torch.device) -> str:
    """The GPU's name, or the CPU model: what a record says it ran on.

    >>> isinstance(device_name("cpu"), str)
    True
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _versions() -> dict[str, str]:
    from ampgraph.analysis import versions

    out = versions()
    out["python"] = platform.python_version()
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def resolve_device(setting: Setting, device: str | torch.device | None = None) -> torch.device:
    """The real device to run on: ``device`` or the setting's device type, checked to exist.

    >>> resolve_device(Setting.parse("fp32", device_type="cpu"))
    device(type='cpu')
    """
    dev = torch.device(device if device is not None else setting.device_type)
    if dev.type != setting.device_type:
        raise VerifyError(
            f"device {dev} does not match the setting's device type {setting.device_type}: "
            f"pass a {setting.device_type} device"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NoDeviceError(NO_CUDA_MESSAGE)
    return dev


# -- materialising real tensors --------------------------------------------------------------------
def _is_real(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not (t.is_meta or isinstance(t, FakeTensor))


#: Random values are drawn for at most this many elements per tensor and tiled over the rest:
#: drawing 125M normal values takes ~1 s on a CPU core, tiling them ~0.1 s.
RANDOM_POOL = 1 << 16


def random_like(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """A real tensor for a parameter, buffer or input whose values are not known.

    Floating tensors get small normal values (finite, like an initialised model), drawn from
    ``gen`` for the first :data:`RANDOM_POOL` elements and repeated over the rest. Integer
    tensors get zeros and bool tensors ones: an integer buffer is most often an index (position
    ids, an embedding's row), and 0 is in range for any non-empty table; an all-true mask keeps
    every row attended.

    >>> g = torch.Generator().manual_seed(0)
    >>> random_like((2, 3), torch.int64, torch.device("cpu"), g).tolist()
    [[0, 0, 0], [0, 0, 0]]
    """
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    if not (dtype.is_floating_point or dtype.is_complex):
        return t.fill_(True) if dtype == torch.bool else t.zero_()
    flat = t.view(-1)
    pool = torch.empty(min(flat.numel(), RANDOM_POOL), dtype=dtype, device=device)
    pool.normal_(0.0, 0.02, generator=gen)
    whole = flat.numel() // max(pool.numel(), 1) * pool.numel()
    if whole:
        flat[:whole].view(-1, pool.numel()).copy_(pool.expand(whole // pool.numel(), -1))
    flat[whole:].copy_(pool[: flat.numel() - whole])
    return t


def _signature_order(module: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs in the order of ``forward``'s parameters (how torch.export flattens them)."""
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return dict(kwargs)
    ordered = {k: kwargs[k] for k in names if k in kwargs}
    ordered.update({k: v for k, v in kwargs.items() if k not in ordered})
    return ordered


def _matches(value: Any, placeholder: fx.Node) -> bool:
    val = placeholder.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (
            isinstance(value, torch.Tensor)
            and tuple(value.shape) == tuple(val.shape)
            and value.dtype == val.dtype
        )
    return not isinstance(value, torch.Tensor)


def real_inputs(
    model: ModelInputs, device: torch.device, gen: torch.Generator
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's example inputs as real tensors on ``device``.

    Real example inputs keep their values (OPT's synthesised token ids are in range); meta or
    fake ones are made up with :func:`random_like`.
    """

    def make(t: torch.Tensor) -> torch.Tensor:
        if _is_real(t):
            return t.detach().to(device)
        return random_like(t.shape, t.dtype, device, gen)

    args, kwargs = pytree.tree_map_only(torch.Tensor, make, (model.args, model.kwargs))
    return tuple(args), dict(kwargs)


def graph_inputs(
    cap: Capture,
    model: ModelInputs,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    gen: torch.Generator,
) -> list[Any]:
    """A real value for every placeholder of the captured graph, in placeholder order.

    Parameters, buffers and constants are made from the placeholder's recorded shape and dtype
    (already the setting's parameter dtype); user inputs are ``args``/``kwargs`` flattened as
    torch.export flattens them.
    """
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    user = [p for p in placeholders if cap.input_kinds.get(p.name, ("input",))[0] == "input"]
    leaves = None
    for candidate in (_signature_order(model.module, kwargs), kwargs):
        flat = pytree.tree_leaves((args, candidate))
        if len(flat) == len(user) and all(_matches(v, p) for v, p in zip(flat, user)):
            leaves = flat
            break
    if leaves is None:
        raise VerifyError(
            f"the example inputs of {model.name!r} do not match the captured graph's inputs: "
            "pass the same args/kwargs that were traced"
        )
    by_user = dict(zip((p.name for p in user), leaves))
    values: list[Any] = []
    for p in placeholders:
        if p.name in by_user:
            values.append(by_user[p.name])
            continue
        kind, target = cap.input_kinds.get(p.name, ("parameter", p.name))
        val = p.meta.get("val")
        if not isinstance(val, torch.Tensor):
            values.append(val)
            continue
        held = getattr(cap.graph_module, target, None) if kind == "constant" else None
        if isinstance(held, torch.Tensor) and _is_real(held):
            values.append(held.detach().to(device))  # a lifted constant's real value
        else:
            values.append(random_like(val.shape, val.dtype, device, gen))
    return values


# -- the cast log ----------------------------------------------------------------------------------
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

    >>> import torch
    >>> lin, x = torch.nn.Linear(16, 16), torch.randn(1, 16)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16), CastLog() as log:
    ...     _ = lin(x)
    >>> len(log.casts)
    3
    """

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[LoggedCast] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(out, torch.Tensor):
            source = args[0]
            if isinstance(source, torch.Tensor) and source.dtype != out.dtype:
                self.casts.append(LoggedCast(source, source.dtype, out.dtype))
        return out


def _labelled(casts: list[LoggedCast], labels: dict[int, str]) -> list[tuple[str, str, str]]:
    return [
        (labels.get(id(c.source), INTERNAL), dtype_name(c.from_dtype), dtype_name(c.to_dtype))
        for c in casts
    ]


def _cast_text(casts: Sequence[tuple[str, str, str]]) -> str:
    if not casts:
        return "no casts"
    return ", ".join(f"{n} {short_dtype(f)}->{short_dtype(t)}" for n, f, t in casts)


# -- running the graph for real --------------------------------------------------------------------
@dataclass
class Observed:
    """What one node really did."""

    outputs: list[str | None] | None = None
    error: str | None = None
    skipped: str | None = None
    casts: list[tuple[str, str, str]] = field(default_factory=list)
    checked_casts: bool = False


@contextlib.contextmanager
def _autocast_off() -> Iterator[None]:
    """Autocast off on every device type: how the annotation says an op is called."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            dtype = torch.get_autocast_dtype(device_type)
            stack.enter_context(autocast_state(device_type, False, dtype))
        yield


def _eligible(t: Any, device_type: str) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.device.type == device_type
        and t.is_floating_point()
        and t.dtype != torch.float64
    )


class RealExecution(FakeReplay):
    """Run a captured graph node by node on real tensors under real autocast.

    Records, per qualified node name, the output dtypes or the error (:class:`Observed`), and the
    casts autocast made there (see the module docstring for how they are told apart).
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
    ) -> None:
        super().__init__(gm, setting, prefix)
        self.device = device  # baked device= arguments go to this very device
        self.predicted = predicted
        self.observed: dict[str, Observed] = observed if observed is not None else {}
        #: The device type whose autocast the predicted policies are for (regions may change it).
        self.autocast_device = autocast_device or setting.device_type

    # -- bookkeeping --------------------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        name = self.qualified(n)
        if n.op == "call_function":
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
                obs.casts = self._autocast_casts(n, args, kwargs, log.casts)

    def _labels(self, n: fx.Node) -> dict[int, str]:
        """id(tensor) -> qualified name of the input node that produced it (as annotate does)."""
        labels: dict[int, str] = {}
        for a in n.all_input_nodes:
            value = self.env.get(a)
            for t in tensor_leaves(value):
                labels.setdefault(id(t), self.qualified(a))
        return labels

    def _autocast_casts(
        self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any], logged: list[LoggedCast]
    ) -> list[tuple[str, str, str]]:
        labels = self._labels(n)
        own = Counter(self._own_casts(n, args, kwargs, labels))
        out: list[tuple[str, str, str]] = []
        for item in _labelled(logged, labels):  # the multiset difference
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

    def _own_casts(
        self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any], labels: dict[int, str]
    ) -> list[tuple[str, str, str]]:
        """The node's own conversions: run it with autocast off, called as the annotation says."""
        rec = self.predicted.get(self.qualified(n))
        call = self._predicted_call(n, rec, args, kwargs, labels)
        target, call_args, call_kwargs, replaced = call
        own_labels = {k: v for k, v in labels.items() if k not in replaced}
        log = CastLog()
        with _autocast_off(), log, contextlib.suppress(Exception):
            # The op may fail here where a prediction was wrong; casts before that still count.
            target(*call_args, **call_kwargs)
        return _labelled(log.casts, own_labels)

    def _predicted_call(
        self,
        n: fx.Node,
        rec: NodeRecord | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        labels: dict[int, str],
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], set[int]]:
        """The call the annotation says autocast makes: predicted casts and dtype= applied."""
        target: Any = n.target
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
        with _autocast_off():
            call_args, call_kwargs = pytree.tree_map_only(torch.Tensor, cast, (args, kwargs))
        policy = rec.policy if rec else None
        if isinstance(target, torch._ops.OpOverload) and policy in (
            P.FP32_SET_OPT_DTYPE,
            P.FP32_APPEND_DTYPE,
        ):
            first = call_args[0] if call_args else next(iter(call_kwargs.values()), None)
            eligible = _eligible(first, self.autocast_device)
            if policy == P.FP32_SET_OPT_DTYPE:
                if eligible and _dtype_arg(target, call_args, call_kwargs) is None:
                    call_kwargs = {**call_kwargs, "dtype": torch.float32}
            else:
                entry = P.entry_name(target._schema.name, target._overloadname)
                packet, overload = P.APPEND_DTYPE_REDISPATCH[entry].split(".")
                target = getattr(getattr(torch.ops.aten, packet), overload)
                dtype = torch.float32 if eligible else first.dtype
                call_kwargs = {**call_kwargs, "dtype": dtype}
        return target, tuple(call_args), dict(call_kwargs), replaced

    # -- autocast regions -------------------------------------------------------------------------
    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        # Unpacked here rather than with replay.region_args, whose shape is still moving:
        # wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands), or
        # wrap_with_set_grad_enabled(enabled, body, *operands), which changes no dtype.
        if n.target is WRAP_WITH_AUTOCAST:
            device_type, dtype, enabled, _cache, body, *operands = args
            device_type = str(device_type)
            if dtype is None:
                dtype = torch.get_autocast_dtype(device_type)
            with warnings.catch_warnings():
                # torch.autocast("cuda", enabled=False) warns without CUDA; it is a no-op then.
                warnings.simplefilter("ignore")
                scope: Any = torch.autocast(
                    device_type=device_type, dtype=dtype, enabled=bool(enabled)
                )
        else:
            _grad, body, *operands = args
            # A grad-mode region keeps the autocast around it (and the device type it applies to).
            device_type, scope = self.autocast_device, contextlib.nullcontext()
        child = RealExecution(
            body,
            self.setting,
            self.device,
            self.predicted,
            self.observed,
            prefix=f"{self.prefix}{n.name}.",
            autocast_device=device_type,
        )
        with scope:
            value = self.run_body(child, body, tuple(operands), n)
        self.observed.setdefault(self.qualified(n), Observed()).checked_casts = True
        return value


def _dtype_arg(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            if not arg.kwarg_only and i < len(args):
                return args[i]
            return kwargs.get("dtype")
    return None


@contextlib.contextmanager
def _real_autocast(setting: Setting) -> Iterator[None]:
    """``torch.autocast`` as the setting says; autocast off on the other device type."""
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
            )
        )
        yield


def run_graph(
    cap: Capture, records: Sequence[NodeRecord], values: Sequence[Any], device: torch.device
) -> dict[str, Observed]:
    """Run the captured graph on real ``values`` under the setting's real autocast."""
    interp = RealExecution(cap.graph_module, cap.setting, device, {r.name: r for r in records})
    with torch.no_grad(), _real_autocast(cap.setting):
        interp.run(*values)
    return interp.observed


# -- the eager model ------------------------------------------------------------------------------
@dataclass
class HookCall:
    """One leaf-module call as the seed notebook's forward hook saw it."""

    path: str
    type: str
    in_dtype: str | None
    out_dtype: str | None = None
    error: str | None = None

    def hook_line(self) -> str:
        def name(d: str | None) -> str:
            return f"torch.{d}" if d else "None"

        tail = f"error: {self.error}" if self.error else f"out={name(self.out_dtype)}"
        return f"[{self.path}] in={name(self.in_dtype)} -> {tail}"


def _first_dtype(value: Any) -> str | None:
    # The seed's hook: ``inp[0].dtype if isinstance(inp, (tuple, list)) else inp.dtype``.
    item = value[0] if isinstance(value, (tuple, list)) and value else value
    return dtype_name(item.dtype) if isinstance(item, torch.Tensor) else None


def _module_tensors(
    module: nn.Module, cap: Capture, values: Sequence[Any]
) -> dict[str, torch.Tensor]:
    """Qualified parameter/buffer name -> the real tensor the graph ran with."""
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    out: dict[str, torch.Tensor] = {}
    for p, value in zip(placeholders, values):
        kind, target = cap.input_kinds.get(p.name, ("input", p.name))
        if kind in ("parameter", "buffer") and isinstance(value, torch.Tensor):
            out[target] = value
    return out


def run_eager(
    model: ModelInputs,
    cap: Capture,
    values: Sequence[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    gen: torch.Generator,
) -> list[HookCall]:
    """Run the eager model on the graph's real tensors with the seed's hooks on leaf modules.

    The module (built on meta) gets the very tensors the graph ran with, in the setting's
    parameter dtype as ``model.to(dtype)`` leaves them; tied weights stay tied. A leaf call
    that raises is recorded with its error, and the run stops there, as the notebook's would.
    """
    by_name = _module_tensors(model.module, cap, values)
    names: dict[int, list[str]] = {}
    for name, t in [
        *model.module.named_parameters(remove_duplicate=False),
        *model.module.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(id(t), []).append(name)
    param_dtype = torch_dtype(cap.setting.param_dtype)

    def make(t: torch.Tensor) -> torch.Tensor:
        for name in names.get(id(t), []):
            if name in by_name:
                return by_name[name]
        dtype = param_dtype if t.is_floating_point() else t.dtype  # what Module.to(dtype) does
        return random_like(t.shape, dtype, device, gen)  # not used by the traced forward

    from ampgraph.capture import swapped_tensors

    calls: list[HookCall] = []
    running: list[HookCall] = []
    handles = []

    def pre_hook(path: str, type_: str) -> Callable[..., None]:
        def hook(m: nn.Module, inp: Any, kw: dict[str, Any]) -> None:
            first = inp if inp else list(kw.values())
            running.append(HookCall(path, type_, _first_dtype(first)))

        return hook

    def post_hook(m: nn.Module, inp: Any, kw: dict[str, Any], out: Any) -> None:
        call = running.pop()
        call.out_dtype = _first_dtype(out)
        calls.append(call)

    for path, mod in model.module.named_modules():
        if next(iter(mod.children()), None) is not None:
            continue
        type_ = type(mod).__name__
        handles.append(mod.register_forward_pre_hook(pre_hook(path, type_), with_kwargs=True))
        handles.append(mod.register_forward_hook(post_hook, with_kwargs=True))
    try:
        with (
            swapped_tensors(model.module, make),
            torch.inference_mode(),
            _real_autocast(cap.setting),
        ):
            try:
                model.module(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the model's own error, maybe predicted
                failing = running[-1] if running else HookCall("(top level)", "", None)
                failing.error = first_line(exc)
                calls.append(failing)
    finally:
        for handle in handles:
            handle.remove()
    return calls


# -- comparing ------------------------------------------------------------------------------------
def _predicted_text(rec: NodeRecord) -> str:
    if rec.not_analysed is not None:
        return f"not analysed ({rec.not_analysed.partition(':')[0]})"
    if rec.error:
        return f"error: {rec.error}"
    if rec.skipped:
        return f"not run (input from failed {rec.skipped})"
    return ", ".join(short_dtype(d) for d in rec.outputs) or "-"


def _observed_text(obs: Observed | None) -> str:
    if obs is None:
        return "not run"
    if obs.error:
        return f"error: {obs.error}"
    if obs.skipped:
        return f"not run (input from failed {obs.skipped})"
    return ", ".join(short_dtype(d) for d in (obs.outputs or [])) or "-"


def compare_nodes(
    records: Sequence[NodeRecord], observed: dict[str, Observed]
) -> tuple[Figure, Figure, list[Disagreement]]:
    """Node outcomes and casts, prediction against real execution."""
    nodes_agree = nodes_total = casts_agree = casts_total = 0
    found: list[Disagreement] = []
    for rec in records:
        if rec.kind in SOURCE_KINDS:
            continue  # placeholders are made from their own annotation: nothing to prove
        obs = observed.get(rec.name)
        nodes_total += 1
        predicted, seen = _predicted_text(rec), _observed_text(obs)
        if (
            obs is not None
            # A node ampgraph did not analyse is no prediction: it never counts as agreeing.
            and rec.not_analysed is None
            and (rec.error or None) == obs.error
            and (rec.skipped or None) == (obs.skipped or None)
            and (rec.error or rec.skipped or rec.outputs == obs.outputs)
        ):
            nodes_agree += 1
        else:
            found.append(Disagreement("node", rec.name, rec.op, predicted, seen, rec.module))
        if obs is None or not obs.checked_casts or rec.kind != "op":
            continue
        want = Counter((c.node, c.from_dtype, c.to_dtype) for c in rec.casts)
        got = Counter(obs.casts)
        both = sum((want & got).values())
        casts_agree += both
        casts_total += sum((want | got).values())
        if want != got:
            found.append(
                Disagreement(
                    "cast",
                    rec.name,
                    rec.op,
                    _cast_text([(c.node, c.from_dtype, c.to_dtype) for c in rec.casts]),
                    _cast_text(obs.casts),
                    rec.module,
                )
            )
    return Figure(nodes_agree, nodes_total), Figure(casts_agree, casts_total), found


def compare_modules(report: Report, hooks: Sequence[HookCall]) -> tuple[Figure, list[Disagreement]]:
    """The annotation's module view against the eager hooks, call by call in order."""
    import difflib

    predicted = list(report.modules)
    seen = list(hooks)
    eager_failed = any(h.error for h in hooks)
    found: list[Disagreement] = []
    agree = 0
    matcher = difflib.SequenceMatcher(
        a=[c.path for c in predicted], b=[h.path for h in seen], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for call, hook in zip(predicted[i1:i2], seen[j1:j2]):
                error = call_error(report, call)
                want = (call.in_dtype, None if error else call.out_dtype, error)
                got = (hook.in_dtype, None if hook.error else hook.out_dtype, hook.error)
                if want == got:
                    agree += 1
                else:
                    text = (
                        call.hook_line()
                        if not error
                        else (f"[{call.path}] in=torch.{call.in_dtype} -> error: {error}")
                    )
                    found.append(Disagreement(
                        "module", call.path, call.type.rsplit(".", 1)[-1],
                        text, hook.hook_line(),
                    ))  # fmt: skip
            continue
        for call in predicted[i1:i2]:
            if eager_failed and all(report.node(name).skipped for name in call.nodes):
                agree += 1  # downstream of the error: not run in the graph nor in eager mode
                continue
            found.append(Disagreement(
                "module", call.path, call.type.rsplit(".", 1)[-1], call.hook_line(),
                "no such call in the eager run",
            ))  # fmt: skip
        for hook in seen[j1:j2]:
            found.append(Disagreement(
                "module", hook.path, hook.type, "no such call in the annotation", hook.hook_line(),
            ))  # fmt: skip
    total = agree + len(found)
    return Figure(agree, total), found


def weight_bytes(module: nn.Module, param_dtype: torch.dtype) -> int:
    """Bytes of real parameters and buffers ``verify`` materialises, as ``Module.to`` makes them."""
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) in seen:
            continue  # tied weights are materialised once
        seen.add(id(t))
        dtype = param_dtype if t.is_floating_point() else t.dtype
        total += t.numel() * dtype.itemsize
    return total


def available_memory(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes (MemAvailable for the CPU), or None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(
    model: ModelInputs, setting: Setting, device: torch.device, *, force: bool = False
) -> None:
    """Refuse, in one line and before any allocation, weights that cannot fit on ``device``."""
    need = weight_bytes(model.module, torch_dtype(setting.param_dtype))
    free = available_memory(device)
    if free is not None and need > 0.8 * free and not force:
        raise VerifyError(
            f"verify needs about {need / 1e9:.1f} GB of real weights for {model.name} "
            f"({setting.name}) and {device} has {free / 1e9:.1f} GB free: verify a smaller model "
            "(the dispatcher check, 'ampgraph check', needs no weights), or pass --force"
        )


# -- the whole verification -----------------------------------------------------------------------
def verify(
    model: ModelInputs,
    setting: Setting | str,
    *,
    device: str | torch.device | None = None,
    seed: int = 0,
    force: bool = False,
) -> VerifyResult:
    """Verify the annotation of ``model`` in ``setting`` against real execution.

    ``device`` is the real device (default: the setting's device type, e.g. ``cpu``); it must be
    of the setting's device type, whose autocast policy tables the annotation used. Raises
    :class:`NoDeviceError` for ``cuda`` on a machine without one.

    >>> import torch
    >>> from ampgraph.models import ModelInputs
    >>> lin = ModelInputs("linear", torch.nn.Linear(16, 16), (torch.randn(1, 16),))
    >>> r = verify(lin, "autocast=on,device=cpu")
    >>> print(r.summary_line())                                            # doctest: +ELLIPSIS
    linear amp-fp32 (cpu bf16) on ...: nodes 2/2, modules 1/1, casts 3/3 agree; 0 disagreements
    """
    from ampgraph.analysis import analyze_capture

    if isinstance(setting, str):
        setting = Setting.parse(setting)
    dev = resolve_device(setting, device)
    check_memory(model, setting, dev, force=force)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    cap = capture(model, setting)
    report = analyze_capture(cap, check=False)
    seconds["capture_annotate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(seed)
    args, kwargs = real_inputs(model, dev, gen)
    values = graph_inputs(cap, model, args, kwargs, dev, gen)
    seconds["materialise"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    observed = run_graph(cap, report.nodes, values, dev)
    nodes, casts, found = compare_nodes(report.nodes, observed)
    seconds["graph"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    hooks = run_eager(model, cap, values, args, kwargs, dev, gen)
    modules, module_found = compare_modules(report, hooks)
    seconds["eager"] = time.perf_counter() - t0
    del values  # the real weights; the result keeps only dtypes
    return VerifyResult(
        model=model.name,
        setting=setting,
        device=str(dev),
        device_name=device_name(dev),
        versions=_versions(),
        date=_now(),
        nodes=nodes,
        modules=modules,
        casts=casts,
        disagreements=found + module_found,
        eager_hooks=[h.hook_line() for h in hooks],
        seconds={k: round(v, 3) for k, v in seconds.items()},
        report=report,
    )


__all__ = [
    "CastLog",
    "Disagreement",
    "Figure",
    "NoDeviceError",
    "RealExecution",
    "VerifyError",
    "VerifyResult",
    "device_name",
    "verify",
    "verify_record",
    "write_record",
]
