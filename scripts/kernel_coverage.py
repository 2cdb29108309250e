#!/usr/bin/env python
"""Which ATen kernels have no bf16 or fp16 kernel on the CPU and on CUDA, from torch's OpInfo
database, proven on the CPU against the real kernels; written as a table ampgraph reads.

An OpInfo lists the dtypes an op supports per device (``op.supported_dtypes("cuda")``), but an
OpInfo is a Python-level op (``torch.pdist``) and ampgraph's strict mode sees the ATen overloads
a call dispatches (``aten._pdist_forward.default``). So each OpInfo's first fp32 samples are run on
fake tensors of the device under a dispatch mode that records the overloads they reach, and an
overload is marked as lacking a 16-bit dtype on a device only where

* some OpInfo that reaches it lists fp32 and not that dtype for the device, and
* no OpInfo that reaches it lists that dtype for the device (an overload shared with ops that do
  support it, ``view`` or ``mul``, is never blamed).

On the CPU each entry is then proven: the overload is called for real with the recorded
arguments, once in fp32 (it must run) and once with its floating tensors in the 16-bit dtype (it
must raise); the real kernel's first error line is the table's message. A pointwise op
(``Tag.pointwise``) computes in its ``TensorIterator``'s common dtype and is written so
(``"dispatch": "promoted"``), whatever its mixed call showed (an fp32 zero-dimensional tensor
beside a bf16 one leaves that dtype bf16). An entry the real kernel runs is dropped, and listed.
CUDA entries cannot be proven here: their message is the one a GPU showed where one did
(:data:`CUDA_WORDING`), else a message that names OpInfo as the source.

    .venv/bin/python scripts/kernel_coverage.py      # -> src/ampgraph/policy/kernel_coverage.json
    .venv/bin/python scripts/kernel_coverage.py --out /tmp/t.json -o nn.functional.pdist
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import signal
import sys
import time
import types
import unittest
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from fake_kernel_survey import _time_limit, _Timeout, load_op_db  # noqa: E402

F32, LOW = torch.float32, (torch.bfloat16, torch.float16)
DEVICES = ("cpu", "cuda")
NAMES = {torch.bfloat16: "BFloat16", torch.float16: "Half"}
OUT = ROOT / "src" / "ampgraph" / "policy" / "kernel_coverage.json"

#: The wording of CUDA kernels: what a real GPU showed (issue 33, ``shared/gpu-record-2026-11-26``)
#: or their source prints: overload -> message template (``{dtype}``: the c10 name, ``BFloat16``).
CUDA_WORDING = {
    "aten::_pdist_forward": "\"pdist_cuda\" not implemented for '{dtype}'",
    # AT_DISPATCH_FLOATING_TYPES(x1.scalar_type(), "cdist_cuda", ...) in cuda/DistanceKernel.cu,
    # the file of pdist_cuda's dispatch (the wording the H200 showed for pdist).
    "aten::_cdist_forward": "\"cdist_cuda\" not implemented for '{dtype}'",
}


class Reached(TorchDispatchMode):
    """Records each overload a call dispatches, with the first arguments it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any], int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        # The call with the most elements: a tiny sample (one row for ``pdist``) may return
        # before the kernel dispatches on its dtype.
        try:
            size = sum(int(t.numel()) for t in pytree.tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor))  # fmt: skip
        except Exception:  # noqa: BLE001 - a data-dependent size: a call nobody can rebuild
            size = -1
        name = func.name()
        if name not in self.calls or size > self.calls[name][3]:
            self.calls[name] = (func, args, kwargs or {}, size)
        return func(*args, **(kwargs or {}))


def _fake_values(values: list[Any], mode: Any, device: str) -> list[Any]:
    return [
        torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
        if isinstance(v, torch.Tensor) else v
        for v in values
    ]  # fmt: skip


def reached(opinfo: Any, device: str, samples: int = 4) -> dict[str, Any]:
    """Overload name -> (overload, fake args, kwargs) for the OpInfo's first fp32 samples."""
    from ampgraph.torchutil import fake_mode

    found: dict[str, Any] = {}
    try:
        sample_iter = iter(opinfo.sample_inputs("cpu", F32))
        for _ in range(samples):
            sample = next(sample_iter, None)
            if sample is None:
                break
            leaves, spec = pytree.tree_flatten(
                (sample.input, tuple(sample.args), dict(sample.kwargs))
            )
            with contextlib.ExitStack() as stack, _time_limit(5.0):
                mode = stack.enter_context(fake_mode())
                inp, args, kwargs = pytree.tree_unflatten(_fake_values(leaves, mode, device), spec)
                log = stack.enter_context(Reached())
                with contextlib.suppress(Exception):
                    opinfo.op(inp, *args, **kwargs)
            for name, call in log.calls.items():
                if name not in found or call[3] > found[name][3]:
                    found[name] = call
    except (Exception, _Timeout):  # noqa: BLE001 - an OpInfo whose samples do not build here
        pass
    return found


def _real(value: Any, dtype: torch.dtype) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():
        return torch.randn(value.shape).abs().add(0.5).to(dtype)
    if value.dtype == torch.bool:
        return torch.ones(value.shape, dtype=torch.bool)
    return torch.zeros(value.shape, dtype=value.dtype)


class Unencodable(Exception):
    """An argument the table cannot write down as a Python literal."""


def encode(value: Any) -> Any:
    """An argument as a literal the suite rebuilds (``tests/test_device_kernels.py``): a tensor
    as ``{"tensor": shape, "dtype": name}``, a dtype as ``{"dtype": name}``."""
    if isinstance(value, torch.Tensor):
        try:
            shape = [int(s) for s in value.shape]
        except Exception as exc:  # noqa: BLE001 - a data-dependent size
            raise Unencodable("a data-dependent size") from exc
        return {"tensor": shape, "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise Unencodable(repr(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise Unencodable(type(value).__name__)


class Crashed(Exception):
    """The real call took the process down (a signal) or never returned."""


def isolated(fn: Callable[[], str | None], seconds: float = 20.0) -> str | None:
    """``fn()`` (an error line or None) run in a forked child: the recorded arguments are random
    values, and some releases' kernels do not check them before LAPACK reads them (torch 2.10 to
    2.12's ``linalg_ldl_solve`` with zero pivots aborts with ``double free`` or a segfault, where
    2.13 raises). A child that dies or hangs raises :class:`Crashed`; the survey goes on."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the result, leave without running Python's exit hooks
        os.close(read)
        try:
            os.write(write, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], seconds)
    data = b""
    while ready:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not data or not os.WIFEXITED(status):
        raise Crashed(f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no result")
    result: str | None = json.loads(data)
    return result


def prove_cpu(call: Any, dtype: torch.dtype) -> tuple[bool, str, str]:
    """Run the overload for real: (True, its error, how it dispatches) where fp32 runs and
    ``dtype`` raises. How it dispatches: ``"first"`` where the first floating tensor in ``dtype``
    beside fp32 ones raises the same error, ``"common"`` otherwise (a kernel that computes in
    the common dtype, or a mixing check that comes first: not this table's business)."""
    op, args, kwargs, _size = call

    def run(d: torch.dtype, first_only: bool = False) -> str | None:
        torch.manual_seed(0)
        state = {"first": True}

        def make(v: Any) -> Any:
            if first_only and isinstance(v, torch.Tensor) and v.is_floating_point():
                want, state["first"] = (d if state["first"] else F32), False
                return _real(v, want)
            return _real(v, F32 if first_only else d)

        real_args, real_kwargs = pytree.tree_map(make, (args, kwargs))
        try:
            with _time_limit(5.0):
                op(*real_args, **real_kwargs)
        except (Exception, _Timeout) as exc:  # noqa: BLE001 - the error is the finding
            return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None

    try:
        if isolated(lambda: run(F32)) is not None:
            return False, "the fp32 call raises too", ""
        error = isolated(lambda: run(dtype))
        if error is None:
            return False, "the real kernel runs", ""
        first = isolated(lambda: run(dtype, first_only=True)) == error
    except Crashed as exc:
        return False, f"the real call crashes the process ({exc})", ""
    return True, error, "first" if first else "common"


def as_sm90() -> None:
    """OpInfo's CUDA dtypes depend on the GPU (``SM53OrLater`` adds fp16 to the FFTs,
    ``SM80OrLater`` bf16 to others), read through ``torch.cuda``, which says "no GPU" here: the
    lists are taken as on an sm_90 GPU (the H200 of ``shared/gpu-record-2026-11-26``)."""
    if "expecttest" not in sys.modules:  # as load_op_db: common_utils imports it for a base class
        try:
            import expecttest  # noqa: F401
        except ImportError:
            sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase)  # type: ignore[assignment]
    from torch.testing._internal import common_cuda

    for cc in (53, 60, 70, 75, 80, 89, 90):
        setattr(common_cuda, f"SM{cc}OrLater", True)
    for cc in (100, 120):
        setattr(common_cuda, f"SM{cc}OrLater", False)
    common_cuda.PLATFORM_SUPPORTS_BF16 = True


def survey(only: list[str]) -> tuple[dict[str, Any], list[str]]:
    as_sm90()  # before op_db is imported: its modules copy these names
    ops = [o for o in load_op_db() if not only or o.name in only]
    lacking: dict[tuple[str, Any], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    having: dict[tuple[str, Any], set[str]] = defaultdict(set)
    calls: dict[str, Any] = {}
    for opinfo in ops:
        label = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
        for device in DEVICES:
            supported = opinfo.supported_dtypes(device)
            if F32 not in supported:
                continue
            found = reached(opinfo, device)
            for name, call in found.items():
                key = f"{device}:{name}"
                if key not in calls or call[3] > calls[key][3]:
                    calls[key] = call
                for dtype in LOW:
                    if dtype in supported:
                        having[(device, dtype)].add(name)
                    else:
                        lacking[(device, dtype)][name].append((label, opinfo.aten_name))
    table: dict[str, dict[str, dict[str, Any]]] = {d: {} for d in DEVICES}
    dropped: list[str] = []
    for (device, dtype), names in sorted(lacking.items(), key=str):
        for name, found_by in sorted(names.items()):
            labels = [label for label, _aten in found_by]
            if name in having[(device, dtype)] or not name.startswith("aten::"):
                continue
            call = calls[f"{device}:{name}"]
            if not any(isinstance(v, torch.Tensor) and v.is_floating_point()
                       for v in pytree.tree_leaves((call[1], call[2]))):  # fmt: skip
                continue  # factories (signal windows): no tensor whose dtype the kernel reads
            entry_call = None
            if device == "cpu":
                try:
                    entry_call = encode([list(call[1]), call[2]])
                except Unencodable as exc:
                    dropped.append(f"cpu {name} {NAMES[dtype]}: an argument ({exc}) the table "
                                   "cannot write down for the suite to prove")
                    continue
                proven, message, dispatch = prove_cpu(call, dtype)
                if not proven:
                    dropped.append(f"cpu {name} {NAMES[dtype]}: {message} ({', '.join(labels)})")
                    continue
                message = message.replace(NAMES[dtype], "{dtype}")
            else:
                base = name.partition(".")[0]
                # OpInfo's CUDA list is the evidence; the mapping to this overload must hold:
                # the OpInfo's own op, or the overload whose kernel the CPU proved lacks it.
                direct = base.removeprefix("aten::") in {aten for _l, aten in found_by}
                proven_cpu = str(dtype).removeprefix("torch.") in table["cpu"].get(
                    name, {}).get("dtypes", {})  # fmt: skip
                if not (direct or proven_cpu):
                    dropped.append(f"cuda {name} {NAMES[dtype]}: reached by {', '.join(labels)}, "
                                   "neither that OpInfo's own op nor proven on the CPU")
                    continue
                message = CUDA_WORDING.get(base) or (
                    f"{base} has no CUDA kernel for {{dtype}} (PyTorch's OpInfo database: "
                    f"{labels[0]})"
                )
            entry = table[device].setdefault(name, {"opinfo": sorted(set(labels)), "dtypes": {}})
            entry["dtypes"][str(dtype).removeprefix("torch.")] = message
            if entry_call is not None:
                entry["call"] = entry_call  # args and kwargs, for the suite to run for real
                entry["dispatch"] = dispatch
            elif name in table["cpu"]:  # CUDA: as the CPU's kernel of the op dispatches
                entry["dispatch"] = table["cpu"][name].get("dispatch", "first")
            if torch.Tag.pointwise in call[0].tags:  # a TensorIterator: its common dtype
                entry["dispatch"] = "promoted"
    return table, dropped


ABOUT = (
    "Generated by scripts/kernel_coverage.py; do not edit by hand. The ATen overloads with no "
    "bf16 or fp16 kernel on the CPU and on CUDA, per torch version (major.minor): PyTorch's "
    "OpInfo database, mapped to the overloads each OpInfo's samples reach, kept only where no "
    "OpInfo reaching the overload supports the dtype. CPU entries are proven against the real "
    "CPU kernels (their messages are the kernels' own; 'call' is the call the suite reruns; "
    "'dispatch' says whether the kernel switches on its first floating input or computes in "
    "the common dtype of its inputs, as the real kernel showed on a mixed call, or, 'promoted', "
    "is a pointwise op computing in its TensorIterator's common dtype); "
    "CUDA entries are OpInfo's word (as on an sm_90 GPU), kept where the overload is the "
    "OpInfo's own op or proven on the CPU, with the wording a real GPU showed where one did. "
    "Read by ampgraph.annotate.device_kernels."
)


def write(table: dict[str, Any], dropped: list[str], seconds: float, out: Path) -> None:
    """Add (or replace) this torch version's table in ``out``, keeping the other versions'."""
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    data = json.loads(out.read_text()) if out.exists() else {"tables": {}, "made": {}}
    data["about"] = ABOUT
    data["tables"][version] = table
    data["made"][version] = {
        "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "seconds": round(seconds), "dropped": dropped,
    }  # fmt: skip
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("-o", "--op", action="append", default=[], help="only these OpInfo names")
    options = parser.parse_args()
    torch.set_num_threads(1)
    start = time.monotonic()
    table, dropped = survey(options.op)
    write(table, dropped, time.monotonic() - start, options.out)
    counts = {d: len(v) for d, v in table.items()}
    print(f"{options.out}: {counts} overloads, {len(dropped)} OpInfo entries dropped")


if __name__ == "__main__":
    main()
