"""The policy tables against the installed dispatcher.

The tables are transcribed data; these tests prove them for the torch that is installed: every op
that has an autocast kernel is in the table and nothing else is, and ops that take one tensor
behave as their category says when the real autocast kernels run on fake tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph import policy as P
from ampgraph.torchutil import autocast_state

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

DISPATCH_KEY = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}


def dispatcher_entries(device_type: str) -> set[str]:
    """``op[.overload]`` of every aten op with a kernel on the device's autocast key."""
    found = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(
            name, DISPATCH_KEY[device_type]
        ):
            op, _, overload = name.partition(".")
            found.add(P.entry_name(op, overload))
    return found


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_tables_cover_exactly_the_dispatchers_autocast_kernels(device_type: str) -> None:
    table = P.registered_entries(device_type)
    registered = dispatcher_entries(device_type)
    assert sorted(registered - table) == [], "ops with an autocast kernel missing from the table"
    assert sorted(table - registered) == [], "table entries the dispatcher has no kernel for"


def test_categories_do_not_overlap() -> None:
    for device_type, table in P.TABLES.items():
        seen: dict[str, str] = {}
        for category, entries in table.items():
            assert category in P.CATEGORIES
            for entry in entries:
                assert entry not in seen, (
                    f"{device_type} {entry} in {seen.get(entry)} and {category}"
                )
                seen[entry] = category


def unary_ops(device_type: str, category: str) -> list[str]:
    """Entries whose schema is ``(Tensor self) -> Tensor``: callable with one tensor."""
    out = []
    for entry in P.ACTIVE_TABLES[device_type][category]:
        packet, _, overload = entry.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        args = op._schema.arguments
        if len(args) == 1 and str(args[0].type) == "Tensor" and len(op._schema.returns) == 1:
            out.append(entry)
    return out


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_unary_fp32_ops_return_fp32(device_type: str) -> None:
    category, input_dtype, expected = P.FP32, torch.bfloat16, torch.float32
    ops = unary_ops(device_type, category)
    assert len(ops) >= 5  # CPU has six (trace, inverse, linalg_inv, ...), CUDA dozens
    with FakeTensorMode(), autocast_state(device_type, True, torch.bfloat16):
        for entry in ops:
            packet, _, overload = entry.partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            # view_as_complex wants a last dimension of 2; everything else a square matrix.
            shape = (4, 2) if entry == "view_as_complex" else (4, 4)
            out = op(torch.empty(shape, dtype=input_dtype, device=device_type))
            real = out.real.dtype if out.is_complex() else out.dtype
            assert real == expected, entry


def test_lookup_by_overload() -> None:
    assert P.lookup("cuda", "aten::softmax", "int") == P.FP32_SET_OPT_DTYPE
    # The named-dimension overloads left CUDA's lists in torch 2.13 (2.14 has no such overload):
    # as this torch registers it.
    try:
        named = torch._C._dispatch_has_kernel_for_dispatch_key(
            "aten::softmax.Dimname", "AutocastCUDA"
        )
    except RuntimeError:  # operator aten::softmax.Dimname does not exist
        named = False
    assert P.lookup("cuda", "aten::softmax", "Dimname") == (P.FP32_SET_OPT_DTYPE if named else None)
    assert P.lookup("cuda", "aten::linear", "") == P.LOWER_PRECISION_FP
    assert P.lookup("cpu", "aten::cat", "") == P.PROMOTE
    assert P.lookup("cuda", "aten::cat", "") is None
    assert P.lookup("cuda", "prims::mul", "") is None


RELEASE_DUMPS = sorted((Path(__file__).parent / "data" / "policy").glob("torch-*.json"))


@pytest.mark.parametrize("path", RELEASE_DUMPS, ids=lambda p: p.stem)
def test_history_reproduces_each_releases_dispatcher(path: Path) -> None:
    """``tables_for`` equals the lists dumped from that release's own dispatcher.

    The dumps are ``scripts/policy_history.py dump`` run under each torch, installed aside.
    """
    dump = json.loads(path.read_text())
    assert P._release(dump["torch"]) >= P._release(P.HISTORY_FROM)
    expected = {
        device: {category: sorted(entries) for category, entries in table.items() if entries}
        for device, table in dump["tables"].items()
    }
    got = {
        device: {category: sorted(entries) for category, entries in table.items() if entries}
        for device, table in P.tables_for(dump["torch"]).items()
    }
    assert got == expected


def test_history_reaches_back_to_the_oldest_dump() -> None:
    oldest = min((json.loads(p.read_text())["torch"] for p in RELEASE_DUMPS), key=P._release)
    assert P._release(oldest) == P._release(P.HISTORY_FROM)
