"""Verify a training step for real: the eager model's forward and ``loss.backward()``.

``ampgraph verify --pass train`` proves the backward analysis (:mod:`ampgraph.train.backward`) against
real execution. The eager model runs with real tensors on the device (CPU here), in training
mode, under the real ``torch.autocast``; the loss is the same ``output.float().sum()``, computed
inside the context; ``loss.backward()`` runs outside it (or inside, as asked). Three things are
compared with the prediction:

1. **gradients**: every parameter's ``.grad`` dtype (or that it has none);
2. **saved**: every tensor autograd really saved, as a ``saved_tensors_hooks`` pack hook sees it,
   in order: dtype, shape, bytes, and whose memory it is (activation, parameter, a 16-bit copy
   of a parameter, input); and the activation memory summed per dtype, each storage once;
3. **backward ops**: every op the backward runs, as a dispatch mode under autograd sees it (the
   level the joint graph was traced at), in order, with its output dtypes; views and aliases,
   which compute nothing, are left out.

The eager model runs as the capture ran it while tracing: with ``torch.compiler.is_exporting()``
true and ``is_compiling()`` false (:func:`ampgraph.capture.raises.as_eager_runs`: no path meant
for ``torch.compile`` only), and transformers' "is this traced?" answered as a real run answers
it (:func:`ampgraph.capture.known_values.real_run_answers`), as the capture answers it where it
follows the inputs' values. transformers then drops an all-ones attention mask, as a plain eager
step does, and lets SDPA handle causality and grouped key/value heads itself: OPT-125M saves no
mask, llama-tiny's SDPA saves its two key/value heads, not the eight repeated for a mask. Run on
export's answer instead, the oracle built the mask the capture (and the real run) drops, and
disagreed with a correct prediction.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
>>> r = verify_train(ModelInputs("mlp", mlp, (torch.randn(2, 8),)), "autocast=on,device=cpu")
>>> from ampgraph.formats.verify import summary_line
>>> print(summary_line(r))                                               # doctest: +ELLIPSIS
mlp amp-fp32 (cpu bf16) train on ...: gradients 4/4, saved 4/4, memory 1/1, backward ops .../... agree; 0 disagreements
"""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.capture.casts import cast_floating
from ampgraph.capture.known_values import KnownValues, real_run_answers
from ampgraph.capture.trace import training_mode
from ampgraph.errors import first_line
from ampgraph.model.build import ModelInputs
from ampgraph.report.records import Report, SavedTensor
from ampgraph.settings import Setting, short_dtype
from ampgraph.torchutil import autocast_state, dtype_name, swapped_tensors, torch_dtype
from ampgraph.train.backward import ParameterCopies
from ampgraph.report.memory import activation_bytes_by_dtype
from ampgraph.verify.device import check_memory, device_name, resolve_device
from ampgraph.verify.results import Agreement, Disagreement, Verification, now, versions
from ampgraph.verify.tensors import random_like, real_inputs


@dataclass(kw_only=True)
class TrainVerifyResult(Verification):
    """The training step of one model in one setting, prediction against real execution."""

    backward_autocast: bool
    gradients: Agreement
    saved: Agreement
    memory: Agreement
    backward_ops: Agreement

    #: Training-step records have called their counts ``figures`` from the start.
    AGREEMENT_KEY: ClassVar[str] = "figures"
    pass_: ClassVar[str] = "train"

    def agreement(self) -> dict[str, Agreement]:
        return {
            "gradients": self.gradients,
            "saved": self.saved,
            "memory": self.memory,
            "backward_ops": self.backward_ops,
        }

    def _run(self) -> dict[str, Any]:
        return {"pass": "train", "backward_autocast": self.backward_autocast}


# -- running the step for real ----------------------------------------------------------------------
@contextlib.contextmanager
def as_exported() -> Iterator[None]:
    """``torch.compiler.is_exporting()`` true and ``is_compiling()`` false, as the capture traces
    the forward (see the module docstring for why)."""
    from torch import compiler

    flags = (compiler._is_compiling_flag, compiler._is_exporting_flag)
    compiler._is_compiling_flag, compiler._is_exporting_flag = False, True
    try:
        yield
    finally:
        compiler._is_compiling_flag, compiler._is_exporting_flag = flags


def is_view_op(name: str) -> bool:
    """Whether an ATen op (``aten.t.default``) returns a view or alias of an input: no compute.

    >>> is_view_op("aten.t.default"), is_view_op("aten.mm.default")
    (True, False)
    """
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return False
    op = getattr(getattr(torch.ops.aten, parts[1], None), parts[2], None)
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


class OpLog(TorchDispatchMode):
    """Every op that reaches the dispatcher below autograd, with its output dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[str | None, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func), tuple(
            dtype_name(v.dtype) if isinstance(v, torch.Tensor) else None
            for v in pytree.tree_leaves(out)
        )))  # fmt: skip
        return out


@dataclass
class RealStep:
    """What the real training step did."""

    saved: list[SavedTensor]
    gradients: dict[str, str | None]
    ops: list[tuple[str, tuple[str | None, ...]]]


def _output_by_path(out: Any, path: str) -> torch.Tensor | None:
    for key_path, leaf in pytree.tree_flatten_with_path(out)[0]:
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path]
        if ".".join(parts) == path:
            return leaf if isinstance(leaf, torch.Tensor) else None
    return None


def run_step(
    model: ModelInputs,
    setting: Setting,
    loss_path: str,
    device: torch.device,
    *,
    backward_autocast: bool = False,
    random_seed: int = 0,
    exported: bool = True,
) -> RealStep:
    """Run the eager model's training step for real and record what autograd did.

    ``exported``: model code that asks ``torch.compiler.is_exporting()`` gets export's answer,
    as the capture traced it; False where the capture followed a real run's path instead
    (a report's ``capture["real_run"]``: export's path raised)."""
    gen = torch.Generator(device=device).manual_seed(random_seed)

    def make(t: torch.Tensor) -> torch.Tensor:
        # Module.to(dtype), or a recipe that keeps the buffers in their own dtype.
        kind = "parameter" if isinstance(t, torch.nn.Parameter) else "buffer"
        name = setting.floating_dtype(kind) if t.is_floating_point() else None
        return random_like(t.shape, t.dtype if name is None else torch_dtype(name), device, gen)

    # The inputs and outputs as the setting's recipe casts them (input_dtype, output_dtype).
    args, kwargs = cast_floating(real_inputs(model, device, gen), setting.input_dtype)
    saved: list[tuple[torch.Tensor, str]] = []
    kinds: dict[int, str] = {}
    storages: dict[int, int] = {}
    log = OpLog()
    amp_dtype = torch_dtype(setting.amp_dtype)
    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped_tensors(model.module, make))
        stack.enter_context(training_mode(model.module, True))
        stack.enter_context(as_exported() if exported else contextlib.nullcontext())
        # transformers' own question, answered as a real run and the capture answer it (a real
        # tensor's values are known): an all-ones mask dropped, not built for export's sake.
        stack.enter_context(real_run_answers(KnownValues({})))
        for other in ("cpu", "cuda"):
            if other != setting.device_type:
                stack.enter_context(autocast_state(other, False, torch.get_autocast_dtype(other)))
        for kind, tensors in (
            ("parameter", list(model.module.parameters())),
            ("buffer", list(model.module.buffers())),
            (
                "input",
                [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)],
            ),
        ):
            for t in tensors:
                kinds.setdefault(t.untyped_storage()._cdata, kind)
        watch = ParameterCopies({k for k, v in kinds.items() if v in ("parameter", "buffer")})

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append((t, ""))  # noqa: F821 - runs before the `del saved` below
            return t

        autocast = torch.autocast(setting.device_type, dtype=amp_dtype, enabled=setting.autocast)
        with autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watch:
            out = cast_floating(model.module(*args, **kwargs), setting.output_dtype, outputs=True)
            chosen = _output_by_path(out, loss_path)
            if chosen is None:
                raise ValueError(f"the eager model returned no tensor at {loss_path!r}")
            loss = chosen.float().sum()
        scope = (
            torch.autocast(setting.device_type, dtype=amp_dtype)
            if backward_autocast and setting.autocast
            else contextlib.nullcontext()
        )
        with scope, log:
            loss.backward()
        gradients = {
            name: dtype_name(p.grad.dtype) if p.grad is not None else None
            for name, p in model.module.named_parameters()
        }
    records = []
    for t, _owner in saved:
        key = t.untyped_storage()._cdata
        number = storages.setdefault(key, len(storages))
        kind = kinds.get(key, "activation")
        if kind == "activation" and key in watch.storages:
            kind = "parameter copy"
        records.append(SavedTensor(
            node="", module=None, dtype=dtype_name(t.dtype), shape=list(t.shape),
            bytes=t.numel() * t.element_size(), storage=number,
            storage_bytes=t.untyped_storage().nbytes(), kind=kind,
        ))  # fmt: skip
    del saved, out, loss, watch
    return RealStep(saved=records, gradients=gradients, ops=log.ops)


# -- comparing -------------------------------------------------------------------------------------
def _saved_key(t: SavedTensor) -> tuple[Any, ...]:
    return (t.dtype, tuple(t.shape), t.bytes, t.kind)


def _saved_text(t: SavedTensor) -> str:
    return f"{t.kind} {short_dtype(t.dtype)}{list(t.shape)} {t.bytes} B"


def _aligned(
    kind: str,
    predicted: Sequence[Any],
    observed: Sequence[Any],
    labels: Sequence[tuple[str, str]],
    text: Any,
) -> tuple[Agreement, list[Disagreement]]:
    """Compare two sequences in order; each predicted item unmatched or mismatched is one
    disagreement, each observed item left over another."""
    matcher = difflib.SequenceMatcher(a=list(predicted), b=list(observed), autojunk=False)
    agree = 0
    found: list[Disagreement] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            agree += i2 - i1
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            i, j = i1 + k, j1 + k
            node, op = labels[i] if i < i2 else ("", "")
            found.append(Disagreement(
                kind, node, op,
                text(predicted[i]) if i < i2 else "nothing here",
                text(observed[j]) if j < j2 else "nothing here",
            ))  # fmt: skip
    return Agreement(agree, agree + len(found)), found


def compare_step(report: Report, real: RealStep) -> tuple[dict[str, Agreement], list[Disagreement]]:
    """The prediction in ``report.backward`` against the real step."""
    assert report.backward is not None
    bw = report.backward
    found: list[Disagreement] = []
    figures: dict[str, Agreement] = {}

    predicted_grads = {g.parameter: g.dtype for g in bw.gradients}
    agree = 0
    for name in dict.fromkeys([*predicted_grads, *real.gradients]):
        want, got = predicted_grads.get(name, "absent"), real.gradients.get(name, "absent")
        if want == got:
            agree += 1
        else:
            found.append(Disagreement("gradient", name, "parameter", f"grad {want}", f"grad {got}"))
    figures["gradients"] = Agreement(agree, agree + len(found))

    figure, diffs = _aligned(
        "saved",
        [_saved_key(t) for t in bw.saved],
        [_saved_key(t) for t in real.saved],
        [(t.node, t.module or "") for t in bw.saved],
        lambda key: f"{key[3]} {short_dtype(key[0])}{list(key[1])} {key[2]} B",
    )
    figures["saved"] = figure
    found += diffs

    want_mem = activation_bytes_by_dtype(bw.saved)
    got_mem = activation_bytes_by_dtype(real.saved)
    same = want_mem == got_mem
    figures["memory"] = Agreement(int(same), 1)
    if not same:
        found.append(Disagreement(
            "memory", "activations", "saved for backward",
            _mem_text(want_mem), _mem_text(got_mem),
        ))  # fmt: skip

    predicted_ops: list[tuple[str, tuple[str | None, ...]]] = []
    labels: list[tuple[str, str]] = []
    for rec in bw.nodes:
        if rec.kind != "op":
            continue
        for cast in rec.casts:  # autocast's casts in a backward inside the context
            predicted_ops.append(("aten._to_copy.default", (cast.to_dtype,)))
            labels.append((rec.name, rec.forward or ""))
        if is_view_op(rec.op) or not rec.op.startswith("aten."):
            continue  # views compute nothing; getitem is Python's, not the dispatcher's
        predicted_ops.append((rec.op, tuple(rec.outputs)))
        labels.append((rec.name, f"{rec.op}, backward of {rec.forward}"))
    observed_ops = [op for op in real.ops if not is_view_op(op[0])]
    figure, diffs = _aligned(
        "backward-op", predicted_ops, observed_ops, labels,
        lambda item: f"{item[0]} -> {', '.join(short_dtype(d) for d in item[1]) or '-'}",
    )  # fmt: skip
    figures["backward_ops"] = figure
    found += diffs
    return figures, found


def _mem_text(by_dtype: dict[str, int]) -> str:
    return ", ".join(f"{short_dtype(d)} {b} B" for d, b in sorted(by_dtype.items())) or "none"


def verify_train(
    model: ModelInputs,
    setting: Setting | str,
    *,
    device: str | torch.device | None = None,
    random_seed: int | None = None,
    force: bool | None = None,
    loss: str | int | None = None,
    backward_autocast: bool = False,
) -> TrainVerifyResult:
    """Verify the training-step analysis of ``model`` in ``setting`` against a real step;
    ``random_seed`` and ``force`` left None are the analysis environment's, as
    :func:`ampgraph.verify.verify`'s."""
    from ampgraph.capture.environment import current
    from ampgraph.pipeline.stages import analyze

    setting = Setting.parse(setting)
    real_run = current().real_run.given(seed=random_seed, force=force)
    dev = resolve_device(setting, device)
    check_memory(model, setting, dev, force=real_run.force)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    report = analyze(
        model, setting, check=False, pass_="train", loss=loss, backward_autocast=backward_autocast
    )
    seconds["analyze"] = time.perf_counter() - t0
    assert report.backward is not None
    t0 = time.perf_counter()
    figures = {k: Agreement(0, 0) for k in ("gradients", "saved", "memory", "backward_ops")}
    found: list[Disagreement] = []
    skipped = report.backward.skipped
    try:
        real = run_step(
            model, setting, report.backward.loss["output"], dev,
            backward_autocast=backward_autocast, random_seed=real_run.seed,
            exported=not report.capture.get("real_run"),
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the model's own error: predicted, or a finding
        if not skipped:
            found.append(Disagreement("step", "", "", "a backward", f"error: {first_line(exc)}"))
    else:
        if skipped:
            found.append(Disagreement("step", "", "", f"no backward: {skipped}", "the step ran"))
        else:
            figures, found = compare_step(report, real)
    seconds["step"] = time.perf_counter() - t0
    return TrainVerifyResult(
        model=model.name,
        setting=setting,
        backward_autocast=backward_autocast and setting.autocast,
        device=str(dev),
        device_name=device_name(dev),
        versions=versions(),
        date=now(),
        gradients=figures["gradients"],
        saved=figures["saved"],
        memory=figures["memory"],
        backward_ops=figures["backward_ops"],
        disagreements=found,
        seconds={k: round(v, 3) for k, v in seconds.items()},
        report=report,
    )


__all__ = ["OpLog", "RealStep", "TrainVerifyResult", "as_exported", "run_step", "verify_train"]
