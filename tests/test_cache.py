"""The analysis cache: a warm run reads JSON and never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ampgraph import cache


def ampgraph(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampgraph", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def test_second_run_reads_the_cache_without_importing_torch(tmp_path: Path) -> None:
    env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    # --device cpu: the check runs on every build of torch, CPU-only ones included.
    first = ampgraph(
        "check", "llama-tiny", "-s", "amp-fp32", "-s", "fp32", "--device", "cpu", env=env
    )
    assert first.returncode == 0, first.stderr
    assert len(list((tmp_path / "cache" / "reports").glob("*.json"))) == 2
    # A torch that cannot be imported: the warm run must not need it.
    poison = tmp_path / "poison"
    (poison / "torch").mkdir(parents=True)
    (poison / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env_poisoned = {**env, "PYTHONPATH": f"{poison}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    second = ampgraph(
        "check", "llama-tiny", "-s", "amp-fp32", "-s", "fp32", "--device", "cpu", env=env_poisoned
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    # --no-cache recomputes, so it does need torch.
    third = ampgraph(
        "--no-cache", "check", "llama-tiny", "-s", "fp32", "--device", "cpu", env=env_poisoned
    )
    assert third.returncode == 1 and "torch was imported" in third.stderr + third.stdout


def test_key_depends_on_config_setting_and_versions(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "gpt2", "n_layer": 1}')
    ident = cache.model_identity(str(config))
    assert ident is not None
    base = cache.cache_key(ident, {"setting": "fp32"})
    assert cache.cache_key(ident, {"setting": "amp-fp32"}) != base
    config.write_text('{"model_type": "gpt2", "n_layer": 2}')
    assert cache.cache_key(cache.model_identity(str(config)), {"setting": "fp32"}) != base
    assert cache.model_identity("package.module:factory") is None


def test_key_depends_on_the_analysis_code(monkeypatch) -> None:
    """Between releases (a source tree, an editable install) a code change must not be served a
    report the old code made."""
    ident = {"model": "opt-125m"}
    base = cache.cache_key(ident, {"setting": "fp32"})
    monkeypatch.setattr(cache, "source_digest", lambda: "another")
    assert cache.cache_key(ident, {"setting": "fp32"}) != base
    assert len(cache.environment()["source"]) == len("another")


def test_clear_and_info(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    cache.store("k1", {"a": 1})
    assert cache.load("k1") == {"a": 1}
    root, entries, size = cache.info()
    assert (root, entries) == (tmp_path, 1) and size > 0
    assert cache.clear()[0] == 1
    assert cache.load("k1") is None and not list(tmp_path.rglob("*.tmp"))
