"""A model folder's weights are data: read with the one reader's rules, checked before judged.

``ampgraph ranges --model-dir`` reads the folder's safetensors shards. Every hostile shard here is
built by the test itself (never a committed binary): headers that lie about their length, are not
JSON, name unknown dtypes, put tensors past the end or on top of each other; files that are not
regular (a FIFO, ``/dev/zero``, a folder, a dangling link, a loop); tensors of another dtype,
shape, or present twice; weights holding NaN or inf. Each is one ``Error:`` line naming the file
and what is wrong, never a traceback or a hang; a lossless widening (a bf16 checkpoint for fp32
parameters) is read and said; non-finite weights fail every gate alike.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import save_file
from torch import nn

from ampgraph.cli import main
from ampgraph.errors import FileReadError, ModelSpecError
from ampgraph.ranges.checkpoint import INDEX, load_safetensors
from ampgraph.ranges.data import RangesError
from ampgraph.ranges.shards import DTYPES, Shard, safetensors_dtype

from .factories import write_index, write_shards
from .test_data_files import one_error_line

#: A one-layer Llama small enough to build, run and judge in a second or two.
CONFIG = {
    "model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "max_position_embeddings": 32, "architectures": ["LlamaForCausalLM"],
    "tie_word_embeddings": False,
}  # fmt: skip
RANGES = ["ranges", "--device", "cpu", "--amp-dtype", "fp16", "-s", "amp-fp32", "--seq-len", "4"]


def raw(header: bytes | dict[str, Any], data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file as bytes: the u64 header length (``length`` may lie), header, data."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


#: id -> (the file's bytes, what the one line says is wrong).
HOSTILE_HEADERS: dict[str, tuple[bytes, str]] = {
    "length 2**63": (raw(b"{}", length=2**63), "header length is 9223372036854775808 bytes"),
    "header longer than the file": (raw(b"{}", length=1000), "only 2 follow it"),
    "empty header": (raw(b""), "its header is not JSON"),
    "not JSON": (raw(b"not json at all"), "its header is not JSON"),
    "not UTF-8": (raw(b'{"\xff": 1}'), "its header is not JSON"),
    "a list": (raw(b"[1, 2]"), "its header is JSON list, not an object"),
    "shorter than 8 bytes": (b"\x02\x00", "it is 2 bytes, less than the 8"),
    "negative offset": (raw({"w": entry("F32", [1], -4, 0)}, b"\0" * 4), "data_offsets [-4, 0]"),
    "offsets reversed": (raw({"w": entry("F32", [1], 4, 0)}, b"\0" * 4), "data_offsets [4, 0]"),
    "past the end": (raw({"w": entry("F32", [2], 0, 8)}, b"\0" * 4), "past its end (4 bytes)"),
    "overlapping": (
        raw({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12),
        "the bytes of 'b' (4 to 12) overlap those of 'a' (0 to 8)",
    ),
    "shape product overflows": (
        raw({"w": entry("F32", [2**40, 2**40, 2**40], 0, 4)}, b"\0" * 4),
        "holds 1,329,227,995,784,915,872,903,807,060,280,344,576 F32 values",
    ),
    "negative size": (raw({"w": entry("F32", [-1], 0, 4)}, b"\0" * 4), "not a list of sizes"),
    "unknown dtype": (raw({"w": entry("F3", [1], 0, 4)}, b"\0" * 4), "the dtype 'F3'"),
    "entry not an object": (raw({"w": [1, 2]}), "the header's entry 'w' is list"),
    "a name twice": (
        raw(b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
            b'"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"),
        "the name 'w' is there twice",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_a_hostile_header_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    from safetensors import safe_open

    data, says = HOSTILE_HEADERS[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    with pytest.raises(FileReadError) as caught:
        load_safetensors(nn.Linear(1, 1), tmp_path)
    message = str(caught.value)
    assert message.startswith(f"cannot read the safetensors file {path}: ") and says in message
    assert "\n" not in message
    if case == "a name twice":
        return  # safetensors keeps the last of the two: ampgraph will not guess which is meant
    # Each other is a file safetensors itself refuses too, in its own words.
    with pytest.raises(BaseException):  # noqa: B017, PT011 - safetensors' own errors vary
        with safe_open(str(path), framework="pt") as f:
            [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118


def test_the_reader_reads_what_safetensors_writes_in_every_dtype(tmp_path: Path) -> None:
    """Every dtype of the table, written by safetensors itself, read back bit for bit."""
    tensors = {}
    for name, torch_name in DTYPES.items():
        dtype = getattr(torch, torch_name, None)
        if dtype is None:
            continue
        try:
            tensors[name] = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
            save_file({"x": tensors[name]}, str(tmp_path / "probe.safetensors"))
        except (KeyError, RuntimeError, TypeError, ValueError):  # safetensors cannot write it
            tensors.pop(name)
    tensors["empty"] = torch.empty(0, 3)
    save_file(tensors, str(tmp_path / "all.safetensors"))
    assert {"F32", "BF16", "F16", "I8", "BOOL", "F8_E4M3", "C64"} <= set(tensors)
    with Shard(tmp_path / "all.safetensors") as shard:
        for name, want in tensors.items():
            got = shard.read(name)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
            if name != "empty":
                assert safetensors_dtype(shard.entries[name].dtype) == want.dtype


def _not_regular(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "model.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "gone.safetensors")
    elif kind == "link loop":
        path.symlink_to(tmp_path / "other.safetensors")
        (tmp_path / "other.safetensors").symlink_to(path)
    return path


NOT_REGULAR = {
    "fifo": "it is a FIFO (a named pipe), not a regular file",
    "dev-zero": "it is a character device, not a regular file",
    "folder": "it is a folder, not a regular file",
    "dangling link": "it is a symbolic link to",
    "link loop": os.strerror(errno.ELOOP),
}


@pytest.mark.parametrize("kind", list(NOT_REGULAR))
def test_a_shard_that_is_not_a_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = _not_regular(tmp_path, kind)
    caught: list[BaseException] = []

    def load() -> None:
        try:
            load_safetensors(nn.Linear(1, 1), tmp_path)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            caught.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), f"reading a {kind} blocked"
    (exc,) = caught
    assert isinstance(exc, FileReadError)
    assert str(exc).startswith(f"cannot read the safetensors file {path}: {NOT_REGULAR[kind]}")


# -- what the tensors are -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [torch.int8, torch.uint8, torch.bool, torch.int64, torch.complex64, torch.float8_e4m3fn,
     torch.float64],
)  # fmt: skip
def test_a_tensor_of_another_dtype_is_refused_with_its_name(tmp_path: Path, dtype: Any) -> None:
    lin = nn.Linear(2, 2)
    weight = torch.full((2, 2), 1e300, dtype=torch.float64).to(dtype)
    save_file({"weight": weight, "bias": torch.zeros(2)}, str(tmp_path / "m.safetensors"))
    before = lin.weight.detach().clone()
    with pytest.raises(RangesError) as caught:
        load_safetensors(lin, tmp_path)
    short = str(dtype).removeprefix("torch.")
    assert str(caught.value).startswith(
        f"m.safetensors: weight is {short}, but the model's weight is float32: "
    )
    assert torch.equal(lin.weight, before)  # nothing was copied before the refusal


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_checkpoint_is_widened_exactly_and_said(tmp_path: Path, dtype: Any) -> None:
    lin = nn.Linear(4, 4)
    weight = (torch.randn(4, 4) * 100).to(dtype)
    save_file({"weight": weight}, str(tmp_path / "m.safetensors"))
    got = load_safetensors(lin, tmp_path)
    assert got.widened == {str(dtype).removeprefix("torch."): 1} and got.loaded == ["weight"]
    assert lin.weight.dtype == torch.float32 and torch.equal(lin.weight.to(dtype), weight)
    assert torch.equal(lin.weight, weight.float())


def test_a_narrower_float_for_a_wider_parameter_is_refused_as_a_narrowing(tmp_path: Path) -> None:
    lin = nn.Linear(2, 2).to(torch.bfloat16)
    save_file({"weight": torch.ones(2, 2, dtype=torch.float16)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(RangesError, match="float16 does not fit bfloat16 exactly"):
        load_safetensors(lin, tmp_path)


def test_a_tensor_in_two_shards_or_under_two_names_is_refused(tmp_path: Path) -> None:
    class Wrapped(nn.Module):
        base_model_prefix = "model"

        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Linear(2, 2)

    save_file({"model.weight": torch.ones(2, 2)}, str(tmp_path / "a.safetensors"))
    save_file({"model.weight": torch.zeros(2, 2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(RangesError, match=r"^b.safetensors: model.weight is the model's "
                       r"model.weight, which a.safetensors holds already \(as model.weight\)"):
        load_safetensors(Wrapped(), tmp_path)
    (tmp_path / "b.safetensors").unlink()
    save_file({"model.weight": torch.ones(2, 2), "weight": torch.ones(2, 2)},
              str(tmp_path / "a.safetensors"))  # fmt: skip
    with pytest.raises(RangesError, match="one tensor twice in the checkpoint"):
        load_safetensors(Wrapped(), tmp_path)


def test_tied_weights_stored_twice_must_agree(tmp_path: Path) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(4, 2)
            self.head = nn.Linear(2, 4, bias=False)
            self.head.weight = self.embed.weight

    same = torch.randn(4, 2)
    save_file({"embed.weight": same, "head.weight": same.clone()}, str(tmp_path / "m.safetensors"))
    tied = Tied()
    assert load_safetensors(tied, tmp_path).loaded == ["embed.weight", "head.weight"]
    assert torch.equal(tied.head.weight, same)
    save_file({"embed.weight": same, "head.weight": same + 1}, str(tmp_path / "m.safetensors"))
    with pytest.raises(RangesError, match="one tied tensor of the model"):
        load_safetensors(Tied(), tmp_path)


def test_a_shape_that_is_not_the_models_is_refused(tmp_path: Path) -> None:
    save_file({"weight": torch.ones(3, 2)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(RangesError, match=r"weight has shape \[3, 2\] but the model's weight is"):
        load_safetensors(nn.Linear(2, 2), tmp_path)


# -- the index of a sharded checkpoint ----------------------------------------------------------


def _sharded(folder: Path, lin: nn.Linear) -> dict[str, str]:
    tensors = [("weight", lin.weight.detach()), ("bias", lin.bias.detach())]
    weight_map = write_shards(folder, tensors, count=2)
    write_index(folder, weight_map)
    return weight_map


def test_an_index_names_the_shards_read(tmp_path: Path) -> None:
    source = nn.Linear(3, 3)
    _sharded(tmp_path, source)
    save_file({"weight": torch.zeros(3, 3)}, str(tmp_path / "stray.safetensors"))  # not indexed
    target = nn.Linear(3, 3)
    got = load_safetensors(target, tmp_path)
    assert sorted(got.loaded) == ["bias", "weight"] and len(got.files) == 2
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("missing", "cannot read the shard named by model.safetensors.index.json {folder}/"
                    "model-00002-of-00002.safetensors: there is no such file"),
        ("outside", "{folder}/model.safetensors.index.json: the shard '../x.safetensors' is not "
                    "a file name in {folder}"),
        ("moved", "model-00001-of-00002.safetensors: holds weight, which "
                  "model.safetensors.index.json puts in model-00002-of-00002.safetensors"),
        ("absent", "model.safetensors.index.json puts extra in model-00001-of-00002.safetensors, "
                   "which does not hold it"),
        ("not json", "{folder}/model.safetensors.index.json: not JSON"),
    ],
)  # fmt: skip
def test_a_damaged_index_is_one_line(tmp_path: Path, damage: str, says: str) -> None:
    weight_map = _sharded(tmp_path, nn.Linear(3, 3))
    if damage == "missing":
        (tmp_path / "model-00002-of-00002.safetensors").unlink()
    elif damage == "outside":
        weight_map["bias"] = "../x.safetensors"
    elif damage == "moved":  # both shards still named, each holding the other's tensor
        weight_map["weight"], weight_map["bias"] = weight_map["bias"], weight_map["weight"]
    elif damage == "absent":
        weight_map["extra"] = "model-00001-of-00002.safetensors"
    if damage == "not json":
        (tmp_path / INDEX).write_text("{")
    else:
        (tmp_path / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises((RangesError, FileReadError)) as caught:
        load_safetensors(nn.Linear(3, 3), tmp_path)
    assert str(caught.value).startswith(says.format(folder=tmp_path)), str(caught.value)


# -- through the command ------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A model folder: config.json and no weights yet."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_command_says_a_hostile_shard_in_one_line(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(raw(b"{}", length=2**63))
    line = one_error_line(invoke(*RANGES, "--model-dir", folder), 1)
    assert line.startswith(f"Error: cannot read the safetensors file {folder}/model.safetensors: ")
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")  # read at once, not at --timeout
    line = one_error_line(invoke(*RANGES, "--model-dir", folder), 1)
    assert "it is a FIFO (a named pipe), not a regular file" in line
    (folder / "model.safetensors").unlink()
    save_file({"lm_head.weight": torch.ones(64, 16, dtype=torch.int8)},
              str(folder / "model.safetensors"))  # fmt: skip
    line = one_error_line(invoke(*RANGES, "--model-dir", folder), 1)
    assert line.startswith("Error: model.safetensors: lm_head.weight is int8, but the model's ")


def test_a_bf16_checkpoint_is_judged_and_the_weights_line_says_so(folder: Path) -> None:
    from ampgraph.model.build import load_model
    from ampgraph.ranges.weights import real_state

    state, _ = real_state(load_model(str(folder), seq_len=4).module, seed=3)
    params = {k: v.to(torch.bfloat16) for k, v in state.items() if "rotary" not in k}
    save_file(params, str(folder / "model.safetensors"))
    out = invoke(*RANGES, "--model-dir", folder, "--format", "json")
    assert out.exit_code == 0, out.output
    weights = json.loads(out.output)["weights"]
    assert weights == (
        f"{len(params)} tensors from 1 safetensors file ({len(params)} bfloat16 widened to fp32 "
        "exactly); computed by the model's code: model.rotary_emb.inv_freq, "
        "model.rotary_emb.original_inv_freq"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_fail_every_gate_alike(folder: Path, bad: float) -> None:
    save_file({"model.norm.weight": torch.full((16,), bad)}, str(folder / "model.safetensors"))
    args = [*RANGES, "--model-dir", str(folder)]
    text = invoke(*args)
    assert text.exit_code == 0, text.output
    assert "amp-fp32 NONFINITE" in text.output
    assert "the parameter model.norm.weight (p_model_norm_weight) holds" in text.output
    failed = invoke(*args, "--fail-on", "error")
    assert one_error_line(failed, 1).startswith(
        "Error: the fp32 run itself is not finite: the parameter model.norm.weight"
    )
    saved = json.loads(invoke(*args, "--format", "json").output)
    assert saved["settings"][0]["ok"] is False
    assert saved["settings"][0]["first"]["kind"] == "reference-nonfinite"
    (folder / "ranges.json").write_text(json.dumps(saved))
    report = invoke("table", "--model-dir", folder, "--device", "cpu", "--amp-dtype", "fp16",
                    "-s", "amp-fp32", "--seq-len", "4", "--format", "json")  # fmt: skip
    (folder / "report.json").write_text(report.output)
    audit = invoke("audit", "--report", folder / "report.json", "--ranges",
                   folder / "ranges.json", "--fail-on", "error")  # fmt: skip
    assert audit.exit_code == 1 and "range-reference-nonfinite" in audit.output, audit.output


def test_every_kind_that_fails_audit_fails_ranges() -> None:
    """The two severity tables agree on what is an error: the gates fail on the same findings."""
    from ampgraph.ranges.data import KINDS
    from ampgraph.review.audit_ranges import SEVERITY

    assert {k for k, (s, _) in KINDS.items() if s == "error"} == {
        k for k, (s, _) in SEVERITY.items() if s == "error"
    }


def test_a_config_that_cannot_be_read_is_one_line(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permissions: root (CI) reads every file, so the refusal the kernel gives another user is
    made here (the reader's own ``os.open`` and ``os.stat`` raise it for config.json)."""
    real_open, real_stat = os.open, os.stat
    config = str(folder / "config.json")

    def denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == config:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), config)
        return (real_open if denied.which == "open" else real_stat)(path, *args, **kwargs)

    denied.which = "open"  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "open", denied)
    line = one_error_line(invoke(*RANGES, "--model-dir", folder), 1)
    assert line == f"Error: cannot read the config {config}: Permission denied; check the path " \
        "and its permissions"  # fmt: skip
    monkeypatch.setattr(os, "open", real_open)
    denied.which = "stat"  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(ModelSpecError, match=f"^cannot look at {re.escape(repr(config))}: "
                       "Permission denied; check the path and its permissions$"):
        from ampgraph.model.specs import resolve_config

        resolve_config(str(folder))
