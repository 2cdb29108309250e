"""FP8 recipes against torchao's real code: the traced graph against a real CPU run of the
converted model, the survival counts against torchao's real conversion of the same tensors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchao")

from ampgraph.errors import SettingError  # noqa: E402
from ampgraph.fp8.graph import trace_fp8  # noqa: E402
from ampgraph.fp8.proof import prove_gemms  # noqa: E402
from ampgraph.fp8.recipes import operand_formats, parse_fp8_recipe, plan_model  # noqa: E402
from ampgraph.model.build import ModelInputs  # noqa: E402
from ampgraph.ranges import fp8 as fp8_ranges  # noqa: E402

from .conftest import ROOT, load_file  # noqa: E402


def _outlier_model() -> ModelInputs:
    model, x = load_file(ROOT / "examples/fp8_outlier.py").build()
    return ModelInputs("outlier", model, (x,))


def _mlp() -> tuple[ModelInputs, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 48), nn.Linear(48, 16))
    return ModelInputs("mlp", net, (torch.randn(8, 32),)), dict(net.state_dict())


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
@pytest.mark.parametrize("train", [False, True])
def test_traced_gemms_equal_a_real_cpu_run(name: str, train: bool) -> None:
    model, state = _mlp()
    graph = trace_fp8(model, parse_fp8_recipe(f"torchao:{name},filter_fqns=3"), train=train)
    proof = prove_gemms(graph, model, state, train=train)
    assert proof.ok, proof.first_difference()
    forward = graph.gemms("forward")
    formats = operand_formats(graph.recipe)
    # Linears 0 and 2 in FP8 with the config's formats; 3 filtered by name: a bf16 GEMM.
    assert [g.role for g in forward] == ["gemm-fp8", "gemm-fp8", "gemm-bf16"]
    assert forward[0].dtype_in[:2] == (formats["input"][0], formats["weight"][0])
    assert [g.module for g in forward] == ["0", "2", "3"]
    assert all(g.dtype_out == "bf16" for g in forward)


def test_gw_hp_backward_mixes_dtypes_and_the_real_kernel_raises() -> None:
    """rowwise_with_gw_hp keeps grad_weight's GEMM in high precision: its operands are the
    bf16 gradient and the Linear's own fp32 input (autocast does not cast torchao's saved
    input), which the fake mm accepts and the real one refuses."""
    model, state = _mlp()
    graph = trace_fp8(model, parse_fp8_recipe("torchao:rowwise_with_gw_hp"), train=True)
    mixed = [g for g in graph.gemms("backward") if g.role == "gemm-mixed"]
    assert mixed and set(mixed[0].dtype_in[-2:]) == {"bf16", "fp32"}
    proof = prove_gemms(graph, model, state, train=True)
    assert proof.ok and proof.real[-1][0] == "raised"


def test_plan_reasons_and_torchao_auto_filter() -> None:
    net = nn.Sequential(nn.Embedding(10, 32), nn.Linear(32, 24), nn.Linear(24, 4096),
                        nn.Linear(4096, 2048))
    plans = plan_model(net, parse_fp8_recipe("torchao:tensorwise,auto_filter=true"))
    reasons = {p.fqn: (p.converted, p.reason) for p in plans}
    assert reasons["0"] == (False, "not an nn.Linear (Embedding)")
    assert reasons["1"][0] is False and "not a multiple of 16" in reasons["1"][1]
    assert reasons["3"][0] is True
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    rule = _auto_filter_for_recipe("tensorwise", [])
    assert [p.converted for p in plans[1:]] == [rule(net[i], str(i)) for i in (1, 2, 3)]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise", "mx-floor", "mx-rceil"])
@pytest.mark.parametrize("pow2", [False, True])
def test_predicted_counts_equal_torchao_real_conversion(fmt: str, scaling: str, pow2: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 128, generator=gen) * torch.logspace(-9, 2, 128)
    x[3, 5] = 4e4  # an outlier; and exact zeros, which never count as flushed
    x[0, :7] = 0.0
    predicted = fp8_ranges.predict(x, fmt, scaling, pow2=pow2)
    assert predicted == fp8_ranges.torchao_counts(x, fmt, scaling, pow2=pow2)
    assert predicted.nonzero == x.numel() - 7 and predicted.zeros > 0


def test_outlier_survival_worst_first_advice_and_diff() -> None:
    model = _outlier_model()
    state = {k: v.detach() for k, v in model.module.state_dict().items()}
    for name in ("tensorwise", "rowwise", "mxfp8", "mxfp8_floor"):
        recipe = parse_fp8_recipe(f"torchao:{name}")
        proved = fp8_ranges.prove(model, recipe, state)
        assert len(proved) == 10 and all(row.survival == real for row, real in proved), name
    recipe = parse_fp8_recipe("torchao:tensorwise")
    rows = fp8_ranges.survival_table(model, recipe, state)
    assert (rows[0].module, rows[0].operand) == ("blocks.0.fc2", "input")
    assert rows[0].survival.zero_share > 0.3  # one scale per tensor, set by the outlier
    rowwise = fp8_ranges.survival_table(model, parse_fp8_recipe("torchao:rowwise"), state)
    assert rowwise[0].survival.zero_share < rows[0].survival.zero_share
    keep = fp8_ranges.advise(rows)
    assert keep[0] == "blocks.0.fc2"
    after = fp8_ranges.survival_table(model, recipe.with_filter(keep), state)
    assert not {r.module for r in after} & set(keep)
    from ampgraph.formats.fp8 import survival_changes
    from ampgraph.formats.registry import text

    assert survival_changes(rows, after)[-1].endswith(f"-> {len({r.module for r in after})}")
    namespace: dict[str, object] = {}
    exec(text("fp8-filter", "python", keep), namespace)  # the advisor's code runs as written
    assert namespace["keep_fp8"](None, "blocks.0.fc2") is False  # type: ignore[operator]


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_backward_operands_survival_equals_torchao(name: str) -> None:
    """grad_output from a real fp32 backward, and each operand the backward recasts, counted
    beside torchao's real conversion of the same tensors in the config's format and axis."""
    model = _outlier_model()
    state = {k: v.detach() for k, v in model.module.state_dict().items()}
    recipe = parse_fp8_recipe(f"torchao:{name}")
    proved = fp8_ranges.prove(model, recipe, state, train=True)
    assert all(row.survival == real for row, real in proved)
    formats = operand_formats(recipe)
    roles = {r.operand for r, _ in proved}
    assert {"input", "weight", "grad_output"} <= roles
    assert all(formats[r.operand][0] == r.fmt for r, _ in proved)
    assert len(proved) == 5 * len(fp8_ranges.recipe_operands(recipe, train=True))
    if name == "tensorwise":
        assert {r.fmt for r, _ in proved if r.operand == "grad_output"} == {"e5m2"}
    if name == "rowwise_with_gw_hp":  # grad_weight's GEMM stays in high precision
        assert not roles & {"input_for_grad_weight", "grad_output_for_grad_weight"}


def test_grad_output_is_the_real_backwards() -> None:
    model, state = _mlp()
    recipe = parse_fp8_recipe("torchao:rowwise")
    got = fp8_ranges.linear_operands(model, recipe, state, train=True)
    net = model.module
    hidden = net[1](net[0](model.args[0]))
    mid = net[2](hidden)
    mid.retain_grad()
    out = net[3](mid)
    out.retain_grad()
    # --pass train's loss: a fixed-seed N(0, 1) projection of the output, averaged.
    projection = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    (out.float() * projection).mean().backward()
    assert torch.equal(got["2"]["grad_output"], mid.grad)
    assert torch.equal(got["3"]["grad_output"], out.grad)
    assert torch.equal(out.grad, projection / out.numel())
    x = got["2"]["grad_output"]
    # grad_weight's operand is scaled per column of grad_output (torchao's axiswise_dim=0).
    assert fp8_ranges.predict(x.t().contiguous(), "e4m3", "rowwise", pow2=True) == \
        fp8_ranges.torchao_counts(x.t().contiguous(), "e4m3", "rowwise", pow2=True)


def test_transformer_engine_rules_where_torchao_runs_the_same_arithmetic() -> None:
    """TE cannot run here; where its source's rule is torchao's arithmetic, the prediction
    from TE's rule equals torchao's real conversion: one fp32 max/amax per tensor (current
    scaling), one E8M0 exponent rounded up per 32 values (MXFP8), and a 1x128 tile of a row of
    128 (block scaling, power-of-two scales) against torchao's rowwise."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16, 128, generator=gen) * torch.logspace(-9, 2, 128)
    x[3, 5] = 4e4
    for fmt in ("e4m3", "e5m2"):
        te = fp8_ranges.predict(x, fmt, "tensorwise-te")
        assert te == fp8_ranges.torchao_counts(x, fmt, "tensorwise"), fmt
        assert fp8_ranges.predict(x, fmt, "mx-te") == fp8_ranges.torchao_counts(x, fmt, "mx-rceil")
        assert fp8_ranges.predict(x, fmt, "block-1x128", pow2=True) == \
            fp8_ranges.torchao_counts(x, fmt, "rowwise", pow2=True)
    # 128x128 tiles: one scale per tile, four tiles of a 256x256 weight, each its own.
    w = torch.ones(256, 256)
    w[:128, :128] = 1e-9
    w[200, 200] = 448e6
    s = fp8_ranges.scaled(w, "e4m3", "block-128x128", pow2=True)
    assert torch.equal(s[:128, :128], w[:128, :128] * 2.0**38)  # 448 / 1e-9 floored
    assert float(s[0, 200]) == 256.0 and float(s[200, 0]) == 256.0  # 448 floored to 2^8
    assert float(s[200, 200].abs()) <= 448 and float(s[199, 199]) < 2**-10  # flushed


def test_transformer_engine_recipes_as_data() -> None:
    from ampgraph.fp8.te import parse_te_recipe

    delayed = parse_te_recipe("te:delayed")  # HYBRID: e4m3 forward, e5m2 backward
    ops = delayed.operands(train=True)
    assert ops["input"][0] == ops["weight"][0] == "e4m3" and ops["grad_output"][0] == "e5m2"
    assert set(ops) == {"input", "weight", "grad_output"}  # per tensor: transposes are the same
    e4m3 = parse_te_recipe("te:delayed,format=e4m3").operands(train=True)
    assert e4m3["grad_output"][0] == "e4m3"
    block = parse_te_recipe("te:block").operands(train=True)
    assert block["weight"][1] == "block-128x128" and "weight_for_grad_input" not in block
    assert block["grad_output_for_grad_weight"] == ("e4m3", "block-1x128", True)
    mx = parse_te_recipe("te:mxfp8").operands(train=True)
    assert len(mx) == 6 and {f for f, _, _ in mx.values()} == {"e4m3"}
    model = _outlier_model()
    state = {k: v.detach() for k, v in model.module.state_dict().items()}
    rows = fp8_ranges.survival_table(model, parse_te_recipe("te:block,filter_fqns=head"), state,
                                     train=True)
    assert "head" not in {r.module for r in rows} and len(rows) == 4 * 5
    plans = plan_model(model.module, parse_te_recipe("te:current"))
    assert all("te.Linear" in p.reason for p in plans)
    with pytest.raises(SettingError, match="cannot be imported here"):
        fp8_ranges.prove(model, parse_te_recipe("te:current"), state)
    with pytest.raises(SettingError, match="unknown TransformerEngine recipe"):
        parse_te_recipe("te:fp4")


def test_mx_graph_is_torchaos_inference_workflow_traced() -> None:
    """torchao's MXDynamicActivationMXWeightConfig traced on fake tensors: the activation's
    amax, its cast to e4m3 and _scaled_mm on E8M0 block scales (an SM100 GPU's GEMM); with the
    emulated kernel, bf16 GEMMs that a real CPU run makes too."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 48), nn.Linear(48, 8))
    model, state = ModelInputs("mlp", net, (torch.randn(8, 64),)), dict(net.state_dict())
    graph = trace_fp8(model, parse_fp8_recipe("torchao:mxfp8"))
    plans = {p.fqn: p.converted for p in graph.plans}
    assert plans == {"0": True, "2": True, "3": False}  # K=48: not a multiple of 32
    forward = graph.gemms("forward")
    assert [(g.op, g.module, g.role) for g in forward] == [
        ("_scaled_mm", "0", "gemm-fp8"), ("_scaled_mm", "2", "gemm-fp8"),
        ("addmm", "3", "gemm-bf16")]
    assert forward[0].dtype_in[:4] == ("e4m3", "e4m3", "e8m0", "e8m0")
    assert forward[0].scaling == ("mx-1x32", "mx-1x32")
    ops = {n.op for n in graph.nodes if n.module == "2"}
    assert {"amax", "_to_copy"} <= ops and any(n.role == "scale" for n in graph.nodes)
    emulated = parse_fp8_recipe("torchao:mxfp8_floor,kernel=emulated")
    graph = trace_fp8(model, emulated)
    proof = prove_gemms(graph, model, state)
    assert proof.ok and len(proof.real) == 3, proof.first_difference()
    assert {n.dtype_out for n in graph.nodes if n.role == "cast-fp8"} == {"e4m3"}


def test_bad_recipes_are_one_line() -> None:
    with pytest.raises(SettingError, match="unknown torchao float8 recipe"):
        parse_fp8_recipe("torchao:fp4")
    with pytest.raises(SettingError, match="no auto filter"):
        parse_fp8_recipe("torchao:rowwise_with_gw_hp,auto_filter=true").module_filter_fn()
    with pytest.raises(SettingError, match=r"inference workflow.*MXFP8 training \(forward and "
                       r"backward\) is torchao:mxfp8_rceil"):
        trace_fp8(_mlp()[0], parse_fp8_recipe("torchao:mxfp8"), train=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ampgraph", "-q", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_cli_fp8_ranges_prove_and_advise() -> None:
    out = _cli("fp8-ranges", "--module", "examples/fp8_outlier.py:build", "--recipe",
               "torchao:tensorwise", "--prove", "--advise")
    assert out.returncode == 0, out.stderr
    assert "proved: all 10 operands' counts equal torchao's" in out.stdout
    assert "KEEP_BF16 = ['blocks.0.fc2'" in out.stdout
    bad = _cli("fp8", "--module", "examples/fp8_outlier.py:build", "--recipe", "torchao:nope")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_cli_fp8_check() -> None:
    out = _cli("fp8", "--module", "examples/fp8_outlier.py:build", "--recipe",
               "torchao:rowwise,filter_fqns=head", "--pass", "train", "--check")
    assert out.returncode == 0, out.stderr
    assert "bf16  head  [32x64]  filtered by name (matches 'head')" in out.stdout
    assert "check: all 15 GEMMs agree with a real CPU run" in out.stdout


def _invoke(*args: str) -> tuple[int, str]:
    """The command line in this process (click's runner): the FP8 paths start no worker."""
    from click.testing import CliRunner

    from ampgraph.cli import main

    out = CliRunner().invoke(main, ["-q", *args], catch_exceptions=False)
    return out.exit_code, out.output


OUTLIER = ("--module", str(ROOT / "examples/fp8_outlier.py") + ":build")


def test_setting_commands_take_a_torchao_recipe(tmp_path: Path) -> None:
    """table, check and render print the FP8 graph ampgraph fp8 traces; check runs it for real."""
    code, out = _invoke("table", *OUTLIER, "--recipe", "torchao:rowwise,filter_fqns=head")
    assert code == 0, out
    model = _outlier_model()
    graph = trace_fp8(model, parse_fp8_recipe("torchao:rowwise,filter_fqns=head"))
    from ampgraph.formats.fp8 import gemm_lines

    assert out.splitlines()[1:] == gemm_lines(graph, ("forward",))
    assert "[head] forward addmm(bf16, bf16) -> bf16" in out
    code, out = _invoke("check", *OUTLIER, "--recipe", "torchao:tensorwise", "--pass", "train")
    assert code == 0 and "all 15 GEMMs' dtypes agree with a real CPU run" in out, out
    code, out = _invoke("render", *OUTLIER, "--recipe", "torchao:tensorwise,filter_fqns=blocks",
                        "-o", str(tmp_path), "--format", "dot")
    assert code == 0 and out.strip().endswith("-fp8-head.dot"), out  # the one FP8 Linear
    assert "_scaled_mm" in Path(out.strip()).read_text()
    code, out = _invoke("table", *OUTLIER, "--recipe", "torchao:rowwise", "--only", "Linear")
    assert code == 2 and "--only is not for an FP8 recipe" in out


def test_audit_and_diff_before_against_after_the_advisors_filter(tmp_path: Path) -> None:
    keep = tmp_path / "keep.py"
    code, out = _invoke("fp8-ranges", *OUTLIER, "--recipe", "torchao:tensorwise", "--advise",
                        "--write-filter", str(keep))
    assert code == 0, out
    from ampgraph.fp8.recipes import read_filter_file

    kept = read_filter_file(str(keep))
    assert kept[0] == "blocks.0.fc2" and f"KEEP_BF16 = {list(kept)!r}" in out
    code, out = _invoke("audit", *OUTLIER, "--recipe", "torchao:tensorwise", "--fail-on",
                        "warning")
    assert code == 1 and f"{len(kept)} findings" in out, out
    assert "warning: blocks.0.fc2 input: 51.69% of its non-zero values flush" in out
    after = f"torchao:tensorwise,filter_file={keep}"
    code, out = _invoke("audit", *OUTLIER, "--recipe", after, "--fail-on", "warning")
    assert code == 0 and "0 findings" in out, out
    code, out = _invoke("diff", *OUTLIER, "--recipe", "torchao:tensorwise", "--recipe", after)
    assert code == 1, out
    assert "blocks.0.fc2: FP8 -> bf16 (filtered by name (matches 'blocks.0.fc2'))" in out
    assert out.rstrip().endswith("4549 -> 34; FP8 Linears 5 -> 2")
    code, out = _invoke("diff", *OUTLIER, "--recipe", after, "--recipe", after)
    assert code == 0 and "the FP8 graphs are the same" in out, out


def test_recipe_option_points_to_the_fp8_commands() -> None:
    from ampgraph.recipes import parse_recipe

    with pytest.raises(SettingError, match="ampgraph fp8 --recipe 'torchao:rowwise'"):
        parse_recipe("torchao:rowwise")


def test_flow_dot_is_one_linears_torchao_nodes() -> None:
    import shutil

    from ampgraph.formats.registry import text
    from ampgraph.fp8.graph import module_flow

    graph = trace_fp8(_mlp()[0], parse_fp8_recipe("torchao:tensorwise"))
    source = text("fp8-dot", "dot", module_flow(graph, "2"))
    assert source.count('label="_scaled_mm') == 1 and source.count("e4m3") >= 2
    assert "abs" in source and "reciprocal" in source and "#a8dadc" in source  # scale nodes
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tsvg"], input=source, text=True, check=True, capture_output=True)
