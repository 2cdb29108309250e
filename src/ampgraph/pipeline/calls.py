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
    hooks = _Hooks(module_io or {}, {r.name: r for r in records})
    calls = _calls_with_nodes(records, modules, hooks, call_order)
    # Calls without nodes go right after the call that preceded them in the forward.
    after = _calls_without_nodes(modules, hooks, call_order)
    ordered = list(after.pop(None, []))
    for key, call in calls:
        ordered.append((key, call))
        ordered.extend(after.pop(key, []))
    for rest in after.values():  # the preceding call left no group (not seen so far)
        ordered.extend(rest)
    return ordered


#: A module call with its (path, call index).
_Indexed = tuple[tuple[str, int], ModuleCall]


class _Hooks:
    """What the capture saw each call's forward hook receive and return: graph node names
    (``module_io``), and their records (``by_name``)."""

    def __init__(
        self,
        module_io: dict[str, list[tuple[str | None, str | None]]],
        by_name: dict[str, NodeRecord],
    ) -> None:
        self.module_io, self.by_name = module_io, by_name

    def names(self, path: str, index: int) -> tuple[str | None, str | None]:
        io = self.module_io.get(path, [])
        return io[index] if index < len(io) else (None, None)

    def records(self, path: str, index: int) -> tuple[NodeRecord | None, NodeRecord | None]:
        hook_in, hook_out = self.names(path, index)
        return self.by_name.get(hook_in or ""), self.by_name.get(hook_out or "")


def _calls_with_nodes(
    records: Sequence[NodeRecord],
    modules: dict[str, ModuleInfo],
    hooks: _Hooks,
    call_order: Sequence[tuple[str, int, bool]],
) -> list[_Indexed]:
    """A call per group of op records of one leaf-module call, in the graph's order."""
    # The k-th call of a path that has graph nodes is its n-th call in all (empty ones count).
    with_nodes: dict[str, list[int]] = {}
    for path, index, empty in call_order:
        if not empty:
            with_nodes.setdefault(path, []).append(index)
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
    call_index: dict[str, int] = {}
    calls: list[_Indexed] = []
    for call, members in groups.items():
        info = modules[members[0].module or ""]
        k = call_index.get(info.path, 0)
        call_index[info.path] = k + 1
        indices = with_nodes.get(info.path, [])
        index = indices[k] if k < len(indices) else k
        in_dtype, out_dtype = _hooked_dtypes(members, hooks, used_by, info.path, index)
        calls.append((
            (info.path, index),
            ModuleCall(
                path=info.path,
                type=info.type,
                bases=list(info.bases),
                call=call,
                in_dtype=in_dtype,
                out_dtype=out_dtype,
                nodes=[m.name for m in members],
            ),
        ))  # fmt: skip
    # In the order the hooks fire, which is the graph's except where a leaf calls leaves it is
    # given (DoRA's magnitude layer around lora_A and lora_B): it returns, and prints, last.
    position = {(path, index): i for i, (path, index, _empty) in enumerate(call_order)}
    if all(key in position for key, _call in calls):
        calls.sort(key=lambda indexed: position[indexed[0]])
    return calls


def _hooked_dtypes(
    members: list[NodeRecord], hooks: _Hooks, used_by: dict[str, set[str]], path: str, index: int
) -> tuple[str | None, str | None]:
    """The dtypes the hook of call ``index`` of ``path`` sees: of the values the capture saw it
    receive and return, else of the first value its ``members`` consume from outside (not a
    parameter or buffer) and the last they produce that is used outside."""
    names = {m.name for m in members}
    in_dtype = None
    for m in members:
        for inp in m.inputs:
            producer = hooks.by_name.get(inp["node"])
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
    hook_in, hook_out = hooks.records(path, index)
    if hook_in is not None:
        in_dtype = hook_in.out_dtype
    if hook_out is not None:
        out_rec = hook_out
    # What the hook sees is no tensor: it prints None, whatever tensors the call used.
    in_name, out_name = hooks.names(path, index)
    if in_name == NO_TENSOR:
        in_dtype = None
    if out_name == NO_TENSOR:
        out_rec = None
    return in_dtype, out_rec.out_dtype if out_rec else None


def _calls_without_nodes(
    modules: dict[str, ModuleInfo], hooks: _Hooks, call_order: Sequence[tuple[str, int, bool]]
) -> dict[tuple[str, int] | None, list[_Indexed]]:
    """The calls that added no node to the graph, by the call with nodes that preceded each
    (None: before the first), with the dtypes of the values their hooks saw."""
    after: dict[tuple[str, int] | None, list[_Indexed]] = {}
    previous: tuple[str, int] | None = None
    for path, index, empty in call_order:
        if not empty:
            previous = (path, index)
            continue
        info = modules.get(path)
        rec_in, rec_out = hooks.records(path, index)
        # A call that returns no tensor at all (``nn.Identity()(3)``) still prints its line,
        # ``out=None``; one that returns a tensor the trace does not know cannot be named.
        if info is None or (rec_out is None and hooks.names(path, index)[1] != NO_TENSOR):
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
    return after


__all__ = ["indexed_module_calls", "module_calls"]
