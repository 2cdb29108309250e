"""The analysis cache: a warm run reads JSON and never imports torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampgraph.model.specs import ModelSpec
from ampgraph.pipeline import cache


def ampgraph(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampgraph", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def _report(request: dict, size: int = 0) -> dict:
    """A report dict that says it answers ``request`` (see cache.describes), padded with about
    ``size`` bytes."""
    env = request["env"]
    return {
        "model": request["model"]["name"], "setting": request["request"].get("setting"),
        "pass": "forward", "pad": "x" * size,
        "versions": {k: env[k] for k in ("ampgraph", "torch", "transformers")},
    }  # fmt: skip


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


def test_the_key_hashes_the_analysis_code_not_the_command_line_nor_the_writers(
    tmp_path: Path,
) -> None:
    """Issue 46: a copy of the installed package, its files edited one at a time. An edit of the
    command line, a format's writer or the renderer (which only ask for or present a report)
    keeps the digest, so no cached analysis is lost to it; an edit of the capture, the
    annotation, the policy tables' data, the pipeline or the records changes it, as does a new
    analysis module."""
    package = Path(cache.__file__).resolve().parent.parent
    copy = tmp_path / "ampgraph"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = cache.source_digest(copy)
    assert base == cache.source_digest(package) == cache.environment()["source"]

    def edited(relative: str, text: str = "\n# edited\n") -> str:
        path = copy / relative
        before = path.read_bytes() if path.exists() else None
        with path.open("a") as f:
            f.write(text)
        try:
            return cache.source_digest(copy)
        finally:
            if before is None:
                path.unlink()
            else:
                path.write_bytes(before)

    presenting = ["cli/__init__.py", "cli/analyze_commands.py", "cli/options.py",
                  "formats/json.py", "formats/markdown.py", "render/dot.py", "docs/reference.py",
                  "cli/new_command.py"]  # fmt: skip
    for relative in presenting:
        assert edited(relative) == base, relative
    analysing = ["capture/trace.py", "annotate/annotator.py", "policy/__init__.py",
                 "pipeline/stages.py", "pipeline/request.py", "report/records.py",
                 "settings.py", "train/backward.py", "capture/new_capture.py"]  # fmt: skip
    for relative in analysing:
        assert edited(relative) != base, relative
    assert edited("policy/kernel_coverage.json", " ") != base  # the tables' data
    assert cache.source_digest(copy) == base  # every edit undone


def test_clear_and_info(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    request = cache.request_of({"name": "m"}, {"setting": "fp32"})
    cache.store(request, _report(request))
    assert cache.load(request) == _report(request)
    root, entries, size = cache.info()
    assert (root, entries) == (tmp_path, 1) and size > 0
    assert cache.clear()[0] == 1
    assert cache.load(request) is None and not list(tmp_path.rglob("*.tmp"))


def test_clear_removes_only_what_ampgraph_wrote(tmp_path: Path, monkeypatch) -> None:
    """AMPGRAPH_CACHE_DIR pointed at a folder of the user's own (issue 11, case 1): a
    ``reports`` folder of theirs is not ampgraph's, so nothing is stored into it either (issue
    35); entries land once it is gone, and clear removes those alone."""
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
    request = cache.request_of({"name": "m"}, {"setting": "fp32"})
    cache.store(request, _report(request))
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["link", "notes.json"]
    assert cache.clear() == (0, 0)
    (tmp_path / "reports").rename(tmp_path / "mine")
    cache.store(request, _report(request))
    stored = (tmp_path / "reports" / f"{cache.key_of(request)}.json").stat().st_size
    assert cache.clear() == (1, stored)
    assert (tmp_path / "thesis.tex").read_text() == "chapter 1"
    assert (tmp_path / "p" / "main.py").exists() and (tmp_path / "mine" / "notes.json").exists()
    assert (outside / ("a" * 64 + ".json")).exists()


def test_clear_over_a_symlinked_or_read_only_cache_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from ampgraph.cli import main

    real = tmp_path / "real"
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(real))
    request = cache.request_of({"name": "m"}, {})
    cache.store(request, _report(request))  # an entry ampgraph wrote, in its tagged folder
    entry = real / "reports" / f"{cache.key_of(request)}.json"
    assert entry.exists()
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
    assert json.loads(entry.read_text())["report"]["schema"] == "ampgraph.report"


def test_the_key_is_the_model_as_the_user_named_it(tmp_path: Path) -> None:
    """Two folders with the same config.json are two models; an alias is its model."""
    config = (Path(cache.__file__).parent.parent / "model" / "configs" / "llama-tiny.json").read_bytes()
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
    request = cache.request_of({"name": "m"}, {})
    cache.store(request, _report(request))
    tag = (tmp_path / "reports" / cache.TAG_NAME).read_bytes()
    assert tag.startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    ours = (tmp_path / "reports" / f"{cache.key_of(request)}.json").stat().st_size
    assert cache.clear() == (2, len('{"mine":true}') + 1 + ours)
    assert not (tmp_path / "reports").exists()  # nothing of anyone's left: the folder goes too


def test_an_alias_is_served_from_the_cache(opt_report, monkeypatch, tmp_path: Path) -> None:
    """`ampgraph table opt` reads the entry `ampgraph table opt-125m` wrote: no model is built."""
    from click.testing import CliRunner

    from ampgraph.cli import main
    from ampgraph.pipeline import run as pipeline
    from ampgraph.settings import Setting

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    setting = Setting.parse("amp-fp32")
    (request,) = pipeline.report_requests("opt-125m", [setting], seq_len=8, check=True)
    assert request is not None
    cache.store(request, opt_report("amp-fp32").to_dict())  # what the cold run stores

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
    config = (Path(cache.__file__).parent.parent / "model" / "configs" / "llama-tiny.json").read_bytes()
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


# -- "Safe in a pull request": an entry is served only for the request it was stored for --------


def _table(tmp_path: Path, *args: str) -> str:
    """`ampgraph table ... --format json` with the cache in tmp_path; the output."""
    from click.testing import CliRunner

    from ampgraph.cli import main

    result = CliRunner().invoke(
        main, ["table", *args, "-s", "fp32", "--device", "cpu", "--format", "json"],
        env={"AMPGRAPH_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def _entries(tmp_path: Path) -> set[Path]:
    return set((tmp_path / "cache" / "reports").glob("*.json"))


@pytest.mark.parametrize("forged", ["copied", "relabelled"])
def test_another_models_report_at_this_key_is_a_miss(tmp_path: Path, forged: str) -> None:
    """A valid report of llama-tiny put where `other`'s belongs is not served as `other`'s:
    whether the file was copied there as it is, or its request was rewritten to be `other`'s."""
    other = tmp_path / "other.json"
    other.write_bytes((Path(cache.__file__).parent.parent / "model" / "configs" / "llama-tiny.json").read_bytes())
    assert json.loads(_table(tmp_path, "llama-tiny"))["model"] == "llama-tiny"
    (llama_entry,) = _entries(tmp_path)
    fresh = _table(tmp_path, "--config", str(other))
    assert json.loads(fresh)["model"] == "other"
    (other_entry,) = _entries(tmp_path) - {llama_entry}
    stolen = json.loads(llama_entry.read_text())
    if forged == "relabelled":  # the wrapper says `other`, the report inside is llama-tiny's
        mine = json.loads(other_entry.read_text())
        stolen = {**mine, "report": stolen["report"]}
    other_entry.write_text(json.dumps(stolen))
    assert _table(tmp_path, "--config", str(other)) == fresh  # analysed again: the right model
    assert json.loads(other_entry.read_text())["report"]["model"] == "other"  # and rewritten


def test_an_entry_with_nan_dtypes_is_a_miss(tmp_path: Path) -> None:
    """JSON's NaN is no dtype: such an entry is analysed again, never printed as torch.nan."""
    first = _table(tmp_path, "llama-tiny")
    (entry,) = _entries(tmp_path)
    data = json.loads(entry.read_text())
    report = data.get("report", data)
    for module in report["modules"]:
        module["out"] = float("nan")  # json.dumps writes NaN, which json.loads would read back
    entry.write_text(json.dumps(data))
    assert "NaN" in entry.read_text()
    again = _table(tmp_path, "llama-tiny")
    assert again == first and "NaN" not in again


def test_a_report_that_does_not_read_is_a_miss(tmp_path: Path, monkeypatch) -> None:
    """Whatever Report.from_dict raises for an entry (the project's error for a dtype that is
    none, or a plain ValueError, TypeError or KeyError), the entry is a miss, not a crash."""
    from ampgraph.errors import AmpgraphError
    from ampgraph.pipeline import run as pipeline
    from ampgraph.report.records import Report
    from ampgraph.settings import Setting

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    (request,) = pipeline.report_requests("opt-125m", [Setting.parse("fp32")], seq_len=8,
                                          check=True)  # fmt: skip
    assert request is not None
    cache.store(request, _report(request))
    assert cache.load(request) is not None  # the cache itself serves it...
    for error in (AmpgraphError("bad dtype 'nan'"), ValueError("x"), TypeError("x"), KeyError("x")):

        def refuse(data: object, error: Exception = error) -> Report:
            raise error

        monkeypatch.setattr(Report, "from_dict", refuse)
        assert pipeline.cached_report(request) is None  # ...and the pipeline misses


def test_the_key_is_the_environment(monkeypatch) -> None:
    """Reports carry source locations in the installed packages: another virtual environment,
    another place torch is installed, another Python or platform is another key."""
    monkeypatch.setattr(cache, "source_digest", lambda: "fixed")  # not what is tested here
    ident = {"name": "opt-125m"}
    base = cache.cache_key(ident, {"setting": "fp32"})
    env = cache.environment()
    assert env["prefix"] == sys.prefix and env["torch"] != "not installed"
    assert Path(env["torch_at"]).is_dir()  # where torch's distribution was found
    installed = cache._installed
    elsewhere = [
        (sys, "prefix", "/elsewhere/venv"),
        (sys, "version", "3.99.0 (other build)"),
        (sys, "platform", "plan9"),
        (cache, "_installed", lambda dist: (installed(dist)[0], "/elsewhere/site-packages")),
    ]
    for owner, name, value in elsewhere:
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, value)
            assert cache.cache_key(ident, {"setting": "fp32"}) != base, name
    assert cache.cache_key(ident, {"setting": "fp32"}) == base


def test_the_environment_is_read_without_importing_torch() -> None:
    code = (
        "import sys\nfrom ampgraph.pipeline import cache\ncache.environment()\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def _fill(folder: Path, count: int) -> None:
    """``count`` entries written as store writes them, quickly."""
    cache.store(cache.request_of({"name": "m"}, {"i": -1}), {"a": 1})  # the tag, the folder
    for i in range(count):
        (folder / f"{i:064x}.json").write_text("{}")


def test_two_clears_at_once_both_succeed(tmp_path: Path, monkeypatch) -> None:
    """Each clear finds the other's files gone under it: that is not an error."""
    import threading

    def clear(barrier: threading.Barrier, results: list[object]) -> None:
        barrier.wait()
        try:
            results.append(cache.clear())
        except Exception as exc:  # noqa: BLE001 - the test reports it below
            results.append(exc)

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    for _ in range(5):
        _fill(tmp_path / "reports", 1500)
        barrier = threading.Barrier(3)
        results: list[object] = []
        threads = [threading.Thread(target=clear, args=(barrier, results)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(isinstance(r, tuple) for r in results), results
        assert sum(r[0] for r in results) == 1501  # type: ignore[index]
        assert not (tmp_path / "reports").exists()


def test_a_store_racing_a_clear_lands_or_is_skipped(tmp_path: Path, monkeypatch) -> None:
    import threading

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    errors: list[BaseException] = []
    stop = threading.Event()

    def clearing() -> None:
        try:
            while not stop.is_set():
                cache.clear()
        except BaseException as exc:  # noqa: BLE001 - the test reports it below
            errors.append(exc)

    thread = threading.Thread(target=clearing)
    thread.start()
    try:
        for i in range(300):
            cache.store(cache.request_of({"name": "m"}, {"i": i}), {"a": i})
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    # Whatever landed can be cleared: no entry is left in a folder without its tag.
    cache.clear()
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").iterdir())


def test_the_least_recently_used_entries_go_first(tmp_path: Path, monkeypatch) -> None:
    import time

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    env = cache.environment()
    requests = {n: cache.request_of({"name": "m"}, {"setting": n}, env) for n in "abcd"}
    paths = {n: tmp_path / "reports" / f"{cache.key_of(r)}.json" for n, r in requests.items()}
    now = time.time()
    for age, name in enumerate("abc"):
        cache.store(requests[name], _report(requests[name], 3000))
        os.utime(paths[name], (now - 100 + age, now - 100 + age))  # a oldest, then b, then c
    bound = paths["a"].stat().st_size * 7 // 2  # room for three entries, not four
    monkeypatch.setenv("AMPGRAPH_CACHE_MAX_BYTES", str(bound))
    assert cache.load(requests["a"]) is not None  # served: a is now the most recently used
    cache.store(requests["d"], _report(requests["d"], 3000))  # the fourth: one must go
    kept = {n for n in "abcd" if cache.load(requests[n]) is not None}
    assert kept == {"a", "c", "d"}
    assert cache.info()[2] <= bound
    # An entry bigger than the whole bound is not stored at all (nothing is evicted for it).
    cache.store(requests["b"], _report(requests["b"], bound))
    assert {n for n in "abcd" if cache.load(requests[n]) is not None} == {"a", "c", "d"}


def test_cache_info_shows_the_bound(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from ampgraph.cli import main

    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("AMPGRAPH_CACHE_MAX_BYTES", raising=False)
    result = CliRunner().invoke(main, ["cache", "info"])
    assert result.exit_code == 0 and "of at most 512.0 MB" in result.output, result.output
    monkeypatch.setenv("AMPGRAPH_CACHE_MAX_BYTES", "2G")
    result = CliRunner().invoke(main, ["cache", "info"])
    assert "of at most 2000.0 MB (AMPGRAPH_CACHE_MAX_BYTES)" in result.output, result.output
    monkeypatch.setenv("AMPGRAPH_CACHE_MAX_BYTES", "lots")
    result = CliRunner().invoke(main, ["cache", "info"])
    assert result.exit_code == 0 and "512.0 MB" in result.output
    assert "AMPGRAPH_CACHE_MAX_BYTES='lots'" in result.output, result.output
