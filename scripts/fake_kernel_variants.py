"""The fake-kernel survey's cases: each OpInfo sample made again in mixed dtypes and run three ways.

A sample of an op (``op_db``'s, or a backward kernel's, :func:`_backward_ops`) with two or more
floating tensors becomes its mixed-dtype variants (:func:`_variants`), each run on the real CPU
kernel and on fake CPU tensors (:func:`survey_sample`), then again as ampgraph replays it
(:func:`ampgraph_pass`); :class:`Variant` says how each way parts from the real kernel.
``scripts/fake_kernel_survey.py`` drives it over ``op_db`` and writes the page
(``scripts/fake_kernel_page.py``); ``scripts/gpu_survey.py`` reuses the cases on a GPU.

>>> _variants(2)[:2]
[(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import types
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
LOW = (BF16, F16)
SHORT = {F32: "f32", BF16: "bf16", F16: "f16", torch.float64: "f64"}
#: Ops whose results are random or whose samples allocate without values: nothing to compare.
RANDOM = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "empty",
          "exponential", "cauchy", "geometric", "log_normal", "new_", "randint")  # fmt: skip
AGREES, LENIENT, STRICT, DTYPE = "agrees", "lenient", "strict", "dtype"


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_Timeout` in the main thread after ``seconds`` (a slow sample)."""

    def fire(signum: int, frame: Any) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_op_db() -> list[Any]:
    """``op_db``; ``common_utils`` imports ``expecttest`` for its test base class only."""
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            stub = types.ModuleType("expecttest")
            stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
            sys.modules["expecttest"] = stub
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


@dataclass
class Outcome:
    """One call: the first line of its error, or its output tensors' dtypes."""

    error: str | None = None
    dtypes: tuple[torch.dtype, ...] = ()
    unsupported: bool = False  # the fake kernel cannot run it at all (no meta, data-dependent)

    def describe(self) -> str:
        if self.error is not None:
            return f"raises `{self.error}`"
        return "-> " + ", ".join(SHORT.get(d, str(d)) for d in self.dtypes)


@dataclass
class Variant:
    """A sample's call, its floating tensors given ``dtypes``, and what each way made of it."""

    op: str
    call: str
    real: Outcome
    raw: Outcome
    ampgraph: Outcome = field(default_factory=Outcome)
    cuda: Outcome = field(default_factory=Outcome)
    #: Runs the call on fake tensors of a device under dispatch modes (for the second pass).
    rerun: Callable[[str, list[Any]], Outcome] | None = None

    def kind(self, fake: Outcome) -> str:
        if (self.real.error is None) == (fake.error is None):
            return AGREES if self.real.error or self.real.dtypes == fake.dtypes else DTYPE
        return LENIENT if self.real.error else STRICT


@dataclass
class OpRow:
    """Every variant of one op (an OpInfo name and variant)."""

    name: str
    samples: int = 0
    variants: list[Variant] = field(default_factory=list)
    skipped: str = ""

    def kinds(self, way: str) -> list[str]:
        return sorted({k for v in self.variants if (k := v.kind(getattr(v, way))) != AGREES})

    def example(self, way: str) -> Variant | None:
        order = (LENIENT, STRICT, DTYPE)
        parting = [v for v in self.variants if v.kind(getattr(v, way)) != AGREES]
        return min(parting, key=lambda v: order.index(v.kind(getattr(v, way))), default=None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _fake_unsupported(exc: BaseException) -> bool:
    from torch._subclasses import fake_tensor as ft

    kinds = (ft.UnsupportedOperatorException, ft.DynamicOutputShapeException,
             ft.DataDependentOutputException, NotImplementedError, _Timeout)  # fmt: skip
    name = type(exc).__name__
    return isinstance(exc, kinds) or "GuardOnDataDependent" in name or "Unsupported" in name


def _run(fn: Callable[[], Any], fake: bool, seconds: float) -> Outcome:
    try:
        with _time_limit(seconds):
            out = fn()
    except Exception as exc:  # noqa: BLE001 - the error is the outcome
        if isinstance(exc, _Timeout) or (fake and _fake_unsupported(exc)):
            return Outcome(unsupported=True, error=type(exc).__name__)
        return Outcome(error=_first_line(exc))
    leaves = pytree.tree_leaves(out)
    return Outcome(dtypes=tuple(t.dtype for t in leaves if isinstance(t, torch.Tensor)))


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype == F32


def _variants(n: int) -> list[tuple[torch.dtype, ...]]:
    """Dtype assignments for ``n`` floating arguments: one 16-bit among fp32 and the reverse, for
    the first four arguments, then all bf16 and all fp16."""
    found: dict[tuple[torch.dtype, ...], None] = {}
    for i in range(min(n, 4)):
        for low in LOW:
            found[tuple(low if j == i else F32 for j in range(n))] = None
            found[tuple(F32 if j == i else low for j in range(n))] = None
    for low in LOW:
        found[(low,) * n] = None
    return list(found)


def _describe_call(name: str, leaves: list[Any], spec: Any) -> str:
    def show(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{SHORT.get(v.dtype, str(v.dtype).removeprefix('torch.'))}{list(v.shape)}"
        return repr(v) if not isinstance(v, float) else f"{v:g}"

    inp, args, kwargs = pytree.tree_unflatten([show(v) for v in leaves], spec)
    parts = [str(inp), *[str(a) for a in args], *[f"{k}={v}" for k, v in kwargs.items()]]
    return f"{name}({', '.join(parts)})".replace("'", "")


def survey_sample(
    opinfo: Any, name: str, sample: Any, seconds: float = 5.0
) -> list[Variant] | None:
    """Every mixed-dtype variant of one sample, or None where its fp32 call already parts."""
    from ampgraph.torchutil import fake_mode

    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, v in enumerate(leaves) if _floating(v)]
    if len(positions) < 2:
        return None
    supported = opinfo.supported_dtypes("cpu")
    op = opinfo.op

    def call(values: list[Any]) -> Any:
        inp, args, kwargs = pytree.tree_unflatten(values, spec)
        return op(inp, *args, **kwargs)

    def with_dtypes(dtypes: dict[int, torch.dtype]) -> list[Any]:
        return [v.to(dtypes[i]) if i in dtypes else v for i, v in enumerate(leaves)]

    def fake_call(values: list[Any], device: str, modes: list[Any]) -> Outcome:
        def go() -> Any:
            with contextlib.ExitStack() as stack:
                mode = stack.enter_context(fake_mode())
                fakes = [
                    (mode.from_tensor(v) if device == "cpu" else
                     torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device))
                    if isinstance(v, torch.Tensor) else v
                    for v in values
                ]  # fmt: skip
                for m in modes:
                    stack.enter_context(m)
                return call(fakes)

        return _run(go, fake=True, seconds=seconds)

    base = with_dtypes({})
    real0, fake0 = _run(lambda: call(base), False, seconds), fake_call(base, "cpu", [])
    if real0.error or fake0.error or real0.dtypes != fake0.dtypes:
        return None
    out = []
    for assignment in _variants(len(positions)):
        if any(d not in supported for d in assignment):
            continue
        values = with_dtypes(dict(zip(positions, assignment, strict=True)))
        real = _run(lambda values=values: call(values), False, seconds)
        raw = fake_call(values, "cpu", [])
        if real.unsupported or raw.unsupported:
            continue
        text = _describe_call(name, values, spec)

        def rerun(device: str, modes: list[Any], values: list[Any] = values) -> Outcome:
            return fake_call(values, device, modes)

        out.append(Variant(name, text, real, raw, rerun=rerun))
    return out


def ampgraph_pass(rows: list[OpRow]) -> None:
    """Every variant again as ampgraph replays it: its replaced meta kernels (imported only now,
    so that the first pass saw the fake kernels alone) and its dispatch modes."""
    import ampgraph.capture.meta_kernels  # noqa: F401 - registers the replacements
    from ampgraph.annotate.kernel_dtypes import RealCpuDtypes
    from ampgraph.annotate.strict import StrictDtypeMode

    for row in rows:
        kept = []
        for v in row.variants:
            assert v.rerun is not None
            v.ampgraph = v.rerun("cpu", [StrictDtypeMode("cpu"), RealCpuDtypes()])
            v.cuda = v.rerun("cuda", [StrictDtypeMode("cuda")])
            if not v.ampgraph.unsupported:
                kept.append(v)
        row.variants = kept


@dataclass
class BackwardOp:
    """A backward kernel ``op_db`` does not list (a training step's joint trace replays them),
    with one fp32 sample, in the shape of an OpInfo for :func:`survey_op`."""

    name: str
    op: Any
    make: Callable[[], tuple[Any, ...]]
    variant_test_name: str = ""

    def supported_dtypes(self, device: str) -> set[torch.dtype]:
        return {F32, BF16, F16}

    def sample_inputs(self, device: str, dtype: torch.dtype) -> list[Any]:
        from torch.testing._internal.opinfo.core import SampleInput

        first, *rest = self.make()
        return [SampleInput(first, args=tuple(rest))]


def _backward_ops() -> list[BackwardOp]:
    aten, r = torch.ops.aten, torch.randn
    idx = torch.zeros(3, dtype=torch.long)
    stats = (r(2, 1), r(2, 1))
    return [
        BackwardOp("threshold_backward", aten.threshold_backward, lambda: (r(4), r(4), 0.0)),
        BackwardOp("mse_loss_backward", aten.mse_loss_backward, lambda: (r(()), r(4), r(4), 1)),
        BackwardOp("glu_backward", aten.glu_backward, lambda: (r(2, 2), r(2, 4), -1)),
        BackwardOp("log_sigmoid_backward", aten.log_sigmoid_backward, lambda: (r(4), r(4), r(4))),
        BackwardOp("gelu_backward", aten.gelu_backward, lambda: (r(4), r(4))),
        BackwardOp("silu_backward", aten.silu_backward, lambda: (r(4), r(4))),
        BackwardOp("sigmoid_backward", aten.sigmoid_backward, lambda: (r(4), r(4))),
        BackwardOp("tanh_backward", aten.tanh_backward, lambda: (r(4), r(4))),
        BackwardOp("hardswish_backward", aten.hardswish_backward, lambda: (r(4), r(4))),
        BackwardOp(
            "_log_softmax_backward_data", aten._log_softmax_backward_data,
            lambda: (r(3, 4), r(3, 4), 1, F32),
        ),
        BackwardOp(
            "nll_loss_backward", aten.nll_loss_backward,
            lambda: (r(()), r(3, 5), idx, r(5), 1, -100, r(())),
        ),
        BackwardOp(
            "native_layer_norm_backward", aten.native_layer_norm_backward,
            lambda: (r(2, 8), r(2, 8), [8], *stats, r(8), r(8), [True, True, True]),
        ),
        BackwardOp(
            "native_group_norm_backward", aten.native_group_norm_backward,
            lambda: (r(2, 4, 3), r(2, 4, 3), r(2, 2), r(2, 2), r(4), 2, 4, 3, 2, [True] * 3),
        ),
        BackwardOp(
            "native_batch_norm_backward", aten.native_batch_norm_backward,
            lambda: (r(2, 4, 3), r(2, 4, 3), r(4), r(4), r(4), r(4), r(4), True, 1e-5, [True] * 3),
        ),
    ]  # fmt: skip


def _skip_reason(opinfo: Any) -> str:
    name = opinfo.name
    if any(r in name for r in RANDOM):
        return "random"
    if "sparse" in name or name.startswith(("_refs", "_native")) or "fft" in name:
        return "sparse, complex or internal"
    if name.startswith("jiterator_"):  # PyTorch's own test ops: an illegal address on an H100
        return "jiterator test ops (their CUDA kernels kill the process)"
    if F32 not in opinfo.supported_dtypes("cpu"):
        return "no fp32 on cpu"
    return ""


def survey_op(opinfo: Any, max_samples: int = 3, op_seconds: float = 6.0) -> OpRow:
    """Up to ``max_samples`` samples of one OpInfo with two or more floating tensor arguments."""
    name = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
    row = OpRow(name, skipped=_skip_reason(opinfo))
    if row.skipped:
        return row
    start = time.perf_counter()
    torch.manual_seed(0)
    try:
        with _time_limit(op_seconds):
            samples = list(opinfo.sample_inputs("cpu", F32))
    except Exception:  # noqa: BLE001 - a sample generator that fails or is slow
        row.skipped = "samples slow or failing"
        return row
    for sample in samples:
        if row.samples >= max_samples or time.perf_counter() - start > op_seconds:
            break
        found = survey_sample(opinfo, name, sample)
        if found is not None:
            row.samples += 1
            row.variants += found
    if not row.samples:
        row.skipped = "fewer than two floating tensors, or fp32 already parts"
    return row
