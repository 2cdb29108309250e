"""Shared fixtures: models are built once per session and analyses are memoised, because an
OPT-125M analysis costs a couple of seconds and many tests read the same one."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import pytest

from ampgraph import Report, Setting
from ampgraph.analysis import analyze
from ampgraph.models import ModelInputs, load_model

DATA = Path(__file__).parent / "data"

# Tests never read or fill the user's cache of analyses.
os.environ["AMPGRAPH_CACHE_DIR"] = tempfile.mkdtemp(prefix="ampgraph-test-cache-")


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
