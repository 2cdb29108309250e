"""The Python API checks its arguments once, with ampgraph's own error (issue 43, cause 5).

Each public entry point that takes a model, settings, a length, a seed, a bound, workers or a
path (:data:`ampgraph.__all__`) is called with what a user might pass by mistake: a string for a
number, a float for a length, ``inf`` for a bound, an empty list of settings. Each is one
:class:`~ampgraph.errors.ArgumentError` (also a ``TypeError`` and a ``ValueError``) naming the
argument, raised before any work, never an error from deep inside torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ampgraph
from ampgraph import ArgumentError, analyze, analyze_spec, load_model, value_ranges
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.request import AnalysisRequest


def linear() -> ModelInputs:
    return ModelInputs("linear", torch.nn.Linear(4, 4), (torch.ones(1, 4),))


BAD_SEQ_LEN = ["8", 2.5, 0, -1, True, None]
BAD_TIMEOUT = ["5", -1, math.inf, math.nan, 1e9, True]


def test_the_error_is_the_librarys_and_a_type_and_value_error() -> None:
    assert issubclass(ArgumentError, ampgraph.AmpgraphError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)
    assert "ArgumentError" in ampgraph.__all__


@pytest.mark.parametrize("seq_len", BAD_SEQ_LEN)
def test_seq_len(seq_len: Any) -> None:
    for call in (
        lambda: load_model("llama-tiny", seq_len=seq_len),
        lambda: analyze_spec("llama-tiny", ["fp32"], seq_len=seq_len, check=False),
        lambda: value_ranges("llama-tiny", ["fp32"], seq_len=seq_len, device_type="cpu"),
        lambda: AnalysisRequest("llama-tiny", ("fp32",), seq_len=seq_len),
    ):
        with pytest.raises(ArgumentError, match="^seq_len "):
            call()


@pytest.mark.parametrize("timeout", BAD_TIMEOUT)
def test_timeout(timeout: Any) -> None:
    with pytest.raises(ArgumentError, match="^timeout "):
        analyze_spec("llama-tiny", ["fp32"], timeout=timeout, check=False)
    with pytest.raises(ArgumentError, match="^timeout "):
        AnalysisRequest("llama-tiny", ("fp32",), timeout=timeout)


def test_a_timeout_of_zero_or_none_is_no_bound_and_a_number_is_kept() -> None:
    assert AnalysisRequest("llama-tiny", timeout=0).timeout is None
    assert AnalysisRequest("llama-tiny", timeout=None).timeout is None
    assert AnalysisRequest("llama-tiny", timeout=5).timeout == 5.0


@pytest.mark.parametrize("workers", ["2", 0, -1, 1.5])
def test_workers(workers: Any) -> None:
    with pytest.raises(ArgumentError, match="^workers "):
        analyze_spec("llama-tiny", ["fp32"], workers=workers, check=False)


@pytest.mark.parametrize("settings", [[], (), 7, [7], b"fp32", [None]])
def test_settings_that_are_no_settings(settings: Any) -> None:
    for call in (
        lambda: analyze_spec("llama-tiny", settings, check=False),
        lambda: value_ranges(linear(), settings, device_type="cpu"),
    ):
        # ArgumentError for the list; Setting.parse's SettingError for an item that is no name.
        with pytest.raises((ArgumentError, ampgraph.SettingError), match="setting"):
            call()


def test_one_setting_as_a_string_is_one_setting_not_its_characters() -> None:
    result = value_ranges(linear(), "amp-fp32", device_type="cpu", amp_dtype="fp16")
    assert [s.name for s in result.settings] == ["amp-fp32"]
    reports = analyze_spec("llama-tiny", "fp32", seq_len=4, check=False)
    assert [r.setting["name"] for r in reports] == ["fp32"]


@pytest.mark.parametrize("seed", ["7", -1, 2**64, 1.0, True])
def test_seed(seed: Any) -> None:
    with pytest.raises(ArgumentError, match="^seed "):
        value_ranges(linear(), ["fp32"], seed=seed, device_type="cpu")


def test_the_largest_seed_is_taken() -> None:
    result = value_ranges(linear(), ["fp32"], seed=2**64 - 1, device_type="cpu")
    assert result.seed == 2**64 - 1


def test_value_ranges_takes_a_spec_as_analyze_does() -> None:
    result = value_ranges("llama-tiny", ["amp-fp32"], device_type="cpu", amp_dtype="fp16",
                          seq_len=4)  # fmt: skip
    assert result.model == "llama-tiny" and result.settings[0].name == "amp-fp32"


@pytest.mark.parametrize("model", [7, None, b"llama-tiny"])
def test_a_model_that_is_no_model(model: Any) -> None:
    with pytest.raises(ArgumentError):
        value_ranges(model, ["fp32"], device_type="cpu")
    with pytest.raises(ArgumentError):
        analyze(model, "fp32")


def test_weights_dir_takes_a_str_or_a_path(tmp_path: Path) -> None:
    """A str is a path as a Path is: the folder is read either way (here: one without
    shards, so both say the same thing about it)."""
    outcomes = []
    for folder in (str(tmp_path), tmp_path):
        try:
            outcomes.append(value_ranges(linear(), ["fp32"], weights_dir=folder,
                                         device_type="cpu").weights)  # fmt: skip
        except ampgraph.AmpgraphError as exc:
            assert not isinstance(exc, ArgumentError)
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    with pytest.raises(ArgumentError, match="^weights_dir must be a path"):
        value_ranges(linear(), ["fp32"], weights_dir=7, device_type="cpu")


def test_analyze_group_reads_one_setting_name_as_one_setting() -> None:
    from ampgraph.pipeline.stages import analyze_group

    reports = analyze_group(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),),
                            check=False)  # fmt: skip
    assert [r.setting["name"] for r in reports] == ["amp-fp32"]
    with pytest.raises(ArgumentError, match="settings is empty"):
        analyze_group(torch.nn.Linear(4, 4), [], args=(torch.randn(2, 4),), check=False)
