"""Custom ops and autograd Functions under autocast (issue 26): predicted exactly, and audited.

Each mechanism sits in a small model of its own, between two Linears so that its inputs are what
autocast made them. Every expectation comes from the dispatcher (the report's check), the eager
run's forward hooks on fake tensors (:func:`ampgraph.verify.hooks.eager_hook_lines`) or a real
run of the CPU kernels; none is read off ampgraph's output. Custom op names are process-wide, so
each op is registered here, once, at import.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.formats.json import audit_json as to_json
from ampgraph.formats.markdown import audit_markdown as markdown
from ampgraph.formats.sarif import audit_sarif as sarif
from ampgraph.formats.text import audit_text as text
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.report.records import Report
from ampgraph.review.audit import folded
from ampgraph.review.findings import KINDS, audit
from ampgraph.settings import Setting
from ampgraph.torchutil import torch_dtype
from ampgraph.verify.hooks import LeafHooks, eager_hook_lines

Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _promoted(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    return torch.promote_types(a.dtype, b.dtype)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The real kernel of the ops below, as a compiled kernel would run: autocast never reaches
    it. (A Python body's ``@`` would be cast by autocast, which a custom op without an autocast
    kernel leaves enabled; its fake then has to say so, which these fakes do not.)"""
    with torch.autocast(a.device.type, enabled=False):
        return a.to(_promoted(a, b)) @ b.to(_promoted(a, b))


# (a) A custom op with no autocast rule: it runs in its inputs' (promoted) dtype.
@torch.library.custom_op("ampg_test::mm", mutates_args=())
def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _matmul(a, b)


@_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_promoted(a, b))


# (b) The same with register_autocast rules, a different dtype per device type to tell them apart.
@torch.library.custom_op("ampg_test::mm_cast", mutates_args=())
def _mm_cast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _matmul(a, b)


@_mm_cast.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_promoted(a, b))


torch.library.register_autocast(_mm_cast, "cuda", torch.float16)
torch.library.register_autocast(_mm_cast, "cpu", torch.bfloat16)


# A rule on CUDA only: on the CPU the op has none.
@torch.library.custom_op("ampg_test::mm_cuda_rule", mutates_args=())
def _mm_cuda_rule(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _matmul(a, b)


@_mm_cuda_rule.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_promoted(a, b))


torch.library.register_autocast(_mm_cuda_rule, "cuda", torch.float16)


# Python bodies a real run reaches with autocast on (the op has no autocast kernel): one of torch
# calls, which autocast casts, with a fake that says what it returns with autocast off; and one
# through NumPy, which fake tensors cannot run and autocast never reaches.
@torch.library.custom_op("ampg_test::mm_body", mutates_args=())
def _mm_body(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


@_mm_body.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


@torch.library.custom_op("ampg_test::mm_numpy", mutates_args=())
def _mm_numpy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(a.numpy() @ b.numpy())


@_mm_numpy.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


# (e) The older API: torch.library.Library("ns", "DEF"), define and impl; one op without an
# autocast rule, one with register_autocast through the library (a Python kernel, no OpDef).
_LIB = torch.library.Library("ampg_lib", "DEF")
_LIB.define("scale(Tensor a, Tensor b) -> Tensor")
_LIB.define("scale_cast(Tensor a, Tensor b) -> Tensor")


def _scale(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b[0]


def _scale_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape, dtype=_promoted(a, b))


for _name in ("scale", "scale_cast"):
    _LIB.impl(_name, _scale, "CompositeExplicitAutograd")
    torch.library.register_fake(f"ampg_lib::{_name}", _scale_fake, lib=_LIB)
torch.library.register_autocast("ampg_lib::scale_cast", "cuda", torch.float16, lib=_LIB)


# (d) autograd Functions: custom_fwd casting to fp16 (and running with autocast off), and not.
class CastFn(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx: object, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad


class PlainFn(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx: object, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad


OPS: dict[str, Op] = {
    "custom-op": torch.ops.ampg_test.mm,
    "register-autocast": torch.ops.ampg_test.mm_cast,
    "cuda-rule-only": torch.ops.ampg_test.mm_cuda_rule,
    "library-op": torch.ops.ampg_lib.scale,
    "library-register-autocast": torch.ops.ampg_lib.scale_cast,
    "custom-fwd-cast": CastFn.apply,
    "custom-fwd": PlainFn.apply,
}
BODIES: dict[str, Op] = {
    "torch-body": torch.ops.ampg_test.mm_body,
    "numpy-body": torch.ops.ampg_test.mm_numpy,
}


class Call(nn.Module):
    """A leaf that calls ``fn`` on its input and its own weight: its hook line is the op's."""

    def __init__(self, fn: Op) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.w)


class Between(nn.Module):
    """``fc -> op -> out``: the op gets fc's output (16-bit under autocast) and an fp32 weight;
    with ``fed_fp32`` it gets the model's fp32 input, where an ATen matmul would be cast."""

    def __init__(self, fn: Op, fed_fp32: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.op = Call(fn)
        self.out = nn.Linear(8, 8)
        self.fed_fp32 = fed_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.op(x if self.fed_fp32 else self.fc(x)))


CASES = [*OPS, "custom-op-fed-fp32"]
SETTINGS = ("fp32", "half", "amp-half", "amp-fp32")


def model_of(case: str) -> ModelInputs:
    fed_fp32 = case.endswith("-fed-fp32")
    fn = {**OPS, **BODIES}[case.removesuffix("-fed-fp32")]
    module = Between(fn, fed_fp32=fed_fp32).eval()
    return ModelInputs(case, module, (torch.randn(2, 8),))


def agree(model: ModelInputs, setting: Setting) -> tuple[Report, list[str]]:
    """The report, checked by the dispatcher, and its hook lines, equal to the eager run's."""
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    return report, lines


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("case", CASES)
def test_custom_ops_and_functions_are_predicted_exactly(
    case: str, device: str, amp: str, name: str
) -> None:
    setting = Setting.parse(name, device_type=device, amp_dtype=amp)
    report, lines = agree(model_of(case), setting)
    if name == "half" and not case.endswith("-fed-fp32"):
        return  # fc raises first (fp32 input, 16-bit weight): the op never runs
    assert any(line.startswith("[op] ") and "error" not in line for line in lines), lines
    # The op's own node was compared with the dispatcher, not skipped.
    op_nodes = [n for n in report.nodes if n.module == "op" and n.kind in ("op", "region")]
    assert op_nodes and all(n.check is not None and n.check["agree"] for n in op_nodes)


def real_cpu_lines(case: str, setting: Setting) -> list[str]:
    """The hook lines of a real run of the CPU kernels, autocast and all."""
    model = model_of(case)
    module = model.module.to(torch_dtype(setting.param_dtype))
    amp = torch_dtype(setting.amp_dtype)
    with (
        LeafHooks(module) as hooks,
        torch.no_grad(),
        torch.autocast("cpu", dtype=amp, enabled=setting.autocast),
    ):
        try:
            module(*model.args)
        except RuntimeError as exc:
            hooks.failed(exc)
    return [call.hook_line() for call in hooks.calls]


@pytest.mark.parametrize("name", ["fp32", "amp-half", "amp-fp32"])
@pytest.mark.parametrize("case", CASES)
def test_the_cpu_prediction_is_what_the_real_cpu_kernels_return(case: str, name: str) -> None:
    setting = Setting.parse(name, device_type="cpu", amp_dtype="bf16")
    _report, lines = agree(model_of(case), setting)
    assert lines == real_cpu_lines(case, setting)


@pytest.mark.parametrize("name", ["fp32", "amp-fp32"])
def test_a_python_body_autocast_reaches_is_not_analysed_where_its_fake_says_otherwise(
    name: str,
) -> None:
    """On a real run the body's matmul is cast (autocast stays on for an op without an autocast
    kernel); the fake, and so every fake-tensor run, says fp32. The node says it is no
    prediction, naming what the real kernel returns."""
    setting = Setting.parse(name, device_type="cpu", amp_dtype="bf16")
    report, lines = agree(model_of("torch-body-fed-fp32"), setting)
    node = report.node(op_node(report))
    real = real_cpu_lines("torch-body-fed-fp32", setting)
    (real_op,) = [line for line in real if line.startswith("[op] ")]
    if name == "fp32":
        assert node.not_analysed is None and real == lines
        return
    assert real_op.endswith("out=torch.bfloat16") and node.outputs == ["float32"]
    assert node.not_analysed is not None and "returns bf16, where its register_fake" in (
        node.not_analysed
    )
    assert report.check is not None and report.check["not_analysed"] == 1
    assert rule_findings(report) == []  # it does not run in its inputs' dtype


def test_a_body_fake_tensors_cannot_run_leaves_the_fake_standing() -> None:
    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bf16")
    report, lines = agree(model_of("numpy-body-fed-fp32"), setting)
    assert report.node(op_node(report)).not_analysed is None
    assert lines == real_cpu_lines("numpy-body-fed-fp32", setting)


# -- audit: the no-autocast-rule finding -------------------------------------------------------


def rule_findings(report: Report) -> list[str]:
    return [f.node for f in audit(report) if f.kind == "no-autocast-rule"]


def op_node(report: Report) -> str:
    (node,) = [n.name for n in report.nodes if n.module == "op" and n.kind == "op"]
    return node


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_custom_op_fed_16bit_and_fp32_inside_autocast_has_no_rule(device: str) -> None:
    setting = Setting.parse("amp-fp32", device_type=device)
    report, _ = agree(model_of("custom-op"), setting)
    found = [f for f in audit(report) if f.node == op_node(report)]
    assert [f.kind for f in found] == ["no-autocast-rule"]  # and not mixed-dtypes as well
    (f,) = found
    assert f.severity == KINDS["no-autocast-rule"][0] == "warning"
    inputs = [i["dtype"] for i in report.node(f.node).inputs]
    assert sorted(inputs) == ["bfloat16", "float32"]  # what the annotator saw, checked above
    assert report.node(f.node).reason.startswith(f"no autocast rule for ampg_test::mm on {device}")
    assert f.message.startswith(f"ampg_test.mm in op has no autocast rule on {device}: ")
    assert "bf16 mixed with fp32 here" in f.message and "returns fp32" in f.message
    assert "torch.library.register_autocast" in f.suggestion


def test_a_custom_op_running_in_fp32_inside_autocast_has_no_rule() -> None:
    report, _ = agree(model_of("custom-op-fed-fp32"), Setting.parse("amp-fp32"))
    (f,) = [f for f in audit(report) if f.kind == "no-autocast-rule"]
    assert f.node == op_node(report) and "(fp32 here)" in f.message
    # An ATen matmul in its place is cast: autocast has a rule for it.
    aten, _ = agree(
        ModelInputs("aten", Between(torch.matmul, fed_fp32=True).eval(), (torch.randn(2, 8),)),
        Setting.parse("amp-fp32"),
    )
    assert report.node(f.node).outputs == ["float32"]
    assert aten.node(op_node(aten)).outputs == ["bfloat16"]
    assert rule_findings(aten) == []


@pytest.mark.parametrize("case", ["register-autocast", "library-register-autocast"])
def test_no_finding_for_an_op_with_an_autocast_rule(case: str) -> None:
    report, _ = agree(model_of(case), Setting.parse("amp-fp32"))
    assert rule_findings(report) == []


def test_a_rule_on_another_device_is_no_rule_on_this_one() -> None:
    cuda, _ = agree(model_of("cuda-rule-only"), Setting.parse("amp-fp32", device_type="cuda"))
    cpu, _ = agree(model_of("cuda-rule-only"), Setting.parse("amp-fp32", device_type="cpu"))
    assert rule_findings(cuda) == [] and rule_findings(cpu) == [op_node(cpu)]


@pytest.mark.parametrize("name", ["fp32", "half"])
def test_no_finding_outside_autocast(name: str) -> None:
    report, _ = agree(model_of("custom-op-fed-fp32"), Setting.parse(name))
    assert rule_findings(report) == []
    if name == "half":  # fp32 input, bf16 weight: mixed, with no autocast to blame
        assert [f.kind for f in audit(report) if f.node == op_node(report)] == ["mixed-dtypes"]


def test_no_finding_where_only_16bit_inputs_meet() -> None:
    report, _ = agree(model_of("custom-op"), Setting.parse("amp-half"))
    assert [i["dtype"] for i in report.node(op_node(report)).inputs] == ["bfloat16"] * 2
    assert rule_findings(report) == []


class Region(nn.Module):
    """An fp32 model with an autocast region of its own around the custom op."""

    def __init__(self) -> None:
        super().__init__()
        self.op = Call(torch.ops.ampg_test.mm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = self.op(x)
        return self.op(y)


def test_an_autocast_region_in_the_model_counts_and_only_inside_it() -> None:
    report, _ = agree(
        ModelInputs("region", Region().eval(), (torch.randn(2, 8),)), Setting.parse("fp32")
    )
    ops = [n for n in report.nodes if n.op == "ampg_test.mm.default"]
    assert [n.autocast for n in ops] == [True, False]
    assert rule_findings(report) == [ops[0].name]


class Layers(nn.Module):
    """Three identical layers, each calling the custom op on fp32 inside autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Call(torch.ops.ampg_test.mm) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_finding_folds_and_reaches_every_format() -> None:
    report, _ = agree(
        ModelInputs("layers", Layers().eval(), (torch.randn(2, 8),)), Setting.parse("amp-fp32")
    )
    assert len(rule_findings(report)) == 3
    (entry,) = [e for e in folded(report) if e.first.kind == "no-autocast-rule"]
    assert entry.count == 3
    shown = text(report)
    assert "no-autocast-rule" in shown and "layers.0-2" in shown and "×3" in shown
    assert "no-autocast-rule" in markdown(report)
    doc = json.loads(to_json([report]))
    (run,) = doc["audits"]
    assert [f["kind"] for f in run["findings"]].count("no-autocast-rule") == 3
    (group,) = [g for g in run["groups"] if g["kind"] == "no-autocast-rule"]
    assert group["count"] == 3
    results = json.loads(sarif([report]))["runs"][0]
    assert "no-autocast-rule" in {r["id"] for r in results["tool"]["driver"]["rules"]}
    assert [r["ruleId"] for r in results["results"]].count("no-autocast-rule") == 3


def test_a_training_step_through_an_op_without_a_backward_is_one_error() -> None:
    """``ampg_test::mm`` has no ``register_autograd``: a real ``loss.backward()`` raises, and so
    does ``--pass train``, as one AnalysisError naming the op and what to do (it was torch's own
    RuntimeError, and a traceback on the command line)."""
    from ampgraph.errors import AnalysisError

    with pytest.raises(RuntimeError, match="no autograd formula"):  # the real step
        Between(torch.ops.ampg_test.mm)(torch.randn(2, 8)).sum().backward()
    with pytest.raises(AnalysisError, match=r"backward of 'custom-op' cannot be traced: .*mm.*"
                       r"no autograd formula.*--pass forward\)$"):  # fmt: skip
        analyze(model_of("custom-op"), "amp-fp32", pass_="train")
