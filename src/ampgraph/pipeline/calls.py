"""Leaf-module calls from node records: the dtypes a forward hook on each leaf module sees.

What :class:`~ampgraph.report.records.Report` lists as ``modules`` (the seed notebook's hook
view), grouped from the annotated graph and the capture's record of each call.

>>> module_calls([], {})
[]
"""

from __future__ import annotations

from collections.abc import Sequence

from ampgraph.capture.trace import NO_TENSOR, ModuleInfo
from ampgraph.report.records import ModuleCall, NodeRecord


def module_calls(
    records: Sequence[NodeRecord],
    modules: dict[str, ModuleInfo],
    module_io: dict[str, list[tuple[str | None, str | None]]] | None = None,
    call_order: Sequence[tuple[str, int, bool]] = (),
) -> list[ModuleCall]:
    """Group node records into leaf-module calls, each with the dtypes a forward hook would see
    (:func:`indexed_module_calls`, without the calls' indices).

    >>> module_calls([], {}, {"fc": [("x", "linear")]}, [("fc", 0, False)])
    []
    """
    return [call for _key, call in indexed_module_calls(records, modules, module_io, call_order)]


def indexed_module_calls(
    records: Sequence[NodeRecord],
    modules: dict[str, ModuleInfo],
    module_io: dict[str, list[tuple[str | None, str | None]]] | None = None,
    call_order: Sequence[tuple[str, int, bool]] = (),
) -> list[tuple[tuple[str, int], ModuleCall]]:
    """Group node records into leaf-module calls, each with the dtypes a forward hook would see,
    and with its (path, call index): the k-th call of a path is the k-th its hook saw, which is
    what the check compares with the hooks of the trace (:mod:`ampgraph.annotate.check`).

    ``in`` and ``out`` are the annotated dtypes of the graph nodes the capture saw the module
    receive as ``inp[0]`` and return as ``out[0]`` (``module_io``). Where those are unknown,
    ``in`` is the first value the call consumes from outside that is not a parameter or buffer
    (a Linear's activation, an Embedding's token ids) and ``out`` the last value it produces that
    is used outside the call.

    A call that added no node to the graph (``nn.Identity``, an eval-mode ``StochasticDepth``)
    still fires its hook: it is listed where ``call_order`` puts it, with the dtypes of the value
    it received and returned.

    >>> indexed_module_calls([], {})
    []
    """
    module_io = module_io or {}
    # The k-th call of a path that has graph nodes is its n-th call in all (empty ones count).
    with_nodes: dict[str, list[int]] = {}
    for path, index, empty in call_order:
        if not empty:
            with_nodes.setdefault(path, []).append(index)
    call_index: dict[str, int] = {}
    by_name = {r.name: r for r in records}
    groups: dict[str, list[NodeRecord]] = {}
    for rec in records:
        if rec.module_call is None or rec.module is None or rec.kind != "op":
            continue
        info = modules.get(rec.module)
        if info is None or not info.is_leaf:
            continue
        groups.setdefault(rec.module_call, []).append(rec)
    used_by: dict[str, set[str]] = {}
    for rec in records:
        for inp in rec.inputs:
            used_by.setdefault(inp["node"], set()).add(rec.name)

    def hook_names(path: str, index: int) -> tuple[str | None, str | None]:
        io = module_io.get(path, [])
        return io[index] if index < len(io) else (None, None)

    def hook_io(path: str, index: int) -> tuple[NodeRecord | None, NodeRecord | None]:
        hook_in, hook_out = hook_names(path, index)
        return by_name.get(hook_in or ""), by_name.get(hook_out or "")

    calls: list[tuple[tuple[str, int], ModuleCall]] = []
    for call, members in groups.items():
        names = {m.name for m in members}
        in_dtype = None
        for m in members:
            for inp in m.inputs:
                producer = by_name.get(inp["node"])
                if inp["node"] in names or (producer is not None and producer.is_source):
                    continue
                in_dtype = inp["dtype"]
                break
            if in_dtype is not None:
                break
        out_rec = next(
            (m for m in reversed(members) if used_by.get(m.name, set()) - names and m.outputs),
            next((m for m in reversed(members) if m.outputs), None),
        )
        info = modules[members[0].module or ""]
        k = call_index.get(info.path, 0)
        call_index[info.path] = k + 1
        indices = with_nodes.get(info.path, [])
        index = indices[k] if k < len(indices) else k
        hook_in, hook_out = hook_io(info.path, index)
        if hook_in is not None:
            in_dtype = hook_in.out_dtype
        if hook_out is not None:
            out_rec = hook_out
        # What the hook sees is no tensor: it prints None, whatever tensors the call used.
        in_name, out_name = hook_names(info.path, index)
        if in_name == NO_TENSOR:
            in_dtype = None
        if out_name == NO_TENSOR:
            out_rec = None
        calls.append((
            (info.path, index),
            ModuleCall(
                path=info.path,
                type=info.type,
                bases=list(info.bases),
                call=call,
                in_dtype=in_dtype,
                out_dtype=out_rec.out_dtype if out_rec else None,
                nodes=[m.name for m in members],
            ),
        ))  # fmt: skip

    # Calls without nodes go right after the call that preceded them in the forward.
    after: dict[tuple[str, int] | None, list[tuple[tuple[str, int], ModuleCall]]] = {}
    previous: tuple[str, int] | None = None
    for path, index, empty in call_order:
        if not empty:
            previous = (path, index)
            continue
        info = modules.get(path)
        rec_in, rec_out = hook_io(path, index)
        # A call that returns no tensor at all (``nn.Identity()(3)``) still prints its line,
        # ``out=None``; one that returns a tensor the trace does not know cannot be named.
        if info is None or (rec_out is None and hook_names(path, index)[1] != NO_TENSOR):
            continue
        after.setdefault(previous, []).append((
            (path, index),
            ModuleCall(
                path=path,
                type=info.type,
                bases=list(info.bases),
                call=f"{path}@{index}" if index else path,
                in_dtype=rec_in.out_dtype if rec_in is not None else None,
                out_dtype=rec_out.out_dtype if rec_out is not None else None,
                nodes=[],
                returns_tensor=rec_out is not None,
            ),
        ))  # fmt: skip
    ordered = list(after.pop(None, []))
    for key, call in calls:
        ordered.append((key, call))
        ordered.extend(after.pop(key, []))
    for rest in after.values():  # the preceding call left no group (not seen so far)
        ordered.extend(rest)
    return ordered


__all__ = ["indexed_module_calls", "module_calls"]
