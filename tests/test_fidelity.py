"""Exact on models nobody here tuned for (issue 10): each class of mistake on a module made for it.

Every expectation is the eager model's own forward hooks on fake tensors with the real autocast
kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`) or the dispatcher check, never a literal
written from ampgraph's output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph import analyze, policy
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = ("fp32", "half", "amp-half", "amp-fp32")


def _agree(model: ModelInputs, setting: Setting) -> list[str]:
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    return lines


class IdentityLeaves(nn.Module):
    """timm's and torchvision's no-op leaves: nn.Identity, and a layer-scale switched off."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Identity()
        self.fc = nn.Linear(8, 8)
        self.drop_path = nn.Identity()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        x = x + self.drop_path(self.fc(x))
        return self.head(self.norm(x))


@pytest.mark.parametrize("name", SETTINGS)
def test_leaves_that_run_no_op_are_listed_as_their_hooks_print_them(name: str) -> None:
    model = ModelInputs("identity", IdentityLeaves().eval(), (torch.randn(2, 8),))
    lines = _agree(model, Setting.parse(name))
    paths = [line.split("]")[0][1:] for line in lines]
    if name != "half":  # half raises at fc: fp32 input, bf16 weight
        assert paths == ["norm", "fc", "drop_path", "norm", "head"]


class NoTensorLeaves(nn.Module):
    """No-op leaves fed a list or a number: a hook prints None for what is no tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.pair = nn.Identity()
        self.scale = nn.Identity()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, x = self.pair([self.fc(x), x])
        s = self.scale(2.0)
        return self.head(y + x) * s


@pytest.mark.parametrize("name", SETTINGS)
def test_leaves_fed_no_tensor_are_listed_and_later_calls_still_print(name: str) -> None:
    model = ModelInputs("no-tensor", NoTensorLeaves().eval(), (torch.randn(2, 8),))
    lines = _agree(model, Setting.parse(name))
    if name != "half":  # half raises at fc: fp32 input, bf16 weight
        assert [line.split("]")[0][1:] for line in lines] == ["fc", "pair", "scale", "head"]
        assert lines[2] == "[scale] in=None -> out=None"


def test_verify_compares_the_identity_leaves_too() -> None:
    from ampgraph.verify import verify

    model = ModelInputs("identity", IdentityLeaves().eval(), (torch.randn(2, 8),))
    result = verify(model, Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok and result.modules.total == 5


class Losses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 10)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loss(self.fc(x), y), torch.einsum("ij,kj->ik", x, x)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_composites_are_annotated_through_every_level(device: str) -> None:
    """CUDA cross_entropy_loss -> log_softmax (given bf16) -> nll_loss_nd -> nll_loss in fp32."""
    model = ModelInputs("losses", Losses(), (torch.randn(4, 8), torch.zeros(4, dtype=torch.long)))
    setting = Setting.parse("amp-fp32", device_type=device)
    _agree(model, setting)
    loss = analyze(model, setting).node("cross_entropy_loss")
    assert loss.outputs == ["float32"]
    if device == "cuda":
        assert "log_softmax (fp32 (output dtype))" in loss.reason
        assert "nll_loss_nd → nll_loss (fp32)" in loss.reason
        assert [(c.from_dtype, c.to_dtype) for c in loss.casts] == [("bfloat16", "float32")]


class Stops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.fc2(self.fc1(x)))


def test_nothing_is_printed_after_the_call_that_raises() -> None:
    model = ModelInputs("stops", Stops(), (torch.randn(2, 8),))
    lines = _agree(model, Setting.parse("half"))
    assert len(lines) == 1 and "error: mat1 and mat2 must have the same dtype" in lines[0]


class BiasedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_model_that_raises_while_tracing_is_reported_at_its_node(device: str) -> None:
    """The half setting raises at the first conv, inside torch.export: reported there."""
    model = ModelInputs("conv", BiasedConv(), (torch.randn(1, 3, 8, 8),))
    report = analyze(model, Setting.parse("half", device_type=device))
    # Traced in its setting on past the raise (issue 25), not retyped from fp32.
    assert report.capture["method"] == "make-fx"
    assert [r.op for r in report.nodes if r.error] == ["aten.conv2d.default"]
    expected = (
        "[conv] in=torch.float32 -> error: Input type (float) and bias type (c10::BFloat16) "
        "should be the same"
    )
    assert hook_lines(report) == [expected]
    assert report.check["disagreements"] == 0


class Spectrum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x, dim=-1).abs()


class SpectrumFirst(nn.Module):
    """Reads its weights' dtype while tracing; the CPU FFT has no 16-bit kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.spec = Spectrum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.spec(x.to(self.fc.weight.dtype)))


class LayerFirst(SpectrumFirst):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum() + self.spec(x.to(self.fc.weight.dtype)).sum()


def test_a_kernel_without_the_dtype_is_an_error_at_its_node_not_a_failed_capture() -> None:
    """``Unsupported dtype BFloat16`` (NotImplementedError) is the model's error, as a dtype
    mismatch is: the first layer's error is reported where it is, as the eager run raises it."""
    model = ModelInputs("layer-first", LayerFirst(), (torch.randn(3, 4, 4),))
    lines = _agree(model, Setting.parse("half", device_type="cpu"))
    assert len(lines) == 1 and lines[0].startswith("[fc] in=torch.float32 -> error: mat1 and")


def test_a_retyped_prediction_that_runs_past_the_raise_is_a_disagreement() -> None:
    """The forward raises at the FFT of ``x.to(weight.dtype)`` in the half setting. Traced in
    the setting on past the raise (issue 25), the graph holds bf16 there, as the real run."""
    model = ModelInputs("spectrum-first", SpectrumFirst(), (torch.randn(3, 4, 4),))
    setting = Setting.parse("half", device_type="cpu")
    assert _agree(model, setting) == [
        "[spec] in=torch.bfloat16 -> error: Unsupported dtype BFloat16"
    ]


class PReLUTwice(nn.Module):
    """In ``half`` the PReLU runs on bf16 (``x.to(weight.dtype)``), then the Linear raises; the
    fake Linear does not, so tracing goes on to the PReLU of its fp32 output, which raises."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.PReLU()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x.to(self.fc.weight.dtype)).float().sum() + self.act(self.fc(x)).sum()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_retyped_error_before_the_raise_is_a_disagreement(device: str) -> None:
    """The graph traced with fp32 parameters feeds the first PReLU fp32 and predicts "Type
    promoting not supported" there; the forward traced in the setting ran it and raised later."""
    model = ModelInputs("prelu-twice", PReLUTwice(), (torch.randn(3, 4),))
    setting = Setting.parse("half", device_type=device)
    eager = eager_hook_lines(model, setting)
    assert eager[0] == "[act] in=torch.bfloat16 -> out=torch.bfloat16"
    assert eager[1].startswith("[fc] in=torch.float32 -> error:") and len(eager) == 2
    assert _agree(model, setting) == eager  # traced on past the raise (issue 25)


def test_export_pre_dispatch_dtypes_are_a_note_not_a_disagreement() -> None:
    """upsample_bilinear2d.vec is traced in bf16 at pre-dispatch; the kernels give fp32."""

    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear")

    report = analyze(Up(), "amp-fp32", args=(torch.randn(1, 3, 4, 4),))
    up = next(r for r in report.nodes if "upsample" in r.op)
    assert up.outputs == ["float32"] and up.check["agree"]
    assert up.check["export"] == ["bfloat16"] and "Python decomposition" in up.check["note"]
    assert report.check["disagreements"] == 0


torchvision = pytest.importorskip("torchvision", reason="needs torchvision")


class RoIHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.align = torchvision.ops.RoIAlign((2, 2), 1.0, 2)
        self.pool = torchvision.ops.RoIPool((2, 2), 1.0)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        f = self.conv(x)
        return self.fc((self.align(f, [boxes]) + self.pool(f, [boxes])).flatten(1))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", ["amp-fp32", "amp-half"])
def test_torchvision_autocast_kernels_are_applied(device: str, name: str) -> None:
    """roi_align has CUDA and CPU autocast wrappers, roi_pool a CUDA one only: on the CPU the
    real run raises at roi_pool (bf16 features, fp32 boxes), on CUDA everything runs."""
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    model = ModelInputs("roi", RoIHead().eval(), (torch.randn(1, 3, 8, 8), boxes))
    lines = _agree(model, Setting.parse(name, device_type=device))
    report = analyze(model, Setting.parse(name, device_type=device))
    align = next(r for r in report.nodes if r.op == "torchvision.roi_align.default")
    assert align.policy == policy.FP32_OUTPUT_AS_INPUT and align.outputs == ["bfloat16"]
    assert ("error" in lines[-1]) == (device == "cpu")


def test_library_kernels_table_matches_the_dispatcher() -> None:
    for op, (devices, _category) in policy.LIBRARY_KERNELS.items():
        for device in ("cuda", "cpu", "xpu"):
            assert policy.has_autocast_kernel(device, op) == (device in devices), (op, device)


def test_an_unknown_autocast_kernel_is_said_not_predicted() -> None:
    lib = torch.library.Library("ampgraph_test", "DEF")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("scale", lambda x: x * 2, "Meta")

    def autocast_scale(x: torch.Tensor) -> torch.Tensor:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet("AutocastCUDA")):
            return torch.ops.ampgraph_test.scale(x.half())

    lib.impl("scale", autocast_scale, "AutocastCUDA")

    class Custom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.ampgraph_test.scale(x)

    report = analyze(Custom(), "amp-fp32", args=(torch.randn(2, 2),), check=False)
    node = next(r for r in report.nodes if "scale" in r.op)
    assert node.policy == policy.OPAQUE and node.reason.startswith("not analysed")
    assert policy.autocast_kernels("cuda")["ampgraph_test::scale"] == policy.OPAQUE


class Sampler(nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        # align_corners=True takes cuDNN's grid sampler on CUDA (RAFT's correlation lookup).
        return F.grid_sample(x, grid, align_corners=True)


GPU_KERNELS = {
    "gru_cell": lambda: (nn.GRUCell(8, 8), (torch.randn(2, 8),)),
    "lstm_cell": lambda: (nn.LSTMCell(8, 8), (torch.randn(2, 8),)),
    "rnn_cell": lambda: (nn.RNNCell(8, 8), (torch.randn(2, 8),)),
    "grid_sampler": lambda: (Sampler(), (torch.randn(1, 3, 8, 8), torch.rand(1, 4, 4, 2))),
}


@pytest.mark.parametrize("name", ["fp32", "amp-fp32", "amp-half"])
@pytest.mark.parametrize("case", sorted(GPU_KERNELS))
def test_kernels_that_need_a_driver_on_fake_tensors_are_analysed(case: str, name: str) -> None:
    module, args = GPU_KERNELS[case]()
    lines = _agree(ModelInputs(case, module, args), Setting.parse(name))
    assert "not analysed" not in lines[0] and "error" not in lines[0]


class MaskedSelect(nn.Module):
    """Outputs whose size depends on the data: a boolean-mask index, nonzero."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.fc(x)
        return self.head(x), y[y > 0].sum(), torch.nonzero(y)


@pytest.mark.parametrize("name", SETTINGS)
def test_data_dependent_shapes_keep_their_dtypes(name: str) -> None:
    model = ModelInputs("masked", MaskedSelect(), (torch.randn(2, 8),))
    setting = Setting.parse(name)
    _agree(model, setting)
    report = analyze(model, setting)
    index = next(r for r in report.nodes if r.op == "aten.index.Tensor")
    if name != "half":
        assert index.error is None and index.outputs == [report.node("linear").out_dtype]


def test_data_dependent_shapes_agree_with_a_real_cpu_run() -> None:
    from ampgraph.verify import verify

    model = ModelInputs("masked", MaskedSelect(), (torch.randn(2, 8),))
    for name in ("amp-fp32", "amp-half"):
        result = verify(model, Setting.parse(name, device_type="cpu"))
        assert result.ok, result.disagreements
