"""``ampgraph policy``: the autocast op reference, against the installed dispatcher itself."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph import policy as P
from ampgraph.cli import main
from ampgraph.docs import reference
from ampgraph.torchutil import autocast_state

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them


def dispatcher_ops(key: str) -> set[str]:
    """Every op the dispatcher has an op-specific kernel for on ``key``, read independently."""
    return {
        name
        for name in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    }


@pytest.fixture(scope="module")
def ref() -> reference.OpReference:
    return reference.op_reference()


def test_every_autocast_backend_of_the_build_is_listed(ref: reference.OpReference) -> None:
    keys = sorted(k for k in torch._C.DispatchKey.__members__ if k.startswith("Autocast"))
    keys = [k for k in keys if k != "Autocast"]
    assert sorted(d.key for d in ref.devices) == keys
    assert [d.device_type for d in ref.devices][:2] == ["cuda", "cpu"]


def test_each_device_lists_exactly_the_ops_with_a_kernel(ref: reference.OpReference) -> None:
    for d in ref.devices:
        assert {e.op for e in d.entries} == dispatcher_ops(d.key), d.device_type


def test_the_bundled_tables_match_the_installed_dispatcher(ref: reference.OpReference) -> None:
    assert ref.device("cuda").differences == [] and ref.device("cpu").differences == []
    assert not [e for e in ref.device("cuda").opaque + ref.device("cpu").opaque
                if e.op.startswith("aten::")]  # fmt: skip


def test_devices_without_tables_are_opaque_never_guessed(ref: reference.OpReference) -> None:
    for d in ref.devices:
        if not d.has_tables:
            assert all(e.category == P.OPAQUE for e in d.entries if e.op.startswith("aten::"))


def _tensor_op(name: str) -> tuple[torch._ops.OpOverload, int] | None:
    """The op and its number of tensor arguments, where every argument it requires is a Tensor
    (one or two of them) and it returns one tensor: callable with square matrices."""
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    required = [a for a in op._schema.arguments if not a.has_default_value() and not a.kwarg_only]
    if len(op._schema.returns) != 1 or not 1 <= len(required) <= 2:
        return None
    if any(str(a.type) != "Tensor" for a in required):
        return None
    return op, len(required)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_categories_are_what_the_real_kernels_do(
    ref: reference.OpReference, device_type: str
) -> None:
    """Every entry callable with square matrices, run through the real autocast kernel on fake
    tensors: lower precision turns fp32 into bf16, the fp32 categories turn bf16 into fp32."""
    expected = {P.LOWER_PRECISION_FP: (torch.float32, torch.bfloat16),
                P.FP32: (torch.bfloat16, torch.float32),
                P.FP32_SET_OPT_DTYPE: (torch.bfloat16, torch.float32)}  # fmt: skip
    tried = []
    with FakeTensorMode(), autocast_state(device_type, True, torch.bfloat16):
        for e in ref.device(device_type).entries:
            found = _tensor_op(e.op) if e.category in expected else None
            if found is None:
                continue
            op, count = found
            given, wanted = expected[e.category]
            shape = (4, 2) if "view_as_complex" in e.op else (4, 4)
            try:
                out = op(*(torch.empty(shape, dtype=given, device=device_type)
                           for _ in range(count)))  # fmt: skip
            except Exception:  # noqa: BLE001, S112 - wants other shapes or dtypes (bmm: 3-d, losses)
                continue
            out = out.real if out.is_complex() else out
            if not out.is_floating_point():
                continue  # an integer result (matrix_rank) says nothing of the cast
            assert out.dtype == wanted, e.op
            tried.append(e.op.removeprefix("aten::"))
    must = {"mm", "prod", "sum", "exp"} if device_type == "cuda" else {"mm", "prod", "inverse"}
    assert must <= set(tried) and len(tried) >= (25 if device_type == "cuda" else 8)


def _tables_without(device_type: str, entry: str, extra: str) -> dict:
    tables = {d: dict(t) for d, t in P.ACTIVE_TABLES.items()}
    table = tables[device_type]
    for category, entries in table.items():
        table[category] = tuple(e for e in entries if e != entry)
    table[P.FP32] = (*table[P.FP32], extra)
    return tables


def test_a_table_that_drifted_is_reported_and_the_command_fails(monkeypatch) -> None:
    monkeypatch.setattr(P, "ACTIVE_TABLES", _tables_without("cuda", "linear", "frobnicate"))
    ref = reference.op_reference(["cuda"])
    kinds = {(x.op, x.kind) for x in ref.device("cuda").differences}
    assert kinds == {("aten::linear", "missing from the tables"),
                     ("aten::frobnicate", "no kernel registered")}  # fmt: skip
    assert ref.device("cuda").entry("linear").category == P.OPAQUE
    result = CliRunner().invoke(main, ["policy", "--device", "cuda"])
    assert result.exit_code == 1
    assert "difference: aten::linear: missing from the tables" in result.output
    assert result.output.strip().endswith(
        "Error: 2 differences between ampgraph's tables and this torch's dispatcher"
    )


def test_library_kernels_and_register_autocast_are_recognised() -> None:
    pytest.importorskip("torchvision")

    @torch.library.custom_op("ampgraph_ref::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch.library.register_autocast("ampgraph_ref::twice", "cuda", torch.float16)
    lib = torch.library.Library("ampgraph_ref2", "DEF")  # noqa: TOR901
    lib.define("raw(Tensor x) -> Tensor")
    lib.impl("raw", lambda x: x, "AutocastCPU")
    ref = reference.op_reference(["cuda", "cpu"])
    cuda, cpu = ref.device("cuda"), ref.device("cpu")
    entry = cuda.entry("ampgraph_ref::twice")
    assert (entry.category, entry.cast_to) == (P.CAST_INPUTS, "float16")
    assert cpu.entry("ampgraph_ref2::raw").category == P.OPAQUE
    assert "ampgraph_ref2::raw" in [e.op for e in cpu.opaque]
    assert cuda.entry("torchvision::roi_pool").category == P.FP32_OUTPUT_AS_INPUT
    with pytest.raises(KeyError):
        cpu.entry("torchvision::roi_pool")  # torchvision registers roi_pool for CUDA alone
    assert cpu.entry("torchvision::nms").category == P.FP32


def test_cli_formats() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["policy", "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "ampgraph.policy" and [d["device_type"] for d in data["devices"]] == [
        "cpu"
    ]
    back = reference.OpReference.from_dict(data)
    assert back.device("cpu").entry("cat").category == P.PROMOTE
    markdown = runner.invoke(main, ["policy", "--device", "cuda", "--format", "markdown"]).output
    assert "| `layer_norm` | fp32 | ATen (autocast_mode.cpp) |" in markdown


def test_since_lists_the_history() -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["policy", "--since", P.HISTORY_FROM]).output.splitlines()
    assert out[1:] == [f"  {r} {d} {P.CATEGORY_LABEL[c]}: {op} {ch}"
                       for r, d, c, op, ch in P.TABLE_HISTORY]  # fmt: skip
    after_213 = runner.invoke(main, ["policy", "--since", "2.13"]).output.splitlines()[1:]
    assert after_213 == [line for line in out[1:] if line.startswith("  2.14 ")]
    assert runner.invoke(main, ["policy", "--since", "2.14"]).output.splitlines()[1:] == ["  none"]
    older = json.loads(runner.invoke(main, ["policy", "--since", "2.5", "--format", "json"]).output)
    assert older["complete"] is False and len(older["changes"]) == len(P.TABLE_HISTORY)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "'tpu' has no autocast dispatch key in this torch"),
        (["--since", "two"], "'two' is not a torch release"),
        (["--since", "2.13", "--device", "cpu"], "--since lists table changes"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["policy", *args])
    assert result.exit_code == 2 and message in result.output


def test_a_library_that_is_not_installed_is_one_line() -> None:
    result = CliRunner().invoke(main, ["policy", "--import", "no_such_library_xyz"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: cannot import 'no_such_library_xyz' to read its autocast kernels: is it installed?"
    )


def test_the_committed_reference_is_this_builds() -> None:
    """docs/autocast-ops.md is what `ampgraph policy --format markdown` prints for the torch it
    names: it said "no mps tables" for a release after ampgraph had them. In a fresh process:
    the ops other tests register would be listed too."""
    import subprocess
    import sys
    from pathlib import Path

    committed = (Path(__file__).parents[1] / "docs" / "autocast-ops.md").read_text()
    command = [sys.executable, "-m", "ampgraph", "policy", "--format", "markdown"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    header = printed.splitlines()[2]  # "Read from the dispatcher of torch <version>, ..."
    if header != committed.splitlines()[2]:
        pytest.skip(f"the committed page is for another build: {committed.splitlines()[2]}")
    assert printed.rstrip("\n") == committed.rstrip("\n")
