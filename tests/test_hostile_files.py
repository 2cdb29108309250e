"""Files that are not what they say (issue 35): FIFOs, devices, endless pipes, folders, files
too big, a cache folder someone else planted, and options that contradict each other.

Every file here is made by the test. Each case is run through the CLI as a user would run it: one
``Error:`` line and exit 1 (exit 2 for a usage error), never a hang, a traceback or a read of
more memory than the file holds. A guard kills the test run should a read ever block.
"""

from __future__ import annotations

import faulthandler
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampgraph.cli import main
from ampgraph.errors import FileReadError
from ampgraph.pipeline import cache
from ampgraph.report.reading import CONFIG_LIMIT, read_bytes, read_fd
from ampgraph.report.records import Report

from .test_data_files import one_error_line, report

REPORT_DATA = Path(__file__).parent / "data" / "opt-125m-amp-fp32.json"


@pytest.fixture(autouse=True)
def never_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) ends the run with a traceback of
    where it hung, rather than hanging CI for its 90 minutes."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def hostile(tmp_path: Path, kind: str) -> Path:
    """A path that is not a regular file: ``kind`` is fifo, zero, pipe, folder or big."""
    if kind == "fifo":
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
        return path
    if kind in ("zero", "pipe"):  # named .json (a link), so diff takes it for a file
        path = tmp_path / f"{kind}.json"
        if kind == "zero":
            path.symlink_to("/dev/zero")
            return path
        read, write = os.pipe()  # an endless pipe, as `<(yes)` gives one: its writer stays
        os.set_blocking(write, False)
        os.write(write, b"y\n" * 1000)
        path.symlink_to(f"/proc/self/fd/{read}")
        return path
    if kind == "folder":
        path = tmp_path / "folder.json"
        path.mkdir()
        return path
    path = tmp_path / "big.json"  # sparse: past every bound, yet no disk used
    with open(path, "wb") as handle:
        handle.truncate(600 * 10**6)
    return path


KINDS = ["fifo", "zero", "pipe", "folder", "big"]
#: Every command that reads a file a user names, with FILE where the hostile path goes.
READERS = {
    "--report": ["audit", "--report", "FILE"],
    "diff": ["diff", "FILE", "FILE"],
    "baseline": ["baseline", "check", "FILE"],
    "--config": ["table", "--config", "FILE"],
    "deepspeed": ["table", "--recipe", "deepspeed:FILE"],
}
SAYS = {
    "fifo": "it is a FIFO (a named pipe), not a regular file",
    "zero": "it is a character device, not a regular file",
    "pipe": "it is a FIFO (a named pipe), not a regular file",
    "folder": "it is a folder, not a regular file",
    "big": "it is larger than the",
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_that_is_not_a_regular_one_is_one_line(
    tmp_path: Path, kind: str, reader: str
) -> None:
    path = hostile(tmp_path, kind)
    args = [a.replace("FILE", str(path)) for a in READERS[reader]]
    line = one_error_line(invoke(*args), 1)
    says = SAYS[kind]
    if kind == "folder" and reader in ("diff", "--config"):
        says = "is a folder" if reader == "--config" else "has no config.json"  # a model's
    assert says in line and str(path) in line, line


def test_the_bound_is_never_allocated_and_a_link_is_followed(tmp_path: Path) -> None:
    """``read(n)`` allocates n bytes first: a bound of a petabyte reads a small file; a link
    is followed to a regular file (as the write path follows it), and refused with follow=False."""
    target = tmp_path / "a.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert read_bytes(link, "report", limit=10**15) == b"{}"
    with pytest.raises(FileReadError, match="symbolic link"):
        read_bytes(link, "cache entry", follow=False)
    fifo_link = tmp_path / "fifo-link.json"
    fifo_link.symlink_to(hostile(tmp_path, "fifo"))
    with pytest.raises(FileReadError, match="FIFO"):
        read_bytes(fifo_link, "report")
    grown = tmp_path / "grown.json"
    grown.write_bytes(b"x" * 10)
    fd = os.open(grown, os.O_RDONLY)
    try:
        with open(grown, "ab") as handle:  # grows after its size was taken
            handle.write(b"x" * 100)
        with pytest.raises(FileReadError, match="larger than"):
            read_fd(fd, grown, "report", 50)
    finally:
        os.close(fd)
    with pytest.raises(FileReadError, match="larger than"):
        read_bytes(hostile(tmp_path, "big"), "config", limit=CONFIG_LIMIT)


# -- the cache ----------------------------------------------------------------------------------


def _request(name: str = "m") -> dict:
    return cache.request_of({"name": name}, {"setting": "fp32"}, {"ampgraph": "1"})


def _report(request: dict, size: int = 0) -> dict:
    return {"model": request["model"]["name"], "setting": "fp32", "pad": "x" * size,
            "versions": {"ampgraph": "1"}}  # fmt: skip


def test_a_bound_above_memory_reads_by_the_entry_size(tmp_path: Path, monkeypatch) -> None:
    """AMPGRAPH_CACHE_MAX_BYTES=100G made every warm run a MemoryError (the read allocated the
    bound); a value past 2**63 an OverflowError."""
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cache.MAX_BYTES_VARIABLE, "100G")
    request = _request()
    cache.store(request, _report(request))
    assert cache.load(request) == _report(request)
    for nonsense in ("9" * 400, "99999999999999999999T", "lots", "-5", "1e30"):
        monkeypatch.setenv(cache.MAX_BYTES_VARIABLE, nonsense)
        assert cache.bound()[0] == cache.DEFAULT_MAX_BYTES
        assert cache.load(request) == _report(request)  # every command still runs
        result = invoke("cache", "info")
        assert result.exit_code == 0 and "is not a size such as 2G" in result.output
        assert len(result.output) < 500  # a 400-digit value is cut
    monkeypatch.setenv(cache.MAX_BYTES_VARIABLE, str(10**18))  # an exabyte: more than any disk
    result = invoke("cache", "info")
    assert result.exit_code == 0 and "larger than the disk" in result.output


def test_a_lowered_bound_is_enforced(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    requests = [_request(f"m{i}") for i in range(3)]
    for request in requests:
        cache.store(request, _report(request, 2000))
    assert cache.info()[1] == 3
    monkeypatch.setenv(cache.MAX_BYTES_VARIABLE, "3000")  # room for one entry
    assert cache.load(requests[2]) is not None  # served, and the others evicted
    assert cache.info()[1] == 1
    monkeypatch.setenv(cache.MAX_BYTES_VARIABLE, "10")  # no room for any
    assert cache.load(requests[2]) is None
    cache.store(requests[0], _report(requests[0], 2000))  # too big to store: evicts the rest
    assert cache.info()[1] == 0


def test_a_fifo_at_an_entry_path_is_skipped(tmp_path: Path, monkeypatch) -> None:
    """A FIFO planted at an entry's path made every run of that analysis hang."""
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    request, other = _request(), _request("other")
    cache.store(other, _report(other))  # makes and tags the folder
    entry = tmp_path / "reports" / f"{cache.key_of(request)}.json"
    os.mkfifo(entry)
    assert cache.load(request) is None
    cache.store(request, _report(request))  # never written through, never replaced
    assert entry.is_fifo() and cache.load(request) is None
    assert cache.load(other) == _report(other)
    os.mkfifo(tmp_path / "reports" / "CACHEDIR.TAG.fifo")
    assert invoke("cache", "info").exit_code == 0


def test_a_symlinked_reports_folder_is_never_written_into(tmp_path: Path, monkeypatch) -> None:
    """As root, entries and a CACHEDIR.TAG landed in the folder the link named (which `tar
    --exclude-caches` then dropped from backups)."""
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("chapter 1")
    root = tmp_path / "cache"
    root.mkdir()
    (root / "reports").symlink_to(elsewhere)
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(root))
    request = _request()
    cache.store(request, _report(request))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["thesis.tex"]
    assert cache.load(request) is None and cache.info()[1:] == (0, 0)
    assert invoke("cache", "clear").exit_code == 0 and (elsewhere / "thesis.tex").exists()
    # A FIFO as the tag of a real folder: read without blocking, not ours.
    (root / "reports").unlink()
    (root / "reports").mkdir()
    os.mkfifo(root / "reports" / "CACHEDIR.TAG")
    cache.store(request, _report(request))
    assert cache.load(request) is None


def test_info_and_clear_on_a_folder_they_cannot_search(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path))
    request = _request()
    cache.store(request, _report(request))

    def unsearchable(self: Path):  # what EACCES looks like to root-less users
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", unsearchable)
    for command in ("info", "clear"):
        line = one_error_line(invoke("cache", command), 1)
        assert "Permission denied" in line and str(tmp_path) in line


# -- saved reports -------------------------------------------------------------------------------


def test_a_field_a_reader_does_not_know_is_ignored(tmp_path: Path) -> None:
    """docs/schema.md: readers ignore fields they do not know (a newer ampgraph's report)."""
    data = report().to_dict()
    for node in data["nodes"]:
        node["added_later"] = {"x": 1}
    for call in data["modules"]:
        call["added_later"] = 1
    data["check"] = {"oracle": "dispatcher", "compared": 3, "disagreements": 0, "more": [1]}
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(data))
    assert Report.from_dict(data).nodes == report().nodes
    assert invoke("audit", "--report", path).exit_code == 0
    assert invoke("diff", path, path).exit_code == 0


def test_repr_and_summary_survive_a_damaged_check() -> None:
    damaged = report()
    damaged.check = {"compared": "lots", "disagreements": None}
    assert "a damaged check" in repr(damaged) and "a damaged check" in damaged.summary()


#: What a hand-edited report may hold anywhere.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=8,
)  # fmt: skip
FIELDS = st.sampled_from([
    ("check",), ("versions",), ("versions", "policy_tables"), ("setting", "device_type"),
    ("capture", "stand_in"), ("nodes", 2, "shapes"), ("nodes", 2, "check"),
    ("nodes", 2, "new"), ("modules", 0, "nodes"), ("check", "compared"),
])  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=FIELDS, value=JSON_VALUES)
def test_a_saved_report_is_read_or_refused_in_one_line(where: tuple, value: object) -> None:
    """Whatever value lands in a field, the report is refused in one line, or read into one
    whose repr, summary and audit print without a crash."""
    from ampgraph.formats.text import audit_text
    from ampgraph.review import audit

    data = report().to_dict()
    data["check"] = {"oracle": "dispatcher", "nodes": 5, "compared": 3, "disagreements": 0}
    target = data
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    try:
        read = Report.from_dict(json.loads(json.dumps(data)))
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert repr(read) and read.summary()
    assert audit_text(read, audit.audit(read))


# -- options that contradict each other ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["table", "--recipe", "hf:bf16", "--amp-dtype", "fp16"], "--amp-dtype or --recipe"),
        (["table", "-s", "amp-fp32,device=cpu", "--device", "cuda"], "give the device once"),
        (["table", "--recipe", "fsdp2:param_dtype="], "gives param_dtype no value"),
        (["audit", "--report", "REPORT", "--recipe", "hf:bf16"], "--recipe does not apply"),
        (["render", "--report", "REPORT", "--recipe", "hf:bf16"], "--recipe does not apply"),
    ],
)
def test_an_option_is_used_or_refused(args: list[str], says: str) -> None:
    line = one_error_line(invoke(*[str(REPORT_DATA) if a == "REPORT" else a for a in args]), 2)
    assert says in line


def test_a_hostile_value_is_cut_in_the_error() -> None:
    huge = "x" * 100_000
    for args in (
        ["table", "-s", huge], ["table", "--device", huge], ["table", huge],
        ["table", "--recipe", f"hf:{huge}"], ["table", "--module", f"{huge}:f"],
    ):  # fmt: skip
        line = one_error_line(invoke(*args), 1, 2)
        assert len(line) < 600, args[1:2]


# -- stand-in predictions are marked in every artefact ------------------------------------------


def test_a_stand_in_prediction_is_marked_in_every_artefact(tmp_path: Path) -> None:
    """xpu and mps on a torch built without them are predictions (traced on CUDA, annotated
    with the device's lists): diagrams, SARIF, audit text and baselines say so."""
    from ampgraph.formats.sarif import audit_sarif as sarif
    from ampgraph.formats.text import audit_text as text
    from ampgraph.render.dot import to_dot
    from ampgraph.review.audit import audit
    from ampgraph.review.baseline import baseline_record, read_baseline
    from ampgraph.formats.json import baseline_file

    predicted = report()
    predicted.setting["device_type"] = "mps"
    why = "a prediction for mps: traced on fake CUDA tensors, not checked against its kernels"
    predicted.capture["stand_in"] = why
    assert "a prediction for mps" in to_dot(predicted)
    result = json.loads(sarif([predicted]))["runs"][0]["results"][0]
    assert "prediction for mps" in result["message"]["text"]
    assert result["properties"]["prediction"] == why
    assert why in text(predicted, audit(predicted))
    base = baseline_file(baseline_record(predicted))
    assert json.loads(base)["stand_in"] == why and read_baseline(base).report.model == "m"
    plain = report()
    assert "prediction" not in (to_dot(plain) + sarif([plain])
                                + baseline_file(baseline_record(plain)))


def test_the_directive_reads_its_files_with_the_one_reader(tmp_path: Path) -> None:
    """A FIFO as the directive's :report: or its DeepSpeed :recipe: blocked sphinx-build
    forever; now each is one warning and the build ends (well inside the guard)."""
    from .test_sphinx import build, make_project, objects

    page = (
        "Hostile\n=======\n\n.. ampgraph::\n   :report: fifo.json\n\n"
        ".. ampgraph::\n   :report: report.json\n   :recipe: deepspeed:ds.json\n"
    )
    src = make_project(tmp_path / "src", {"index.rst": page})
    (src / "fifo.json").unlink(missing_ok=True)
    os.mkfifo(src / "fifo.json")
    os.mkfifo(src / "ds.json")
    proc = build(src, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2 and all("FIFO" in w for w in warnings), warnings
    assert objects((tmp_path / "out" / "index.html").read_text()) == []
