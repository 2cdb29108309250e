"""Every autocast device type: the xpu and mps lists against this build's dispatcher and its real
kernels, ``diff`` across devices and recipes, and the one-line errors for devices ampgraph cannot
analyse (issue 26)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import policy as P
from ampgraph.cli import main
from ampgraph.settings import DEVICE_TYPES, PLUGIN_DEVICE_TYPES
from ampgraph.torchutil import autocast_state, dtype_name

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

KEYS = {"xpu": "AutocastXPU", "mps": "AutocastMPS"}


def dispatcher_entries(key: str) -> set[str]:
    """``op[.overload]`` of every ATen op with a kernel on ``key``, read from the dispatcher."""
    found = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            op, _, overload = name.partition(".")
            found.add(P.entry_name(op, overload))
    return found


@pytest.mark.parametrize("device_type", ["xpu", "mps"])
def test_tables_cover_exactly_the_dispatchers_kernels(device_type: str) -> None:
    assert P.registered_entries(device_type) == dispatcher_entries(KEYS[device_type])
    seen: set[str] = set()
    for entries in P.ACTIVE_TABLES[device_type].values():
        assert not seen & set(entries)  # no entry in two categories
        seen |= set(entries)


def _square_op(entry: str) -> tuple[torch._ops.OpOverload, int] | None:
    packet, _, overload = entry.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")
    required = [a for a in op._schema.arguments if not a.has_default_value() and not a.kwarg_only]
    if len(op._schema.returns) != 1 or not 1 <= len(required) <= 2:
        return None
    if any(str(a.type) != "Tensor" for a in required):
        return None
    return op, len(required)


@pytest.mark.parametrize("device_type", ["xpu", "mps"])
def test_categories_are_what_the_real_kernels_do(device_type: str) -> None:
    """Each entry callable with square matrices, run through the device's real autocast kernel
    on fake tensors of that device: lower precision makes fp32 fp16, fp32 makes fp16 fp32."""
    expected = {P.LOWER_PRECISION_FP: (torch.float32, torch.float16),
                P.FP32: (torch.float16, torch.float32),
                P.FP32_SET_OPT_DTYPE: (torch.float16, torch.float32)}  # fmt: skip
    tried = []
    with FakeTensorMode(), autocast_state(device_type, True, torch.float16), torch.no_grad():
        for category, (given, wanted) in expected.items():
            for entry in P.ACTIVE_TABLES[device_type][category]:
                found = _square_op(entry)
                if found is None:
                    continue
                op, count = found
                try:
                    out = op(*(torch.empty(4, 4, dtype=given, device=device_type)
                               for _ in range(count)))  # fmt: skip
                except Exception:  # noqa: BLE001, S112 - wants other shapes (bmm: 3-d, losses)
                    continue
                if out.is_floating_point():
                    assert out.dtype == wanted, (device_type, entry)
                    tried.append(entry)
    assert {"mm", "exp", "sum"} <= set(tried) and len(tried) >= 20


class _Calls(TorchDispatchMode):
    """The ops autocast's kernel calls, below it: what it did to the call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, torch.dtype | None]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.calls.append((str(func), kwargs.get("dtype")))
        return func(*args, **kwargs)


@pytest.mark.parametrize("device_type", ["xpu", "mps"])
def test_sum_is_cast_on_mps_and_given_a_dtype_on_xpu(device_type: str) -> None:
    """MPS registers its reductions as fp32 (the input cast), XPU as CUDA does,
    fp32_set_opt_dtype (dtype=float32 added): the category in the table is the one that runs."""
    with FakeTensorMode(), autocast_state(device_type, True, torch.float16):
        x = torch.empty(4, 4, dtype=torch.float16, device=device_type)
        with _Calls() as calls:
            torch.sum(x)
    ops = [c for c in calls.calls if not c[0].startswith("prim.")]
    casts_first = ops[0] == ("aten._to_copy.default", torch.float32)
    assert casts_first == (P.lookup(device_type, "aten::sum", "") == P.FP32)
    if not casts_first:
        assert ops == [("aten.sum.default", torch.float32)]
        assert P.lookup(device_type, "aten::sum", "") == P.FP32_SET_OPT_DTYPE


def test_the_device_types_are_this_builds_autocast_keys() -> None:
    """Those ampgraph analyses have kernels in this build; the plugin ones have a key, none."""
    keys = P.autocast_device_types()
    assert set(DEVICE_TYPES) | set(PLUGIN_DEVICE_TYPES) == set(keys)
    for device_type in keys:
        assert bool(P.autocast_kernels(device_type)) == (device_type in DEVICE_TYPES)


def test_policy_names_where_each_devices_lists_come_from() -> None:
    result = CliRunner().invoke(main, ["policy", "--device", "mps", "--device", "xpu"])
    assert result.exit_code == 0, result.output
    for device_type in ("mps", "xpu"):
        line = next(x for x in result.output.splitlines() if x.startswith(f"{device_type} ("))
        assert f"{P.TABLE_SOURCES[device_type]}, torch {P.TABLE_TORCH_VERSION}" in line


SMALL = """
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.norm(self.lin(x))
        return torch.cat([torch.softmax(h, -1), torch.exp(h)], -1)


def build():
    return Small().eval(), torch.randn(2, 8)
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("devices") / "small.py"
    path.write_text(SMALL)
    return f"{path}:build"


def test_diff_across_devices_lists_the_ops_whose_kernels_differ(small: str) -> None:
    """cuda against cpu in one setting: the ops whose policy changes are exactly the graph's ops
    that have an autocast kernel on one device and not the other (where both have one, the
    category is the same one: tests/test_policy.py proves the tables against the dispatcher)."""
    args = ["--no-cache", "diff", "--module", small, "--device", "cuda", "--device", "cpu"]
    result = CliRunner().invoke(main, [*args, "-s", "amp-half", "--format", "json"])
    assert result.exit_code == 1, result.output
    diff = json.loads(result.output[result.output.index("{") :])
    changed = {c["op"] for c in diff["changes"]
               if any(f["field"] == "policy" for f in c["fields"])}  # fmt: skip
    ops = {c["op"] for c in diff["changes"]} | changed

    def kernel(device_type: str, op: str) -> bool:
        packet, _, overload = op.removeprefix("aten.").rpartition(".")
        name = f"aten::{packet}" + ("" if overload == "default" else f".{overload}")
        return P.has_autocast_kernel(device_type, name)

    graph_ops = {"aten.linear.default", "aten.layer_norm.default", "aten.softmax.int",
                 "aten.exp.default", "aten.cat.default"}  # fmt: skip
    assert graph_ops <= ops | {"aten.linear.default"}
    assert changed == {op for op in graph_ops if kernel("cuda", op) != kernel("cpu", op)}
    assert changed  # the module was chosen so that they differ


def test_diff_takes_two_recipes(small: str) -> None:
    """--recipe A --recipe B: each side in the setting its recipe runs, said on stderr."""
    result = CliRunner().invoke(
        main, ["--no-cache", "diff", "--module", small, "--recipe", "hf:bf16",
               "--recipe", "lightning:bf16-true", "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    diff = json.loads(result.output[result.output.index("{") :])
    from ampgraph.recipes import parse_recipe

    assert diff["a"]["setting"]["name"] == parse_recipe("hf:bf16").setting.name
    assert diff["b"]["setting"]["name"] == parse_recipe("lightning:bf16-true").setting.name
    both = CliRunner().invoke(
        main, ["diff", "--module", small, "--recipe", "hf:bf16", "-s", "fp32"]
    )
    assert both.exit_code == 2 and "not both" in both.output


@pytest.mark.parametrize("device_type", sorted(PLUGIN_DEVICE_TYPES))
def test_plugin_devices_are_one_line(device_type: str) -> None:
    result = CliRunner().invoke(main, ["check", "--device", device_type])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "out-of-tree" in result.output


def test_an_unknown_device_lists_those_that_exist() -> None:
    result = CliRunner().invoke(main, ["diff", "--device", "tpu", "--device", "cpu"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert all(d in result.output for d in (*DEVICE_TYPES, *PLUGIN_DEVICE_TYPES))


@pytest.mark.parametrize("device_type", ["xpu", "mps"])
def test_a_device_this_build_cannot_trace_is_one_line(device_type: str, small: str) -> None:
    """Fake xpu/mps tensors run their autocast kernels, but views need a device guard that a
    build without them lacks (it aborts the process): one line instead."""
    built = {"xpu": torch.xpu._is_compiled, "mps": torch.backends.mps.is_built}[device_type]
    if built():
        pytest.skip(f"this torch is built with {device_type}")
    with FakeTensorMode(), pytest.raises(RuntimeError, match="not linked"):
        torch.empty(2, 2, device=device_type)[0]
    for command in ("check", "verify"):  # a prediction cannot be checked; a run cannot be made
        result = CliRunner().invoke(
            main, ["--no-cache", command, "--module", small, "--device", device_type]
        )
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert f"built without {device_type}" in result.output


CONV = """
import torch
from torch import nn

class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.RMSNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = self.norm(self.bn(self.conv(x)).mean((2, 3)))
        return self.head(y).softmax(-1)

def build():
    return Conv().eval(), torch.randn(2, 3, 8, 8)
"""


def _kernel_dtype(op: str, dtypes: list[str], device_type: str) -> torch.dtype:
    """What ``op`` returns on fake ``device_type`` tensors of ``dtypes`` (the conv module's
    shapes) under that device's own autocast kernel, bf16: no view and no autograd, which a
    build without the device cannot make."""
    make = [lambda *s, i=i: torch.empty(*s, dtype=getattr(torch, dtypes[i]), device=device_type)
            for i in range(len(dtypes))]  # fmt: skip
    aten = torch.ops.aten
    calls = {
        "aten.conv2d.default": lambda: aten.conv2d(make[0](2, 3, 8, 8), make[1](8, 3, 3, 3),
                                                   make[2](8)),
        "aten.batch_norm.default": lambda: aten.batch_norm(
            make[0](2, 8, 6, 6), *(m(8) for m in make[1:5]), False, 0.1, 1e-5, True),
        "aten.mean.dim": lambda: aten.mean.dim(make[0](2, 8, 6, 6), [2, 3]),
        "aten.rms_norm.default": lambda: aten.rms_norm(make[0](2, 8), [8], make[1](8), None),
        "aten.linear.default": lambda: aten.linear(make[0](2, 8), make[1](4, 8), make[2](4)),
        "aten.softmax.int": lambda: aten.softmax.int(make[0](2, 4), -1),
    }  # fmt: skip
    with FakeTensorMode(), autocast_state(device_type, True, torch.bfloat16), torch.no_grad():
        return calls[op]().dtype


@pytest.mark.parametrize("device_type", ["xpu", "mps"])
def test_a_device_this_build_cannot_trace_is_predicted_from_its_lists(
    device_type: str, tmp_path: Any
) -> None:
    """Traced on CUDA, annotated with the device's own lists, said to be a prediction: and each
    op's predicted output is what the device's real autocast kernel returns for the predicted
    inputs (the kernels run on fake tensors of a build without the device, views do not)."""
    built = {"xpu": torch.xpu._is_compiled, "mps": torch.backends.mps.is_built}[device_type]
    if built():
        pytest.skip(f"this torch is built with {device_type}: it traces there itself")
    from ampgraph import Setting, analyze, load_model

    (tmp_path / "conv.py").write_text(CONV)
    model = load_model(f"{tmp_path / 'conv.py'}:build")
    report = analyze(model, Setting.parse("amp-fp32", device_type=device_type))
    assert report.setting["device_type"] == device_type
    assert report.check is None and f"prediction for {device_type}" in report.capture["stand_in"]
    assert report.capture["check_unavailable"] == report.capture["stand_in"]
    ops = [n for n in report.nodes if n.op in {
        "aten.conv2d.default", "aten.batch_norm.default", "aten.mean.dim",
        "aten.rms_norm.default", "aten.linear.default", "aten.softmax.int"}]  # fmt: skip
    assert len(ops) == 6
    for node in ops:
        inputs = [i["dtype"] for i in node.inputs if i.get("dtype")]
        kernel = dtype_name(_kernel_dtype(node.op, inputs, device_type))
        assert node.outputs[0] == kernel, (node.op, inputs, node.outputs)
    # MPS lists batch_norm in fp32 and softmax as a plain fp32 cast, where CUDA has neither.
    bn = next(n for n in ops if n.op == "aten.batch_norm.default")
    assert (bn.policy, bn.outputs[0]) == (
        (P.FP32, "float32") if device_type == "mps" else (None, "bfloat16")
    )


def test_diff_with_a_device_this_build_cannot_trace(small: str, tmp_path: Any) -> None:
    """cuda against mps: the ops whose policy changes are those the two lists put apart, and
    the mps side says it is a prediction."""
    if torch.backends.mps.is_built():
        pytest.skip("this torch is built with mps")
    (tmp_path / "conv.py").write_text(CONV)
    args = ["--no-cache", "diff", "--module", f"{tmp_path / 'conv.py'}:build"]
    result = CliRunner().invoke(main, [*args, "--device", "cuda", "--device", "mps",
                                       "--format", "json"])  # fmt: skip
    assert result.exit_code == 1, result.output
    diff = json.loads(result.output[result.output.index("{") :])
    changed = {c["op"] for c in diff["changes"]
               if any(f["field"] == "policy" for f in c["fields"])}  # fmt: skip
    assert changed == {"aten.batch_norm.default", "aten.softmax.int"}
    assert any(n.startswith("B is a prediction for mps") for n in diff["notes"])


def test_recipes_stay_on_cuda_and_cpu() -> None:
    result = CliRunner().invoke(main, ["check", "--recipe", "hf:bf16", "--device", "mps"])
    assert result.exit_code == 2 and "recipes are modelled on cuda and cpu" in result.output
