"""Dump one torch release's autocast lists, and turn two dumps into ``TABLE_HISTORY`` rows.

``ampgraph.policy.TABLE_HISTORY`` records how autocast's op lists changed between torch releases.
Each release is read from its OWN dispatcher: install it into a side directory and run ``dump``
with that directory first on ``PYTHONPATH`` (ampgraph itself is imported from ``src`` but never
imports torch at module level, so any torch works)::

    pip download --no-deps -d /tmp/tdl torch==2.12.0
    pip install --no-deps --target /tmp/torch212 /tmp/tdl/torch-2.12.0-*.whl
    PYTHONPATH=/tmp/torch212:src python scripts/policy_history.py dump \\
        > tests/data/policy/torch-2.12.json

A release whose default wheel is built for CUDA 12 (2.6 to 2.10) does not import with the CUDA
13 libraries of a newer torch's environment: install the ``nvidia-*-cu12`` packages its metadata
names (``Requires-Dist``; one set serves every CUDA 12 release) into a second side directory and
put it after the torch one, ``PYTHONPATH=/tmp/torch210:/tmp/cu12:src``. No GPU is needed.

``dump`` prints ``{"torch": VERSION, "tables": {device: {category: [entry, ...]}}}`` for the
``cuda`` and ``cpu`` autocast keys. Which ops are listed is the dispatcher's: every ``aten`` op
with a kernel on ``AutocastCUDA``/``AutocastCPU``. The category is not in the registrations, so
each entry takes the category that :func:`ampgraph.policy.tables_for` gives it for the oldest
recorded release that lists it (no category has changed between the releases recorded so far),
else that of its other overloads (``prod.dim_Dimname`` as ``prod.dim_int``; said on stderr);
an entry left without one is printed under ``"unknown"``. Check both kinds against that
release's ``aten/src/ATen/autocast_mode.cpp`` (``KERNEL_CUDA(op, fp32)`` and so on) and fix
the dump by hand where they differ. The CUDA lists are also in the wheel itself: the
``AT_FORALL_*`` macros of ``torch/include/ATen/autocast_mode.h`` (the .cpp adds
``cudnn_convolution``, ``cudnn_convolution_transpose`` and the banned ``binary_cross_entropy``;
``_cudnn_rnn`` is in ``cudnn/AutocastRNN.cpp``); the CPU lists are only in the .cpp. ``dump``
also checks, with fake tensors, that every one-tensor op in the fp32 list returns fp32 under
autocast, and fails when one does not.

``rows OLDER.json NEWER.json`` prints the ``TABLE_HISTORY`` rows (as Python tuples, newest
release first) that take OLDER's lists to NEWER's; paste them into ``TABLE_HISTORY`` above the
older rows, move ``HISTORY_FROM`` back, and add the dump to ``tests/data/policy/`` so that
``tests/test_policy.py`` checks ``tables_for(OLDER) == OLDER.json``. The newest dump to compare
with is the installed torch's: ``python scripts/policy_history.py dump > /tmp/torch-2.14.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ampgraph import policy as P

DEVICES = ("cuda", "cpu")
UNKNOWN = "unknown"
#: The categories in the order of the tables.
ORDER = (*P.TABLES["cuda"], UNKNOWN)


def _release(version: str) -> str:
    major, minor = P._release(version)
    return f"{major}.{minor}"


def registered(device_type: str) -> set[str]:
    """``op[.overload]`` of every aten op with a kernel on ``device_type``'s autocast key."""
    import torch

    key = P.AUTOCAST_KEYS[device_type]
    found = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            op, _, overload = name.partition(".")
            found.add(P.entry_name(op, overload))
    return found


def known_categories(device_type: str, version: str) -> dict[str, str]:
    """entry -> category, from the recorded tables of ``version`` and every newer release."""
    releases = {P.TABLE_TORCH_VERSION, version}
    releases |= {row[0] for row in P.TABLE_HISTORY}
    out: dict[str, str] = {}
    # Oldest last so that the category of the release nearest to ``version`` wins.
    for release in sorted(releases, key=P._release, reverse=True):
        if P._release(release) < P._release(version):
            continue
        for category, entries in P.tables_for(release)[device_type].items():
            for entry in entries:
                out[entry] = category
    return out


def sibling_category(entry: str, entries: set[str], known: dict[str, str]) -> str | None:
    """The category of ``entry``'s other registered overloads when they all share one.

    autocast_mode.cpp lists the overloads of an op together (``prod``, ``prod.dim_int``,
    ``prod.dim_Dimname``), so a new overload usually takes its siblings' category; the guess is
    printed to stderr, to be checked against that release's autocast_mode.cpp.
    """
    base = entry.partition(".")[0]
    found = {known[e] for e in entries if e != entry and e.partition(".")[0] == base and e in known}
    if len(found) != 1:
        return None
    (category,) = found
    print(f"{entry}: {category}, as its other overloads (check autocast_mode.cpp)", file=sys.stderr)
    return category


def fp32_check(device_type: str, entries: list[str]) -> list[str]:
    """One-tensor ops of ``entries`` that do not return fp32 under bf16 autocast (fake tensors)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ampgraph.torchutil import autocast_state

    bad = []
    for entry in entries:
        packet, _, overload = entry.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        args = op._schema.arguments
        if not (len(args) == 1 and str(args[0].type) == "Tensor" and len(op._schema.returns) == 1):
            continue
        shape = (4, 2) if entry == "view_as_complex" else (4, 4)
        try:
            with FakeTensorMode(), autocast_state(device_type, True, torch.bfloat16):
                out = op(torch.empty(shape, dtype=torch.bfloat16, device=device_type))
        except Exception as exc:  # noqa: BLE001 - reported with the entry
            bad.append(f"{entry} ({type(exc).__name__})")
            continue
        real = out.real.dtype if out.is_complex() else out.dtype
        if real != torch.float32:
            bad.append(entry)
    return bad


def dump() -> dict:
    import torch

    version = torch.__version__
    tables: dict[str, dict[str, list[str]]] = {}
    for device_type in DEVICES:
        known = known_categories(device_type, version)
        table: dict[str, list[str]] = {category: [] for category in ORDER}
        entries = registered(device_type)
        for entry in sorted(entries):
            category = known.get(entry) or sibling_category(entry, entries, known)
            table.setdefault(category or UNKNOWN, []).append(entry)
        if device_type == "cuda" and torch.version.cuda is None:
            # A CPU-only build registers the CUDA kernels but cannot make fake CUDA tensors.
            print("CPU-only torch: the cuda fp32 list is not run", file=sys.stderr)
            bad = []
        else:
            bad = fp32_check(device_type, table.get(P.FP32, []))
        if bad:
            sys.exit(f"{device_type}: fp32 entries that do not return fp32: {bad}")
        tables[device_type] = table
    return {"torch": version, "tables": tables}


def rows(older: dict, newer: dict) -> list[tuple[str, str, str, str, str]]:
    """``TABLE_HISTORY`` rows for the changes from ``older``'s lists to ``newer``'s."""
    release = _release(newer["torch"])
    out = []
    for device_type in DEVICES:
        old, new = older["tables"][device_type], newer["tables"][device_type]
        for category in sorted(set(old) | set(new), key=ORDER.index):
            before, after = set(old.get(category, ())), set(new.get(category, ()))
            out += [(release, device_type, category, e, "added") for e in sorted(after - before)]
            out += [(release, device_type, category, e, "removed") for e in sorted(before - after)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("dump", help="print the installed torch's autocast lists as JSON")
    diff = sub.add_parser("rows", help="print the TABLE_HISTORY rows from OLDER to NEWER")
    diff.add_argument("older", type=Path)
    diff.add_argument("newer", type=Path)
    args = parser.parse_args(argv)
    if args.mode == "dump":
        print(json.dumps(dump(), indent=1))
        return 0
    older, newer = (json.loads(p.read_text()) for p in (args.older, args.newer))
    for device_type in DEVICES:
        for dump_ in (older, newer):
            if dump_["tables"][device_type].get(UNKNOWN):
                sys.exit(f"{dump_['torch']} {device_type}: categorise the 'unknown' entries first")
    names = {getattr(P, n): n for n in ("LOWER_PRECISION_FP", "FP32", "FP32_SET_OPT_DTYPE",
                                         "FP32_APPEND_DTYPE", "PROMOTE", "BANNED", "FP16")}  # fmt: skip
    for release, device_type, category, entry, change in rows(older, newer):
        print(f'    ("{release}", "{device_type}", {names[category]}, "{entry}", "{change}"),')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
