"""One :class:`~ampgraph.pipeline.request.AnalysisRequest` down the stages: built once, handed to
the workers as it is, the source of the cache key, and no state left between settings."""

from __future__ import annotations

import pickle

import pytest

from ampgraph.errors import SettingError
from ampgraph.model.specs import ModelSpec
from ampgraph.pipeline import cache
from ampgraph.pipeline.request import AnalysisRequest
from ampgraph.pipeline.run import report_keys
from ampgraph.settings import Setting
from ampgraph.torchutil import fake_device_built


def test_a_request_is_immutable_and_crosses_to_a_worker_as_it_is() -> None:
    request = AnalysisRequest(
        ModelSpec("llama-tiny", tracer="export"), ("amp-fp32", "half"), pass_="train",
        loss="logits", backward_autocast=True, tables="2.11", timeout=30.0,
    )  # fmt: skip
    copy = pickle.loads(pickle.dumps(request))
    assert copy == request and copy.traced_by == "export" and copy.model.tracer == "export"
    assert [s.name for s in copy.settings] == ["amp-fp32", "half"]
    with pytest.raises(AttributeError):
        request.seq_len = 4  # type: ignore[misc]


def test_a_request_refuses_what_no_stage_could_run() -> None:
    with pytest.raises(SettingError, match="unknown pass"):
        AnalysisRequest("opt-125m", pass_="sideways")
    with pytest.raises(TypeError, match="unknown analysis option 'pass'"):
        AnalysisRequest.of("opt-125m", ["fp32"], {"pass": "train"})


def test_the_cache_key_is_the_requests_and_each_of_its_fields_changes_it() -> None:
    """Every field that changes a report changes its key; the keyword API and the request agree."""
    settings = [Setting.parse("amp-fp32")]
    base = AnalysisRequest("opt-125m", tuple(settings))
    keys = {
        name: cache.key_of(cache.entry_requests(request)[0])
        for name, request in {
            "base": base,
            "seq_len": AnalysisRequest("opt-125m", tuple(settings), seq_len=16),
            "check": AnalysisRequest("opt-125m", tuple(settings), check=False),
            "pass": AnalysisRequest("opt-125m", tuple(settings), pass_="train"),
            "loss": AnalysisRequest("opt-125m", tuple(settings), pass_="train", loss="logits"),
            "tables": AnalysisRequest("opt-125m", tuple(settings), tables="2.11"),
            "sources": AnalysisRequest("opt-125m", tuple(settings), sources=True),
            "tracer": AnalysisRequest("opt-125m", tuple(settings), tracer="export"),
        }.items()
    }
    assert len(set(keys.values())) == len(keys)
    # How the run is bounded is no part of what it computes.
    bounded = AnalysisRequest("opt-125m", tuple(settings), timeout=5.0, force=True)
    assert cache.key_of(cache.entry_requests(bounded)[0]) == keys["base"]
    assert report_keys("opt-125m", settings, seq_len=8, check=True) == [keys["base"]]


def test_a_stand_in_setting_leaves_nothing_for_the_next_one() -> None:
    """xpu on a torch built without it is predicted on a CUDA trace; the cuda setting analysed
    after it in the same group is the plain one (no process-global stand-in state)."""
    from ampgraph.pipeline.stages import analyze_group

    xpu, cuda = analyze_group("llama-tiny", ["amp-fp32,device=xpu", "amp-fp32"], check=True)
    assert xpu.setting["device_type"] == "xpu" and cuda.setting["device_type"] == "cuda"
    stand_in = not fake_device_built("xpu")
    assert ("stand_in" in xpu.capture) == stand_in
    assert "stand_in" not in cuda.capture and cuda.check is not None
    assert cuda.check["disagreements"] == 0


def test_the_request_reaches_the_forked_workers() -> None:
    """The tables and the check travel in the request to each worker process: each report
    says it is another release's prediction, which the dispatcher cannot check.

    (The forward: a process whose autograd has run, as this test runner's may have, cannot
    fork workers that differentiate, as the analysis of a spec from Python says.)"""
    from ampgraph.model.build import load_model
    from ampgraph.pipeline.stages import analyze_in_workers

    request = AnalysisRequest(None, ("fp32", "amp-fp32"), tables="2.11", seq_len=4)
    reports = analyze_in_workers(load_model("llama-tiny", seq_len=4), request, workers=2)
    assert [r.setting["name"] for r in reports] == ["fp32", "amp-fp32"]
    for report in reports:
        assert report.check is None and "torch 2.11" in report.capture["check_unavailable"]


def test_the_command_line_builds_one_request_from_its_parsed_options() -> None:
    """--tracer, --force, --timeout and --recipe reach the request from click's parsed values,
    with no function of the command taking them, and nothing left in ``ctx.meta``."""
    import click
    from click.testing import CliRunner

    from ampgraph.cli.options import model_argument, setting_options
    from ampgraph.cli.reports import analysis_request

    @click.command()
    @model_argument
    @setting_options
    @click.pass_context
    def show(ctx: click.Context, model: str, settings: tuple[str, ...], device: str,
             amp_dtype: str, seq_len: int) -> None:  # fmt: skip
        r = analysis_request(model, settings, device, amp_dtype, seq_len)
        names = [s.name for s in r.settings]
        click.echo(f"{r.model} {r.traced_by} {r.force} {r.timeout} {names} {dict(ctx.meta)}")

    args = ["llama-tiny", "--tracer", "export", "--force", "--timeout", "30", "--recipe", "hf:bf16"]
    out = CliRunner().invoke(show, args)
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[-1] == "llama-tiny export True 30.0 ['amp-fp32,outputs=fp32'] {}"
    out = CliRunner().invoke(show, ["--config", "x.json", "-s", "half"])
    assert out.output.splitlines()[-1].startswith("x.json make-fx False 600.0 ['half']")


def test_ranges_and_a_what_if_take_a_request_of_one_model_spec() -> None:
    from ampgraph.errors import ArgumentError
    from ampgraph.ranges.spec_run import ranges_of_spec
    from ampgraph.review.compare_runs import compare_change

    with pytest.raises(ArgumentError, match="model spec"):
        ranges_of_spec(AnalysisRequest(None, ("amp-fp32",)), print)
    with pytest.raises(ArgumentError, match="one model spec in one setting"):
        compare_change(AnalysisRequest("llama-tiny", ("amp-fp32", "amp-half")), keep=["*mlp*"])
