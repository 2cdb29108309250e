"""The analysis cache: a warm run reads JSON and never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampgraph import cache
from ampgraph.specs import ModelSpec


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
    key = cache.cache_key({"model": "m"}, {"setting": "fp32"})
    cache.store(key, {"a": 1})
    assert cache.load(key) == {"a": 1}
    root, entries, size = cache.info()
    assert (root, entries) == (tmp_path, 1) and size > 0
    assert cache.clear()[0] == 1
    assert cache.load(key) is None and not list(tmp_path.rglob("*.tmp"))


def test_clear_removes_only_what_ampgraph_wrote(tmp_path: Path, monkeypatch) -> None:
    """AMPGRAPH_CACHE_DIR pointed at a folder of the user's own (issue 11, case 1)."""
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    (tmp_path / "thesis.tex").write_text("chapter 1")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "main.py").write_text("print(1)")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "notes.json").write_text("{}")  # not an entry name
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / ("a" * 64 + ".json")).write_text("{}")
    (tmp_path / "reports" / "link").symlink_to(outside)
    key = cache.cache_key({"model": "m"}, {"setting": "fp32"})
    cache.store(key, {"a": 1})
    assert cache.clear() == (1, len('{"a":1}'))
    assert (tmp_path / "thesis.tex").read_text() == "chapter 1"
    assert (tmp_path / "p" / "main.py").exists() and (tmp_path / "reports" / "notes.json").exists()
    assert (outside / ("a" * 64 + ".json")).exists()


def test_clear_over_a_symlinked_or_read_only_cache_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from ampgraph.cli import main

    real = tmp_path / "real"
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(real))
    cache.store("b" * 64, {})  # an entry ampgraph wrote, in its tagged folder
    entry = real / "reports" / ("b" * 64 + ".json")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "reports").symlink_to(real / "reports")
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["cache", "clear"])
    assert result.exit_code == 0 and entry.exists()  # a symlinked folder is not followed

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(real))

    def read_only(self: Path, missing_ok: bool = False) -> None:  # what EROFS/EACCES look like
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)  # root may write a chmod-ed folder anyway
    result = CliRunner().invoke(main, ["cache", "clear"])
    assert result.exit_code == 1 and result.output.startswith("Error: cannot clear the cache")
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", ["[]", "42", '"x"', '{"schema": "ampgraph.report"', "{}"])
def test_a_damaged_entry_is_ignored_and_rewritten(tmp_path: Path, monkeypatch, content) -> None:
    from click.testing import CliRunner

    from ampgraph.cli import main

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    args = ["table", "llama-tiny", "-s", "fp32", "--device", "cpu"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    (entry,) = (tmp_path / "reports").glob("*.json")
    entry.write_text(content)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and again.output == first.output
    assert json.loads(entry.read_text())["schema"] == "ampgraph.report"


def test_the_key_is_the_model_as_the_user_named_it(tmp_path: Path) -> None:
    """Two folders with the same config.json are two models; an alias is its model."""
    config = (Path(cache.__file__).parent / "configs" / "llama-tiny.json").read_bytes()
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_bytes(config)
    a = cache.model_identity(ModelSpec(str(tmp_path / "alpha"), "dir"))
    b = cache.model_identity(ModelSpec(str(tmp_path / "beta"), "dir"))
    assert a is not None and b is not None and a != b and a["name"] == "alpha"
    assert cache.model_identity("opt") == cache.model_identity("opt-125m")
    # --config DIR is refused by the loader, so it is never served from the cache either
    assert cache.model_identity(ModelSpec(str(tmp_path / "alpha"), "config")) is None


def test_clear_needs_ampgraphs_tag(tmp_path: Path, monkeypatch) -> None:
    """A 'reports' folder of the user's own, even holding files named like entries, is not ours."""
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    (tmp_path / "reports").mkdir()
    theirs = tmp_path / "reports" / ("c" * 64 + ".json")
    theirs.write_text('{"mine": true}')
    assert cache.clear() == (0, 0) and cache.info()[1] == 0 and theirs.exists()
    (tmp_path / "reports" / cache.TAG_NAME).write_text("Signature: something else\n")
    assert cache.clear() == (0, 0) and theirs.exists()
    # Once ampgraph has written there, its tag is what a cache directory tag must start with.
    (tmp_path / "reports" / cache.TAG_NAME).unlink()
    cache.store("d" * 64, {"a": 1})
    tag = (tmp_path / "reports" / cache.TAG_NAME).read_bytes()
    assert tag.startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert cache.clear() == (2, len('{"mine":true}') + 1 + len('{"a":1}'))
    assert not (tmp_path / "reports").exists()  # nothing of anyone's left: the folder goes too


def test_an_alias_is_served_from_the_cache(opt_report, monkeypatch, tmp_path: Path) -> None:
    """`ampgraph table opt` reads the entry `ampgraph table opt-125m` wrote: no model is built."""
    from click.testing import CliRunner

    from ampgraph import pipeline
    from ampgraph.cli import main
    from ampgraph.settings import Setting

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    setting = Setting.parse("amp-fp32")
    (key,) = pipeline.report_keys("opt-125m", [setting], seq_len=8, check=True)
    cache.store(key, opt_report("amp-fp32").to_dict())  # what the cold run stores

    def no_building(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was built: the cache was not read")

    monkeypatch.setattr(pipeline, "prepare", no_building)
    result = CliRunner().invoke(main, ["table", "opt", "-s", "amp-fp32", "--only", "Linear"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        "[model.decoder.layers.0.self_attn.q_proj] in=torch.float32 -> out=torch.bfloat16"
    )


def test_model_folders_keep_their_names_warm_and_cold(tmp_path: Path, monkeypatch) -> None:
    """Two --model-dir folders with the same config.json are two models, each under its own
    name, cached or not; --config on a folder is refused the same way warm and cold."""
    from click.testing import CliRunner

    from ampgraph.cli import main

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    config = (Path(cache.__file__).parent / "configs" / "llama-tiny.json").read_bytes()
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_bytes(config)

    def table(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(main, [*args, "-s", "fp32", "--device", "cpu", "--no-check",
                                           "--format", "json"])  # fmt: skip
        return result.exit_code, result.output

    names = {}
    for name in ("alpha", "beta", "alpha"):  # the second alpha is warm
        for flags in ((), ("--no-cache",)):
            code, out = table(*flags, "table", "--model-dir", str(tmp_path / name))
            assert code == 0, out
            names.setdefault(name, set()).add(json.loads(out)["model"])
    assert names == {"alpha": {"alpha"}, "beta": {"beta"}}
    assert len(list((tmp_path / "cache" / "reports").glob("*.json"))) == 2
    for flags in ((), ("--no-cache",)):
        code, out = table(*flags, "table", "--config", str(tmp_path / "alpha"))
        assert code == 1 and out.startswith("Error: ") and "is a folder: use --model-dir" in out
