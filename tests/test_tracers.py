"""Tracers: torch.fx.symbolic_trace and Hugging Face's FX tracer, lowered to ATen by export.

The ``hffx`` tests need transformers < 4.50 (``transformers.utils.fx``); they skip elsewhere, and
run in the side environment ``scripts/hf_fx_env.sh`` makes (transformers 4.45.2 over .venv's
torch), which sets ``AMPGRAPH_REQUIRE_HF_FX=1`` so that a skip there is a failure.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph import Report, Setting, analyze
from ampgraph.capture.tracers import TRACERS, GraphForward, apply_tracer, hf_fx_available
from ampgraph.cli import main
from ampgraph.errors import CaptureError
from ampgraph.model.build import ModelInputs, load_model
from ampgraph.model.specs import TRACERS as SPEC_TRACERS
from ampgraph.model.specs import ModelSpec
from ampgraph.pipeline import cache
from ampgraph.pipeline.run import report_keys
from ampgraph.report.printed import SEED_WATCH, hook_lines

from .conftest import seed_hook_blocks
from .test_regions import Fp32Island, NestedDtype


def _need_hf_fx() -> None:
    if hf_fx_available():
        return
    if os.environ.get("AMPGRAPH_REQUIRE_HF_FX"):
        pytest.fail("AMPGRAPH_REQUIRE_HF_FX is set but transformers.utils.fx is missing")
    pytest.skip("transformers.utils.fx needs transformers < 4.50 (scripts/hf_fx_env.sh)")


@pytest.fixture
def hf_fx() -> None:
    _need_hf_fx()


def module_view(report: Report) -> list[tuple[str, str | None, str | None]]:
    return [(c.path, c.in_dtype, c.out_dtype) for c in report.modules]


class Twice(nn.Module):
    """One Linear called twice in a row: two module calls, not one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x))


class Angles(nn.Module):
    """Like Llama's rotary embedding: reads only ``x.dtype`` and computes from positions."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (positions[..., None] * torch.ones(4, device=positions.device)).cos().to(x.dtype)


class WithAngles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.angles = Angles()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return h * self.angles(h, positions)


def test_tracer_names_agree() -> None:
    assert tuple(TRACERS) == SPEC_TRACERS


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (Fp32Island(), (torch.randn(4, 8),)),
        (NestedDtype(), (torch.randn(4, 4), torch.randn(4, 4))),
        (Twice(), (torch.randn(2, 4),)),
        (WithAngles(), (torch.randn(2, 4), torch.arange(2))),
    ],
)
def test_fx_tracer_matches_export(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """symbolic_trace keeps autocast regions (recorded as they are entered) and module calls,
    including the hook view of a module it traces through (``Angles``: in = its ``x``)."""
    model = ModelInputs(type(module).__name__, module, args)
    setting = Setting.parse("amp-fp32")
    exported = analyze(model, setting)
    traced = analyze(apply_tracer(model, "fx"), setting)
    assert traced.capture["method"] == "fx+export"
    assert traced.check is not None and traced.check["disagreements"] == 0
    assert module_view(traced) == module_view(exported)
    regions = [(n.reason, n.outputs) for n in exported.nodes if n.kind == "region"]
    assert [(n.reason, n.outputs) for n in traced.nodes if n.kind == "region"] == regions


def test_repeated_calls_stay_separate() -> None:
    model = apply_tracer(ModelInputs("twice", Twice(), (torch.randn(2, 4),)), "fx")
    report = analyze(model, Setting.parse("amp-fp32"), check=False)
    assert [c.path for c in report.modules] == ["lin", "lin"]
    assert len({c.call for c in report.modules}) == 2


def test_lowered_module_shares_the_original() -> None:
    original = Twice()
    model = apply_tracer(ModelInputs("twice", original, (torch.randn(2, 4),)), "fx")
    assert isinstance(model.module, GraphForward)
    assert dict(model.module.named_parameters()) == dict(original.named_parameters())
    assert model.kwargs.keys() == {"x"}


def test_fx_cannot_trace_a_hugging_face_model() -> None:
    with pytest.raises(CaptureError) as err:
        apply_tracer(load_model("llama-tiny"), "fx")
    message = str(err.value)
    assert message.startswith("torch.fx.symbolic_trace could not trace 'llama-tiny'")
    assert "use --tracer export" in message and "\n" not in message


def test_fx_untraceable_factory_is_one_line() -> None:
    with pytest.raises(CaptureError, match="could not trace 'tests.factories:untraceable'"):
        apply_tracer(load_model("tests.factories:untraceable"), "fx")


def test_unknown_tracer() -> None:
    with pytest.raises(CaptureError, match="unknown tracer 'jit'"):
        apply_tracer(ModelInputs("t", Twice(), (torch.randn(2, 4),)), "jit")


@pytest.mark.skipif(hf_fx_available(), reason="this transformers has transformers.utils.fx")
def test_hf_fx_says_which_transformers_it_needs() -> None:
    code, out = run("check", "llama-tiny", "--tracer", "hf-fx", "-s", "fp32")
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert out.startswith("Error: --tracer hf-fx needs transformers < 4.50 (installed: ")
    assert "scripts/hf_fx_env.sh" in out


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_cli_tracer_option() -> None:
    code, out = run("table", "--tracer", "fx", "tests.factories:untraceable", "-s", "fp32")
    assert code == 1 and out.startswith("Error: torch.fx.symbolic_trace could not trace")
    code, out = run("table", "--tracer", "jit")
    assert code == 2 and "Invalid value for '--tracer'" in out


def test_cache_keys_tell_tracers_apart() -> None:
    settings = [Setting.parse("fp32")]
    keys = {
        tracer: report_keys(ModelSpec("opt-125m", tracer=tracer), settings, seq_len=8, check=True)
        for tracer in ("make-fx", "export", "hf-fx", "fx")
    }
    assert len({k[0] for k in keys.values()}) == 4
    assert report_keys("opt-125m", settings, seq_len=8, check=True) == keys["make-fx"]
    # The default tracer's key has no tracer in it: the key of the analysis as requested.
    request = {"seq_len": 8, "setting": settings[0].to_dict(), "check": True}
    assert keys["make-fx"] == [cache.cache_key(cache.model_identity("opt-125m"), request)]


# -- Hugging Face's FX tracer (transformers < 4.50) --------------------------------------------------


@functools.cache
def _opt(tracer: str) -> ModelInputs:
    return apply_tracer(load_model("opt-125m"), tracer)


HF_SETTINGS = [(s, "cuda", "bf16") for s in ("fp32", "half", "amp-half", "amp-fp32")] + [
    ("amp-fp32", "cpu", "fp16")
]


@pytest.mark.hffx
@pytest.mark.parametrize(("setting", "device", "amp"), HF_SETTINGS)
def test_hf_fx_opt_modules_agree_with_export(
    hf_fx: None, setting: str, device: str, amp: str
) -> None:
    """The acceptance: OPT-125M's module-level annotations are the same from either tracer."""
    resolved = Setting.parse(setting, device_type=device, amp_dtype=amp)
    exported = analyze(_opt("export"), resolved)
    traced = analyze(_opt("hf-fx"), resolved)
    assert traced.capture["method"] == "hf-fx+export"
    assert traced.check is not None and traced.check["disagreements"] == 0
    assert len(traced.modules) == 112
    assert module_view(traced) == module_view(exported)


@pytest.mark.hffx
def test_hf_fx_opt_prints_the_seed_lines(hf_fx: None) -> None:
    """Across versions: the hf-fx graph of transformers 4.x gives the seed notebook's lines, as
    the export tracer does with transformers 5."""
    report = analyze(_opt("hf-fx"), Setting.parse("amp-fp32"))
    seed = seed_hook_blocks()["amp-fp32"]
    assert hook_lines(report, SEED_WATCH)[: len(seed) - 1] == seed[:-1]


@pytest.mark.hffx
def test_hf_fx_keeps_modules_it_traces_through(hf_fx: None) -> None:
    """GPT-2's Conv1D is not a torch.nn leaf, so the FX tracer inlines it; its calls survive."""
    report = analyze(apply_tracer(load_model("gpt2"), "hf-fx"), Setting.parse("amp-fp32"))
    conv = [c for c in report.modules if "Conv1D" in c.bases]
    assert len(conv) == 48 and {(c.in_dtype, c.out_dtype) for c in conv} <= {
        ("float32", "bfloat16"),
        ("bfloat16", "bfloat16"),
    }
    assert report.check is not None and report.check["disagreements"] == 0


@pytest.mark.hffx
def test_hf_fx_records_llamas_rotary_region(hf_fx: None) -> None:
    """The rotary embedding's ``torch.autocast(enabled=False)`` region is in the graph. Its device
    type is decided by Python at trace time: transformers 4.45 reads ``x.device.type``, which the
    FX tracer cannot see, so the region is a *cpu* one (README, Known limitations)."""
    setting = Setting.parse("amp-fp32")
    report = analyze(apply_tracer(load_model("llama-tiny"), "hf-fx"), setting)
    (region,) = [n for n in report.nodes if n.kind == "region"]
    assert region.reason == "autocast disabled on cpu inside this region"
    assert report.check is not None and report.check["disagreements"] == 0
    # The module view agrees all the same (rotary_emb's hook sees x, replayed for the inlined call).
    assert module_view(report) == module_view(analyze(load_model("llama-tiny"), setting))


@pytest.mark.hffx
def test_hf_fx_names_the_branches_it_took_on_dtypes(hf_fx: None) -> None:
    """T5LayerNorm casts to its weight's dtype when that is 16-bit: a branch the HF tracer takes
    once, in fp32. The report lists where, and the command line warns; export lists none."""
    model = apply_tracer(load_model("t5-small"), "hf-fx")
    assert "encoder.block.0.layer.0.layer_norm" in model.module.dtype_branches
    report = analyze(model, Setting.parse("half"), check=False)
    assert report.capture["dtype_branches"] == list(model.module.dtype_branches)
    assert (
        analyze(load_model("t5-small"), Setting.parse("half"), check=False).capture[
            "dtype_branches"
        ]
        == []
    )
    result = CliRunner().invoke(
        main, ["--no-cache", "table", "t5-small", "--tracer", "hf-fx", "-s", "half", "--no-check"]
    )
    assert result.exit_code == 0
    (warning,) = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: hf-fx+export")  # "+export-meta-replay" on CPU-only torch
    assert "took branches on dtypes once, in fp32 without autocast" in warning
    assert "encoder.block.0.layer.0.layer_norm" in warning and "--tracer export" in warning


@pytest.mark.hffx
def test_hf_fx_unsupported_architecture_is_one_line(hf_fx: None) -> None:
    with pytest.raises(CaptureError) as err:
        apply_tracer(load_model("pythia-160m"), "hf-fx")
    message = str(err.value)
    assert "could not trace 'pythia-160m' (GPTNeoXForCausalLM)" in message
    assert "is not supported yet;" in message  # not the tracer's list of every supported class
    assert message.endswith("use --tracer export") and "\n" not in message


@pytest.mark.hffx
def test_hf_fx_needs_a_hugging_face_model(hf_fx: None) -> None:
    with pytest.raises(CaptureError, match="traces Hugging Face models"):
        apply_tracer(ModelInputs("t", Twice(), (torch.randn(2, 4),)), "hf-fx")


@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_cpu_only_torch_keeps_regions_on_the_replay_path(
    monkeypatch: pytest.MonkeyPatch, tracer: str
) -> None:
    """Without fake CUDA tracing (a CPU-only torch) the graph is traced on meta and replayed; a
    ``torch.autocast("cuda", dtype=fp16)`` region must still be an fp16 region, and the region's
    baked dtype is listed as what the trace could not pin down."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    model = ModelInputs("nested", NestedDtype(), (torch.randn(4, 4), torch.randn(4, 4)))
    report = analyze(apply_tracer(model, tracer), Setting.parse("amp-fp32"))
    assert report.capture["method"].endswith("export-meta-replay")
    (region,) = [n for n in report.nodes if n.kind == "region"]
    assert region.reason == "autocast enabled on cuda in fp16 inside this region"
    assert region.outputs == ["float16"] and region.name in report.capture["trace_time_dtype_nodes"]
    assert report.check is None and "CPU-only build" in report.capture["check_unavailable"]
