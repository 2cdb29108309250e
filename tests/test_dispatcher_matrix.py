"""Every node of every bundled test model agrees with the dispatcher, in every setting.

Issue 2's acceptance: the four settings x {bf16, fp16} x {cuda, cpu} for OPT-125M, and a second
architecture (Llama-shaped; GPT-2 in the slow set) to show nothing in the core is OPT-specific.
"""

from __future__ import annotations

import pytest

from ampgraph.formats.text import disagreement_lines

from .conftest import report

SETTINGS = ["fp32", "half", "amp-half", "amp-fp32"]
GRID = [(s, d, a) for d in ("cuda", "cpu") for a in ("bf16", "fp16") for s in SETTINGS]


def _assert_agrees(spec: str, setting: str, device: str, amp: str) -> None:
    rep = report(spec, setting, device, amp)
    assert rep.check is not None
    assert rep.check["compared"] > 100
    assert rep.check["disagreements"] == 0, "\n".join(disagreement_lines(rep))
    assert rep.errors == []


@pytest.mark.parametrize(("setting", "device", "amp"), GRID)
def test_opt_125m_agrees_with_dispatcher(setting: str, device: str, amp: str) -> None:
    _assert_agrees("opt-125m", setting, device, amp)


@pytest.mark.parametrize(("setting", "device", "amp"), GRID)
def test_llama_tiny_agrees_with_dispatcher(setting: str, device: str, amp: str) -> None:
    _assert_agrees("llama-tiny", setting, device, amp)


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "device", "amp"), GRID)
def test_gpt2_agrees_with_dispatcher(setting: str, device: str, amp: str) -> None:
    _assert_agrees("gpt2", setting, device, amp)


def test_autocast_changes_what_the_dispatcher_sees() -> None:
    """The check is not vacuous: the same graph gives different dtypes with autocast on."""
    off = report("opt-125m", "fp32")
    on = report("opt-125m", "amp-fp32")
    assert {n.out_dtype for n in off.nodes if n.op == "aten.linear.default"} == {"float32"}
    assert {n.out_dtype for n in on.nodes if n.op == "aten.linear.default"} == {"bfloat16"}


def test_cpu_only_torch_annotates_on_meta_and_says_it_cannot_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU-only torch (the small torch==2.13.0 wheel) can make neither fake CUDA tensors nor
    run CUDA's autocast kernels. ampgraph traces on meta, annotates on meta from its tables,
    names the nodes whose dtypes were baked at trace time, and says that the check cannot run.
    The annotations are those of the CUDA build, node by node (also seen with a real 2.13 wheel).
    """
    import torch

    from ampgraph import Setting, analyze
    from ampgraph.report.printed import SEED_WATCH, hook_lines

    from .conftest import model, seed_hook_blocks

    setting = Setting.parse("amp-fp32")
    full = analyze(model("opt-125m"), setting)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    rep = analyze(model("opt-125m"), setting)
    assert rep.capture["method"] == "export-meta-replay"
    # embed_positions' `.to(inputs_embeds.dtype)` is the one dtype constant OPT bakes in.
    assert rep.capture["trace_time_dtype_nodes"] == ["to_2"]
    assert rep.node("to_2").trace_time_dtype
    assert rep.check is None
    assert "is a CPU-only build" in rep.capture["check_unavailable"]

    def view(r):  # type: ignore[no-untyped-def]
        return [(n.op, n.outputs, [(c.from_dtype, c.to_dtype) for c in n.casts], n.policy)
                for n in r.nodes if n.kind == "op"]  # fmt: skip

    assert view(rep) == view(full)
    seed = seed_hook_blocks()["amp-fp32"]
    assert hook_lines(rep, SEED_WATCH)[: len(seed) - 1] == seed[:-1]
    code, out = _cli(["--no-cache", "check", "-s", "amp-fp32"])
    assert code == 1 and out.startswith("Error: torch ") and len(out.splitlines()) == 1
    code, out = _cli(["--no-cache", "table", "-s", "amp-fp32", "--only", "Embedding"])
    assert code == 0 and out.splitlines()[0].startswith("warning: not checked: torch ")


def _cli(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    from ampgraph.cli import main

    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output
