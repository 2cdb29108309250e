"""The compile axis of the commands that take a setting (``--compile inductor``): each command's
output on the small test models held against Inductor's plan made here, the overlay's golden
source, the cache, and the one-line refusals. Planning costs seconds; only ``check`` compiles."""

from __future__ import annotations

import json
import math
from unittest import mock

import pytest
from click.testing import CliRunner

from ampgraph.capture.trace import capture
from ampgraph.cli import main
from ampgraph.compiled.inductor import plan
from ampgraph.formats.compiled import _FATE_WORDS
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.run import analyze_spec
from ampgraph.settings import Setting
from tests import compiled_models
from tests.test_render import check_golden

AMP = Setting.parse("amp-fp32", device_type="cpu")
GELU = "tests.compiled_models:gelu_chain"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def gelu():  # type: ignore[no-untyped-def]
    """Inductor's plan of the gelu chain, made here (the commands make theirs in their run)."""
    module, x = compiled_models.gelu_chain()
    return plan(capture(ModelInputs("gelu_chain", module, (x,)), AMP))


def test_table_marks_each_node_with_its_planned_fate_and_kernel(gelu) -> None:  # type: ignore[no-untyped-def]
    code, out = _run("table", GELU, "-s", "amp-fp32", "--compile", "inductor")
    assert code == 0, out
    lines = out.splitlines()
    assert "torch.compile: torch " in lines[0] and "emulate_precision_casts=False" in lines[0]
    for n in gelu.nodes:
        line = next(ln for ln in lines if ln.split()[:1] == [n.name])
        assert _FATE_WORDS[n.fate] in line and f" {n.kernel} " in line
        assert ("eager's rounding dropped" in line) == n.drops_rounding
    data = json.loads(_run("table", GELU, "-s", "amp-fp32", "--compile", "inductor",
                           "--format", "json")[1])  # fmt: skip
    assert [n["fate"] for n in data["nodes"]] == [n.fate for n in gelu.nodes]


def test_diff_eager_against_inductor_names_the_dropped_roundings(gelu) -> None:  # type: ignore[no-untyped-def]
    code, out = _run("diff", GELU, "-s", "amp-fp32", "--compile", "eager", "--compile", "inductor")
    assert code == 1, out
    named = [ln.split()[0] for ln in out.splitlines()[1:]]
    assert named == [n.name for n in gelu.dropped()] and named
    assert out.startswith(f"{len(gelu.dropped())} rounding point(s) differ")
    # emulate_precision_casts on B: the compiled program rounds as eager does, so nothing differs
    code, out = _run("diff", GELU, "-s", "amp-fp32", "--compile", "eager", "--compile",
                     "inductor", "--emulate-precision-casts")  # fmt: skip
    assert code == 0 and out.startswith("0 rounding point(s) differ"), out


def test_audit_gives_a_finding_per_kernel_with_remedies_and_their_cost(gelu) -> None:  # type: ignore[no-untyped-def]
    code, out = _run("audit", GELU, "-s", "amp-fp32", "--compile", "inductor")
    assert code == 0, out
    findings = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    kernels = sorted({n.kernel for n in gelu.dropped()})
    assert [f.split()[2] for f in findings] == kernels
    report = analyze_spec(GELU, [AMP], check=False)[0]
    shapes = {n.name: n.shapes[0] for n in report.nodes if n.shapes}
    size = sum(2 * math.prod(shapes[n.name]) for n in gelu.dropped())
    assert f"({size} bytes written and read back)" in findings[0]
    assert "emulate_precision_casts = True" in findings[0] and "graph_break" in findings[0]
    assert _run("audit", GELU, "-s", "amp-fp32", "--compile", "inductor", "--fail-on",
                "warning")[0] == 1  # fmt: skip


def test_audit_offers_emulation_only_for_the_roundings_it_restores() -> None:
    """``softmax(gelu(y) * 1.5)``: one kernel drops the gelu's rounding, which the plan made with
    ``emulate_precision_casts`` restores, and the multiply's, folded away by a pattern replacement,
    which it does not: the finding offers emulation for the first only, the barrier for both."""
    module, x = compiled_models.gelu_scaled_softmax()
    c = capture(ModelInputs("gelu_scaled_softmax", module, (x,)), AMP)
    plain, emulated = plan(c), plan(c, emulate_precision_casts=True)
    kept = [n.name for n in emulated.dropped()]
    restored = [n.name for n in plain.dropped() if n.name not in kept]
    assert restored and kept and all(plain.node(n).folded for n in kept)  # type: ignore[union-attr]
    spec = "tests.compiled_models:gelu_scaled_softmax"
    code, out = _run("audit", spec, "-s", "amp-fp32", "--compile", "inductor")
    assert code == 0, out
    [finding] = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    offered = ", ".join(f"{n} (top)" for n in restored)
    assert f"emulate_precision_casts = True for {offered} only" in finding
    assert f"cannot restore {', '.join(f'{n} (top)' for n in kept)}:" in finding
    assert "graph_break" in finding
    # with emulation on, what is left is the folded rounding: the barrier is all it is offered
    code, out = _run("audit", spec, "-s", "amp-fp32", "--compile", "inductor",
                     "--emulate-precision-casts")  # fmt: skip
    [finding] = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert code == 0 and "emulate_precision_casts = True" not in finding, out
    assert "cannot restore" in finding and "graph_break" in finding


def test_check_holds_the_plan_against_the_generated_cpp() -> None:
    code, out = _run("check", GELU, "-s", "amp-fp32", "--compile", "inductor")
    assert code == 0 and "agrees with the C++ code Inductor generated" in out, out
    # the same code read as if it allocated no 16-bit buffer disagrees: exit 1, each one named
    from dataclasses import replace

    from ampgraph.compiled import generated

    real = generated.read_code
    with mock.patch.object(generated, "read_code", lambda c: replace(real(c), buffers16=set())):
        code, out = _run("check", GELU, "-s", "amp-fp32", "--compile", "inductor")
    assert code == 1 and "16-bit buffer" in out and "only in the plan" in out, out


def test_render_overlay_golden_source(gelu, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out = _run("render", GELU, "-s", "amp-fp32", "--compile", "inductor", "-o",
                     str(tmp_path), "-f", "dot")  # fmt: skip
    assert code == 0, out
    source = (tmp_path / out.strip().rsplit("/", 1)[-1]).read_text()
    for k in {n.kernel for n in gelu.nodes if n.kernel}:
        assert f"cluster_kernel_{k}" in source
    assert source.count("dropped: fp32 in kernel") == len(gelu.dropped())
    check_golden("gelu-chain-amp-fp32.inductor.dot", source.replace(gelu.torch_version, "TORCH"))


def test_the_plan_is_cached_under_the_report_key_and_inductor_options(tmp_path) -> None:
    from ampgraph.pipeline.compiled import compiled_flows
    from ampgraph.pipeline.request import AnalysisRequest

    request = AnalysisRequest("llama-tiny", (AMP,), check=False)
    with mock.patch.dict("os.environ", {"AMPGRAPH_CACHE_DIR": str(tmp_path)}):
        first = compiled_flows(request)
        with mock.patch("ampgraph.compiled.inductor.plan", side_effect=AssertionError("planned")):
            assert compiled_flows(request) == first  # served: never planned again
            with pytest.raises(AssertionError, match="planned"):  # another option, another entry
                compiled_flows(request, emulate=True)


def test_a_cuda_setting_and_a_backward_are_refused_in_one_line() -> None:
    code, out = _run("table", GELU, "-s", "amp-fp32", "--compile", "inductor", "--device", "cuda")
    assert code == 1 and out.startswith("Error: ") and len(out.splitlines()) == 1, out
    assert "Triton backend needs a GPU" in out
    code, out = _run("table", GELU, "--compile", "inductor", "--pass", "backward")
    assert code == 2 and "forward" in out
    assert _run("table", GELU, "-s", "amp-fp32", "--emulate-precision-casts")[0] == 2
