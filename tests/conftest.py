"""Shared fixtures: models are built once per session and analyses are memoised, because an
OPT-125M analysis costs a couple of seconds and many tests read the same one."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from ampgraph import Report, Setting
from ampgraph.model.build import ModelInputs, load_model
from ampgraph.pipeline.stages import analyze

if TYPE_CHECKING:
    from tests.browser import Browser

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def load_file(path: Path) -> ModuleType:
    """A script or example (``scripts/ops_matrix.py``) as a module, loaded once per session.

    It is registered in ``sys.modules`` under its file's name, as an import would: dataclasses
    defined in it look their module up there.
    """
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


# Tests never read or fill the user's cache of analyses; theirs goes when the session ends.
os.environ["AMPGRAPH_CACHE_DIR"] = tempfile.mkdtemp(prefix="ampgraph-test-cache-")
_SESSION_PID = os.getpid()
atexit.register(
    lambda folder=os.environ["AMPGRAPH_CACHE_DIR"]: (
        os.getpid() == _SESSION_PID  # not a fork's
        and shutil.rmtree(folder, ignore_errors=True)
    )
)

#: Tests that compare with CUDA's autocast kernels (the dispatcher check of a cuda setting, or a
#: figure drawn from one), besides those parametrised with "cuda". A CPU-only torch
#: (``TORCH_SPEC=torch==2.13.0 make test``) has no such kernels: they are skipped there, and the
#: CPU-only path itself is tested by test_cpu_only_torch_annotates_on_meta_and_says_it_cannot_check.
NEEDS_CUDA_KERNELS = (
    "test_cli.py::test_table_json_is_a_versioned_report",
    "test_cli.py::test_table_markdown",
    "test_examples.py::test_roipool_example_shows_the_fp32_island",
    "test_tracers.py::test_fx_tracer_matches_export",
    "test_tracers.py::test_hf_fx_keeps_modules_it_traces_through",
    "test_tracers.py::test_hf_fx_records_llamas_rotary_region",
    "test_models.py::test_factory_forms",
    "test_models.py::test_non_causal_models_agree_with_the_dispatcher",
    "test_regions.py::",
    "test_render.py::test_golden_small_model_with_region_and_promotion",
    "test_render.py::test_fixture_matches_a_fresh_analysis",
    "test_fidelity.py::",
    "test_strict_dtypes.py::test_half_resnet",
    "test_vision_matrix.py::",
    "test_ops_matrix.py::",
    # docstring examples that run CUDA's autocast kernels on fake tensors
    "hooks.py::",
    "__init__.py::ampgraph.policy.autocast_kernels",
    "__init__.py::ampgraph.policy.has_autocast_kernel",
    "__init__.py::ampgraph.policy.library_rule",
    "reference.py::",
    "test_reference.py::test_the_bundled_tables",
    "test_reference.py::test_a_table_that_drifted",
    "test_reference.py::test_library_kernels",
    "test_reference.py::test_cli_formats",
    "test_autocast_kernels.py::",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.backends.cuda.is_built():
        return
    skip = pytest.mark.skip(reason="needs CUDA's autocast kernels: this torch is a CPU-only build")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        name = item.nodeid.split("/")[-1]
        if "cuda" in params.values() or name.startswith(NEEDS_CUDA_KERNELS):
            item.add_marker(skip)


@functools.cache
def model(spec: str) -> ModelInputs:
    return load_model(spec)


@functools.cache
def report(spec: str, setting: str, device: str = "cuda", amp: str = "bf16") -> Report:
    """The checked analysis of a bundled model in one setting, computed once per session."""
    return analyze(model(spec), Setting.parse(setting, device_type=device, amp_dtype=amp))


@pytest.fixture
def opt_report():
    return functools.partial(report, "opt-125m")


def seed_hook_blocks() -> dict[str, list[str]]:
    """The seed notebook's printed hook lines per setting (tests/data/seed_000_hook_lines.txt)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (DATA / "seed_000_hook_lines.txt").read_text().splitlines():
        if line.startswith("== "):
            current = blocks.setdefault(line[3:].strip(), [])
        elif current is not None and line.startswith("["):
            current.append(line)
    return blocks


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless Chromium for one test module (``tests/browser.py``): the tests that use it
    skip where none is installed, and fail there under ``AMPGRAPH_REQUIRE_BROWSER=1``. Its
    timeout fits the slowest page (Model Explorer lays its graph out in a worker)."""
    from tests.browser import browser_or_skip

    with browser_or_skip(timeout=120) as chromium:
        yield chromium


@pytest.fixture
def in_analysis() -> Iterator[None]:
    """The test runs torch as an analysis does (:mod:`ampgraph.capture.environment`): ampgraph's
    meta and driverless kernels in place, as they are only inside an analysis."""
    from ampgraph.capture.environment import analysis_environment

    with analysis_environment():
        yield
