"""Issue 42: branches meant for ``torch.compile`` only are not taken in a capture.

Model code asks ``torch.compiler.is_compiling()`` (transformers' ``is_torchdynamo_compiling()``,
``torch._dynamo.external_utils.is_compiling()``) to take a path only a compiler should take:
transformers' MoE experts call their ``grouped_mm_fallback`` loop instead of ``F.grouped_mm``.
export and make-fx set that flag while tracing, so the capture took the compiler's path and the
real run did not, and ``check`` agreed with the graph it had traced: a silent wrong answer. The
model's code now sees ``is_compiling()`` false, as in an eager run, and ``is_exporting()`` as
export has it (:func:`ampgraph.capture.raises.as_eager_runs`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = [
    (n, d) for n in ("fp32", "half", "amp-half", "amp-fp32") for d in ("bfloat16", "float16")
]


def _transformers_query() -> Callable[[], bool]:
    transformers_utils = pytest.importorskip("transformers.utils")
    return transformers_utils.is_torchdynamo_compiling


#: How model code asks; each reads the one flag export and make-fx set.
QUERIES = {
    "torch.compiler": lambda: torch.compiler.is_compiling,
    "torch._dynamo": lambda: __import__(
        "torch._dynamo.external_utils", fromlist=["is_compiling"]
    ).is_compiling,
    "transformers": _transformers_query,
}


class CompileOnly(nn.Module):
    """Upcasts between its layers only when compiled: the second layer's input is fp32 there
    and 16-bit in an eager run under autocast."""

    def __init__(
        self, is_compiling: Callable[[], bool], seen: list[tuple[bool, bool]] | None = None
    ) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)
        self.is_compiling = is_compiling
        # What the forward saw, kept outside the module: the capture puts a module's own
        # containers back as it found them (capture/module_io.modules_kept).
        self.note = (seen if seen is not None else []).append

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.note((torch.compiler.is_compiling(), torch.compiler.is_exporting()))
        h = self.fc(x.to(self.fc.weight.dtype))
        if self.is_compiling():
            h = h.float()
        if not torch.is_autocast_enabled(x.device.type):  # the half setting's own cast
            h = h.to(self.out.weight.dtype)
        return self.out(h)


def _model(
    query: str = "torch.compiler", seen: list[tuple[bool, bool]] | None = None
) -> ModelInputs:
    torch.manual_seed(0)
    module = CompileOnly(QUERIES[query](), seen).eval()
    return ModelInputs("compile-only", module, (torch.randn(3, 8),))


@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_the_capture_takes_the_eager_path(name: str, dtype: str) -> None:
    setting = Setting.parse(name, amp_dtype=dtype)
    model = _model()
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    if name.startswith("amp"):  # the eager run's fc output, autocast's 16-bit dtype
        assert f"[out] in=torch.{dtype} -> out=torch.{dtype}" in lines


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_every_way_of_asking(query: str) -> None:
    model = _model(query)
    setting = Setting.parse("amp-fp32")
    lines = hook_lines(analyze(model, setting))
    assert "[out] in=torch.bfloat16 -> out=torch.bfloat16" in lines
    assert lines == eager_hook_lines(model, setting)


def test_export_keeps_its_own_flag_and_both_are_restored() -> None:
    """The line: ``is_exporting()`` is export's (torch's tracing machinery reads it), so the
    model sees it true on export's path; ``is_compiling()`` false; both as before afterwards."""
    seen: list[tuple[bool, bool]] = []
    analyze(_model(seen=seen), Setting.parse("amp-fp32"), check=False)
    assert seen and set(seen) == {(False, True)}
    assert (torch.compiler.is_compiling(), torch.compiler.is_exporting()) == (False, False)


@pytest.mark.parametrize("name", ["amp-fp32", "amp-half"])
def test_the_real_cpu_run_agrees(name: str) -> None:
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_transformers_moe_experts_call_grouped_mm_as_a_real_run_does() -> None:
    """Mixtral's experts in fp32: a real run calls ``F.grouped_mm``; under a compiler they call
    ``transformers::grouped_mm_fallback`` (non-bf16 weights). The capture now holds the op the
    real run calls, and agrees with the dispatcher and the eager hooks."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(torch.nn.functional, "grouped_mm"):
        pytest.skip("this torch has no F.grouped_mm")
    config = transformers.MixtralConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    module = transformers.MixtralModel(config).eval()
    ids = torch.randint(0, 99, (2, 7))
    with torch.inference_mode(), _Ops() as real:
        module(input_ids=ids, use_cache=False)
    grouped = {n for n in real.names if "grouped_mm" in n}
    assert grouped == {"aten._grouped_mm.default"}
    model = ModelInputs("mixtral", module, (), {"input_ids": ids, "use_cache": False})
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    traced = {n.target or n.op for n in report.nodes if "grouped_mm" in (n.target or n.op)}
    assert traced == {"aten._grouped_mm.default"}
    assert hook_lines(report) == eager_hook_lines(model, setting)


def test_the_training_verification_runs_as_the_capture() -> None:
    from ampgraph.verify.training import as_exported

    seen = []
    with as_exported():
        seen.append((torch.compiler.is_compiling(), torch.compiler.is_exporting()))
    assert seen == [(False, True)]
    assert (torch.compiler.is_compiling(), torch.compiler.is_exporting()) == (False, False)
