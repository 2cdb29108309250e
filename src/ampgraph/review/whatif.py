"""What if some modules ran in fp32, or an op were on another of autocast's lists?

``ampgraph diff --keep-fp32 PATTERN`` and ``ampgraph diff --move-op OP=LIST``.

The usual fix for a module that misbehaves in 16 bits is an autocast-disabled region (seed 002's
"fp32 wrapper"): ``with torch.autocast(device, enabled=False):`` around the module's forward, its
floating inputs cast to fp32 first. :func:`keep_fp32` does exactly that to the matching modules
of a built model, for as long as the ``with`` lasts, so the ordinary capture traces the region
(``wrap_with_autocast``) and the ordinary annotator and dispatcher check see it as they see any
region written in a model's code. :func:`preview_keep_fp32` analyses a model with and without.

Moving an op (:func:`parse_moves`, :func:`preview_moves`) changes both sides of the analysis at
once, each in its own way, so that the check still proves something: the annotator reads moved
tables (:func:`ampgraph.policy.moved`), and the dispatcher gets, for the preview's duration, an
autocast kernel for the op that does what the new list does (:func:`moved_kernels`), written
here from ``autocast_mode.h``'s wrappers and sharing no code with the annotator's rules.

>>> import torch
>>> from ampgraph.pipeline.stages import analyze
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
>>> with keep_fp32(net, ["1"]) as kept:
...     r = analyze(net, "autocast=on,device=cpu", args=(torch.randn(2, 4),), check=False)
>>> kept, [n.policy for n in r.nodes if n.op == "aten.linear.default"]
(['1'], ['lower_precision_fp', None])
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.capture.scoped_library import ScopedLibrary
from ampgraph import policy as P
from ampgraph.errors import AmpgraphError
from ampgraph.model.build import ModelInputs
from ampgraph.report.records import Report
from ampgraph.settings import Setting

#: Device types whose autocast a region turns off: whichever is enabled when the module runs.
_DEVICE_TYPES = ("cuda", "cpu", "xpu", "mps")


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value


def _fp32_forward(forward: Any) -> Any:
    """``forward`` in an autocast-disabled region with its floating inputs cast to fp32."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        enabled = [d for d in _DEVICE_TYPES if torch.is_autocast_enabled(d)]
        if not enabled:
            return forward(*args, **kwargs)  # nothing to disable: the model as it is
        with torch.autocast(enabled[0], enabled=False):
            args, kwargs = torch.utils._pytree.tree_map(_to_fp32, (args, kwargs))
            return forward(*args, **kwargs)

    return wrapped


def matching_modules(module: nn.Module, patterns: Sequence[str]) -> list[str]:
    """Paths of the submodules that match a pattern (``fnmatch``: ``model.*.fc2``), outermost
    only: a match inside a module already kept in fp32 adds nothing.

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> matching_modules(net, ["*"])
    ['0', '1']
    """
    out: list[str] = []
    for name, _ in module.named_modules():
        if not name or any(name.startswith(p + ".") for p in out):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            out.append(name)
    return out


@contextlib.contextmanager
def keep_fp32(module: nn.Module, patterns: Sequence[str]) -> Iterator[list[str]]:
    """Run the submodules matching ``patterns`` in autocast-disabled regions while it lasts;
    yields their paths. :class:`~ampgraph.errors.AmpgraphError` when none match."""
    names = matching_modules(module, patterns)
    if not names:
        some = ", ".join(n for n, _ in list(module.named_modules())[1:4])
        raise AmpgraphError(
            f"no module matches {', '.join(map(repr, patterns))}: patterns match module paths "
            f"such as {some} ('ampgraph table' lists them), with * and ? as wildcards"
        )
    subs = [module.get_submodule(n) for n in names]
    for sub in subs:
        sub.forward = _fp32_forward(sub.forward)  # an instance attribute shadows the class's
    try:
        yield names
    finally:
        for sub in subs:
            del sub.forward


def preview_keep_fp32(
    spec: str | ModelInputs,
    setting: Setting | str,
    patterns: Sequence[str],
    *,
    seq_len: int = 8,
    force: bool = False,
    check: bool = True,
) -> tuple[Report, Report]:
    """``spec`` analysed in ``setting`` as it is and with the matching modules kept in fp32.

    The second report's model reads ``MODEL [PATTERN in fp32]``; its dispatcher check (``check``,
    on the second report only) says whether the region behaves as predicted. :func:`preview`
    with ``keep_fp32`` alone.
    """
    return preview(spec, setting, keep=patterns, seq_len=seq_len, force=force, check=check)


# -- moving an op to another list ----------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """One op overload put on another autocast list for a preview."""

    #: The entry as the tables spell it: ``softmax.int`` (ATen), ``mylib::op`` (another library).
    entry: str
    op: torch._ops.OpOverload
    #: One of :data:`ampgraph.policy.MOVE_TARGETS`.
    target: str

    def __str__(self) -> str:
        return f"{self.entry} → {self.target}"


def _entry(namespace: str, packet: str, overload: str) -> str:
    if namespace == "aten":
        return P.entry_name(f"aten::{packet}", overload)
    return f"{namespace}::{packet}" + (f".{overload}" if overload != "default" else "")


def parse_moves(texts: Sequence[str], device_type: str) -> list[Move]:
    """``OP=LIST`` texts as moves on ``device_type``'s lists.

    ``OP`` is an ATen op (``softmax``), an overload (``softmax.int``) or another library's op
    (``mylib::op``); without an overload it means the overloads the lists name today, else the
    one overload that computes on tensors. ``LIST`` is ``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype`` (ops with a
    ``dtype`` argument), ``promote`` or ``none``. :class:`~ampgraph.errors.AmpgraphError` says in
    one line what is wrong with a text.

    >>> [str(m) for m in parse_moves(["softmax=lower_precision_fp", "gelu=fp32"], "cuda")]
    ['softmax.int → lower_precision_fp', 'gelu → fp32']
    """
    moves: dict[str, Move] = {}
    for text in texts:
        name, sep, target = text.rpartition("=")
        name, target = name.strip(), target.strip()
        if not sep or not name:
            raise AmpgraphError(f"{text!r}: a move is OP=LIST, e.g. softmax=lower_precision_fp")
        if target not in P.MOVE_TARGETS:
            raise AmpgraphError(
                f"{text!r}: {target!r} is no list a preview can move an op to: use one of "
                f"{', '.join(P.MOVE_TARGETS)}"
            )
        namespace, _, rest = name.rpartition("::")
        namespace = namespace or "aten"
        packet_name, _, overload = rest.partition(".")
        try:
            packet = getattr(getattr(torch.ops, namespace), packet_name)
        except (AttributeError, RuntimeError):
            raise AmpgraphError(f"{text!r}: torch has no op {namespace}::{packet_name}") from None
        names = packet.overloads()
        if overload:
            if overload not in names:
                raise AmpgraphError(f"{text!r}: {namespace}::{packet_name} has no overload "
                                    f"{overload!r} (it has {', '.join(names)})")  # fmt: skip
            chosen = [overload]
        else:
            schema = f"{namespace}::{packet_name}"
            chosen = [o for o in names if P.lookup(device_type, schema, o) is not None]
            # Else the one overload that computes on tensors (not an out= variant), if one is.
            on_tensors = [
                o for o in names
                if not o.endswith("out")
                and any(str(a.type) == "Tensor" for a in getattr(packet, o)._schema.arguments)
            ]  # fmt: skip
            if not chosen and len(on_tensors) == 1:
                chosen = on_tensors
            if not chosen:
                raise AmpgraphError(f"{text!r}: name one of {namespace}::{packet_name}'s "
                                    f"overloads: {', '.join(on_tensors or names)}")  # fmt: skip
        for o in chosen:
            op = getattr(packet, o)
            if target == P.FP32_SET_OPT_DTYPE and not any(
                a.name == "dtype" for a in op._schema.arguments
            ):
                raise AmpgraphError(f"{text!r}: {op.name()} takes no dtype argument for "
                                    f"{target} to set: use fp32")  # fmt: skip
            entry = _entry(namespace, packet_name, o)
            moves[entry] = Move(entry, op, target)
    return list(moves.values())


def _autocast_kernel(op: torch._ops.OpOverload, target: str, device_type: str) -> Any:
    """An autocast kernel for ``op`` that does what ``target``'s wrapper in ``autocast_mode.h``
    does: cast the eligible arguments (floating, not fp64, on ``device_type``), then run the op
    with this device's autocast key excluded."""
    key = P.autocast_key(device_type)
    assert key is not None
    below = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    schema = op._schema.arguments

    def eligible(t: Any) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.device.type == device_type
            and t.is_floating_point()
            and t.dtype != torch.float64
        )

    def cast_to(dtype: torch.dtype, value: Any) -> Any:
        return pytree.tree_map_only(
            torch.Tensor, lambda t: t.to(dtype) if eligible(t) and t.dtype != dtype else t, value
        )

    def target_dtype(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype | None:
        lower = torch.get_autocast_dtype(device_type)
        if target == P.LOWER_PRECISION_FP:
            return lower
        if target == P.FP32:
            return torch.float32
        # promote: the widest of the Tensor and Tensor[] arguments (optional ones do not vote)
        bound = {a.name: v for a, v in zip(schema, args)} | kwargs
        voters = [v for a in schema if str(a.type) in ("Tensor", "List[Tensor]")
                  for v in pytree.tree_leaves(bound.get(a.name))]  # fmt: skip
        wide = any(eligible(t) and t.dtype == torch.float32 for t in voters)
        return torch.float32 if wide else lower

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(below):
            if target == P.FP32_SET_OPT_DTYPE:
                first = args[0] if args else next(iter(kwargs.values()), None)
                index = next(i for i, a in enumerate(schema) if a.name == "dtype")
                given = args[index] if index < len(args) else kwargs.get("dtype")
                if eligible(first) and given is None:
                    if index < len(args):
                        args = (*args[:index], torch.float32, *args[index + 1 :])
                    else:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            dtype = target_dtype(args, kwargs)
            args, kwargs = cast_to(dtype, (args, kwargs))
            return op(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def moved_kernels(moves: Sequence[Move], device_type: str) -> Iterator[None]:
    """Give the dispatcher the moved ops' autocast kernels while it lasts: each does what its new
    list does (``none``: falls through, as an op on no list does), replacing any kernel the op
    had; on exit the op's own kernel is the one that runs again.

    >>> import torch
    >>> [move] = parse_moves(["gelu=fp32"], "cpu")
    >>> x = torch.ones(2, dtype=torch.bfloat16)
    >>> with moved_kernels([move], "cpu"), torch.autocast("cpu"):
    ...     torch.nn.functional.gelu(x).dtype
    torch.float32
    >>> with torch.autocast("cpu"):
    ...     torch.nn.functional.gelu(x).dtype
    torch.bfloat16
    """
    key = P.autocast_key(device_type)
    if key is None:
        raise AmpgraphError(f"this torch has no autocast kernels for {device_type}")
    dispatch_key = getattr(torch._C.DispatchKey, key)
    libraries: dict[str, ScopedLibrary] = {}
    python_kernels: list[tuple[torch._ops.OpOverload, Any]] = []
    try:
        for move in moves:
            namespace = move.op.namespace
            lib = libraries.get(namespace)
            if lib is None:
                lib = libraries[namespace] = ScopedLibrary(namespace)
            kernel = (
                torch.library.fallthrough_kernel
                if move.target == "none"
                else _autocast_kernel(move.op, move.target, device_type)
            )
            # Refused, before anything is registered, where the op's own kernel could not be
            # put back afterwards (ScopedLibrary): the process would keep the moved one.
            lib.impl(move.op, kernel, key, restorable_only=True)
            # register_autocast also leaves a Python kernel, which tracing would run instead.
            if dispatch_key in move.op.py_kernels:
                python_kernels.append((move.op, move.op.py_kernels.pop(dispatch_key)))
            move.op._dispatch_cache.clear()
        P.registrations_changed()
        yield
    finally:
        for lib in libraries.values():
            lib.destroy()
        for op, python_kernel in python_kernels:
            op.py_kernels[dispatch_key] = python_kernel
        for move in moves:
            move.op._dispatch_cache.clear()
        P.registrations_changed()


@contextlib.contextmanager
def moved_ops(moves: Sequence[Move], device_type: str) -> Iterator[None]:
    """Analyse as if ``moves`` were made, on both sides: the annotator's tables and the
    dispatcher's kernels (:func:`moved_kernels`), so that the check stays a proof."""
    tables = P.moved(P.current_tables(), device_type, {m.entry: m.target for m in moves})
    with P.tables_in_use(tables, P.release_in_use()), moved_kernels(moves, device_type):
        yield


def preview_moves(
    spec: str | ModelInputs,
    setting: Setting | str,
    moves: Sequence[str],
    *,
    seq_len: int = 8,
    force: bool = False,
    check: bool = True,
) -> tuple[Report, Report]:
    """``spec`` analysed in ``setting`` as it is and with the ops ``moves`` names (``OP=LIST``,
    :func:`parse_moves`) on other lists of the setting's device type. :func:`preview` with
    ``moves`` alone.

    >>> import torch
    >>> from ampgraph.model.build import ModelInputs
    >>> net = ModelInputs("net", torch.nn.Linear(4, 4), (torch.randn(2, 4),), {})
    >>> a, b = preview_moves(net, "autocast=on,device=cpu", ["linear=fp32"])
    >>> b.model, b.node("linear").outputs, b.check["disagreements"]
    ('net [linear → fp32]', ['float32'], 0)
    """
    return preview(spec, setting, moves=moves, seq_len=seq_len, force=force, check=check)


@in_analysis_environment
def preview(
    spec: str | ModelInputs,
    setting: Setting | str,
    *,
    keep: Sequence[str] = (),
    moves: Sequence[str] = (),
    seq_len: int = 8,
    force: bool = False,
    check: bool = True,
) -> tuple[Report, Report]:
    """A model (a spec, or :class:`~ampgraph.model.build.ModelInputs`) analysed in ``setting`` as it
    is (A) and with a change (B): the modules matching the patterns ``keep`` in fp32
    (:func:`keep_fp32`), the ops ``moves`` names on other lists (:func:`moved_ops`), or both.

    B's model name says what changed (``MODEL [PATTERN in fp32] [OP → LIST]``); its dispatcher
    check (``check``, on B only: A needs no new proof) says whether the change behaves as
    predicted. Never cached: the preview is the point, and a change is no model identity.
    """
    from ampgraph.pipeline.run import prepare
    from ampgraph.pipeline.stages import analyze

    setting = Setting.parse(setting)
    parsed = parse_moves(moves, setting.device_type)
    model = prepare(spec, seq_len=seq_len, force=force) if isinstance(spec, str) else spec
    before = analyze(model, setting, check=False)
    with contextlib.ExitStack() as stack:
        names = stack.enter_context(keep_fp32(model.module, keep)) if keep else []
        if parsed:
            stack.enter_context(moved_ops(parsed, setting.device_type))
        after = analyze(model, setting, check=check)
    if names and not any(n.op == "higher_order.wrap_with_autocast" for n in after.nodes):
        # A torch that cannot trace fake CUDA tensors traces on meta, without autocast: the
        # wrapper then has nothing to disable, and B would silently equal A.
        raise AmpgraphError(
            f"{', '.join(names)} traced without an autocast region here "
            f"({(after.capture or {}).get('method')}): preview with --device cpu, or on a CUDA "
            "build of torch"
        )
    after.model = before.model
    if keep:
        after.model += f" [{' '.join(keep)} in fp32]"
    if parsed:
        after.model += f" [{', '.join(map(str, parsed))}]"
    return before, after


def checked_note(b: Report, moved: bool) -> str | None:
    """What B's dispatcher check proved, in a line, or None where it did not run.

    >>> from ampgraph.report.records import Report
    >>> r = Report("m", {}, {}, {}, [], [], check={"compared": 3, "disagreements": 0})
    >>> checked_note(r, True)
    "B checked against the dispatcher: 3 ops, all agree (the moved ops ran autocast kernels of their new lists' rules, registered for the preview)"
    """
    if b.check is None:
        return None
    n = b.check.get("disagreements", 0)
    verdict = "all agree" if not n else f"{n} disagree"
    how = (
        " (the moved ops ran autocast kernels of their new lists' rules, registered for the "
        "preview)"
        if moved
        else ""
    )
    return f"B checked against the dispatcher: {b.check.get('compared')} ops, {verdict}{how}"


def findings_note(a: Report, b: Report) -> str | None:
    """How the audit's findings change from ``a`` to ``b``, kind by kind, or None if they do not.

    >>> from ampgraph.report.records import Report
    >>> findings_note(Report("m", {}, {}, {}, [], []), Report("m", {}, {}, {}, [], [])) is None
    True
    """
    from ampgraph.review.audit import audit

    ca, cb = Counter(f.kind for f in audit(a)), Counter(f.kind for f in audit(b))
    changed = [f"{k} {ca[k]} → {cb[k]}" for k in dict.fromkeys([*ca, *cb]) if ca[k] != cb[k]]
    return f"audit findings: {', '.join(changed)}" if changed else None


__all__ = [
    "Move",
    "checked_note",
    "findings_note",
    "keep_fp32",
    "matching_modules",
    "moved_kernels",
    "moved_ops",
    "parse_moves",
    "preview",
    "preview_keep_fp32",
    "preview_moves",
]
