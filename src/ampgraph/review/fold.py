"""Repeated layers folded in words: items (findings, changes) that recur identically across
numbered layers become one entry with its count and layer range (``layers.0-11 ×12``).

Torch-free, shared by ``ampgraph audit`` and ``ampgraph diff``. The diagrams fold a run of
identical layers into one box marked ×N (:mod:`ampgraph.render.graph`); this does the same for
lists. A layer is a module path's outermost numbered component (``model.decoder.layers.3``); its
items are those whose module lies in it. Two layers fold when their items are identical once the
layer is taken out: the layer's path, and the names of its nodes (``linear_6`` in layer 1 is
``linear`` in layer 0: a node's name is its position in one graph), which :class:`Names` replaces
by the node's position inside the layer (or inside the layer before it, which a layer reads). Anything else that differs (a shape, a dtype, a cast, a
source line, a node of another layer) keeps the layers apart: the last layer of a model that
differs is its own entry (``layers.0-10 ×11`` and ``layers.11``).

Layers fold by identity, not by adjacency: layers 0, 2 and 4 alike (alternating layers) are one
entry whose indices are written as a set, ``layers.{0,2,4} ×3``, never as a range.

>>> items = [("a.layers.0.fc", "cast"), ("a.layers.1.fc", "cast"), ("a.layers.2.fc", "other")]
>>> [(f.group.label if f.group else None, len(f.items))
...  for f in fold(items, lambda i: i[0], lambda i, layer: i[1])]
[('a.layers.0-1', 2), (None, 1)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ampgraph.report.records import NodeRecord

T = TypeVar("T")

#: What stands for a layer's own path, and for its k-th node, in a normalised text: NUL bytes,
#: which no module or node name of a real model holds, so no text of its own can look like one.
_LAYER = "\x00L\x00"


def _node_mark(k: int) -> str:
    return f"\x00N{k}\x00"


def layer_of(path: str | None) -> tuple[str, int] | None:
    """The outermost numbered module of ``path`` as ``(prefix, index)``, or None.

    >>> layer_of("model.decoder.layers.3.fc1"), layer_of("0.conv"), layer_of("lm_head")
    (('model.decoder.layers', 3), ('', 0), None)
    """
    if not path:
        return None
    parts = path.split(".")
    for k, part in enumerate(parts):
        # ASCII digits in canonical form only: "²" is a digit to str.isdigit, "03" is not "3".
        if part.isascii() and part.isdigit() and part == str(int(part)):
            return ".".join(parts[:k]), int(part)
    return None


def instance_path(prefix: str, index: int) -> str:
    """``('model.layers', 3)`` -> ``'model.layers.3'``; a top-level list's layer is ``'3'``."""
    return f"{prefix}.{index}" if prefix else str(index)


def indices_label(indices: Sequence[int]) -> str:
    """Layer indices as a reader wants them: a run as a range, anything else as a set (runs of
    three or more inside it as ranges).

    >>> indices_label([0, 1, 2, 3]), indices_label([0, 2, 4]), indices_label([0, 1, 2, 5, 7, 8])
    ('0-3', '{0,2,4}', '{0-2,5,7,8}')
    """
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    if len(runs) == 1 and len(runs[0]) > 1:
        return f"{runs[0][0]}-{runs[0][-1]}"
    parts = [
        f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs
    ]  # fmt: skip
    return "{" + ",".join(parts) + "}" if len(indices) > 1 else parts[0]


@dataclass(frozen=True)
class Group:
    """Layers ``prefix.i`` for each ``i`` in ``indices`` whose items are identical."""

    prefix: str
    indices: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.indices)

    @property
    def first(self) -> str:
        """The first layer's path, whose items an entry shows."""
        return instance_path(self.prefix, self.indices[0])

    @property
    def label(self) -> str:
        """``model.decoder.layers.0-11``, or ``model.layers.{0,2,4}`` where there are gaps."""
        return instance_path(self.prefix, indices_label(self.indices))  # type: ignore[arg-type]

    def shown(self, path: str | None) -> str | None:
        """``path`` (in the first layer) with the layer written as the group's range.

        >>> Group("m.layers", (0, 1, 2)).shown("m.layers.0.fc1")
        'm.layers.0-2.fc1'
        """
        if path is None or not (path == self.first or path.startswith(self.first + ".")):
            return path
        return self.label + path[len(self.first) :]

    def shown_text(self, text: str) -> str:
        """``text`` with the first layer's path, where it names it, written as the range.

        >>> Group("m.layers", (0, 1)).shown_text("add in m.layers.0, not m.layers.01")
        'add in m.layers.0-1, not m.layers.01'
        """
        pattern = rf"(?<![\w.]){re.escape(self.first)}(?!\w)"
        return re.sub(pattern, lambda _: self.label, text)

    def to_dict(self) -> dict[str, Any]:
        return {"layers": self.label, "prefix": self.prefix, "indices": list(self.indices),
                "count": self.count}  # fmt: skip


@dataclass(frozen=True)
class Fold(Generic[T]):
    """One entry of a folded list: an item, or the same item of each layer of a group."""

    items: tuple[T, ...]
    group: Group | None = None

    @property
    def first(self) -> T:
        return self.items[0]

    @property
    def count(self) -> int:
        return len(self.items)


def fold(
    items: Sequence[T],
    path: Callable[[T], str | None],
    key: Callable[[T, str], Hashable],
) -> list[Fold[T]]:
    """``items`` with the layers whose items are identical folded, each entry where its first
    occurrence was.

    ``path(item)`` is the module the item belongs to; ``key(item, layer)`` what must be equal for
    two layers' items to be the same, with ``layer`` (the item's layer path) taken out (see
    :class:`Names`). A layer's items are compared as a whole, in order: one differing item keeps
    its layer out of the group.
    """
    where: list[tuple[str, int] | None] = [layer_of(path(item)) for item in items]
    members: dict[tuple[str, int], list[int]] = {}
    for i, layer in enumerate(where):
        if layer is not None:
            members.setdefault(layer, []).append(i)
    signatures: dict[tuple[str, Hashable], list[tuple[str, int]]] = {}
    for layer, positions in members.items():
        own = instance_path(*layer)
        sig = tuple(key(items[i], own) for i in positions)
        signatures.setdefault((layer[0], sig), []).append(layer)
    # Each item of a folded layer: its group and its position among its layer's items.
    place: dict[int, tuple[Group, list[tuple[str, int]], int]] = {}
    for (prefix, _), layers in signatures.items():
        if len(layers) < 2:
            continue
        group = Group(prefix, tuple(sorted(i for _, i in layers)))
        ordered = sorted(layers, key=lambda layer: layer[1])
        for layer in ordered:
            for k, i in enumerate(members[layer]):
                place[i] = (group, ordered, k)
    out: list[Fold[T]] = []
    for i, item in enumerate(items):
        if i not in place:
            out.append(Fold((item,)))
            continue
        group, layers, k = place[i]
        if where[i] == layers[0]:
            out.append(Fold(tuple(items[members[layer][k]] for layer in layers), group))
    return out


def _home(rec: NodeRecord) -> str | None:
    """The module a node lies in; for a parameter or buffer (no module), its owner's path."""
    return rec.module if rec.module is not None else rec.target


class Names:
    """The nodes of each layer of one graph, to take a layer out of what mentions it.

        :meth:`key` replaces, in a value (a text, a list, a dict), the layer's path and the names of
        its nodes by marks of their position in the layer, so that layer 0's ``linear`` and layer 1's
        ``linear_6`` read the same; so are the names of the previous layer's nodes, which a layer reads
    (its input is the last op of the layer before it). A name is replaced only as a whole word not joined to a dot (the
        op ``add.Tensor`` is no node ``add``): where a name is also a word of the text, the layers
        stay apart, never wrongly together.

        >>> from ampgraph.report.records import NodeRecord as N
        >>> names = Names([N("linear", "aten.linear", "op", module="m.layers.0.fc"),
        ...                N("linear_6", "aten.linear", "op", module="m.layers.1.fc")])
        >>> names.key("linear_6 in m.layers.1.fc", "m.layers.1") == names.key(
        ...     "linear in m.layers.0.fc", "m.layers.0")
        True
    """

    def __init__(self, nodes: Iterable[NodeRecord]) -> None:
        self._members: dict[str, dict[str, str]] = {}
        for rec in nodes:
            layer = layer_of(_home(rec))
            if layer is not None:
                own = self._members.setdefault(instance_path(*layer), {})
                own.setdefault(rec.name, _node_mark(len(own)))
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._marked: dict[str, dict[str, str]] = {}

    def _marks(self, layer: str) -> dict[str, str]:
        """The layer's node names and the previous layer's (a layer reads the one before it:
        layer 1's first op reads layer 0's last, layer 2's reads layer 1's), each to its mark."""
        if layer not in self._marked:
            marks: dict[str, str] = {}
            parsed = layer_of(layer)
            if parsed is not None and parsed[1] > 0:
                before = self._members.get(instance_path(parsed[0], parsed[1] - 1), {})
                marks.update((name, "\x00P" + mark[2:]) for name, mark in before.items())
            marks.update(self._members.get(layer, {}))
            self._marked[layer] = marks
        return self._marked[layer]

    def _pattern(self, layer: str) -> re.Pattern[str]:
        if layer not in self._patterns:
            names = sorted(self._marks(layer), key=len, reverse=True)
            alternatives = [rf"{re.escape(layer)}(?!\w)"]
            if names:
                alternatives.append(rf"(?:{'|'.join(map(re.escape, names))})(?![\w.])")
            self._patterns[layer] = re.compile(rf"(?<![\w.])(?:{'|'.join(alternatives)})")
        return self._patterns[layer]

    def node(self, name: str | None, layer: str) -> str | None:
        """The mark of node ``name`` in ``layer``, or the name where it is not the layer's."""
        if name is None:
            return None
        return self._marks(layer).get(name, name)

    def key(self, value: Any, layer: str) -> Hashable:
        """``value`` with ``layer`` taken out, as something hashable to compare."""
        if isinstance(value, str):
            own = self._marks(layer)
            if value in own:
                return own[value]
            return self._pattern(layer).sub(
                lambda m: _LAYER if m.group(0) == layer else own[m.group(0)], value
            )
        if isinstance(value, dict):
            return tuple((k, self.key(v, layer)) for k, v in sorted(value.items()))
        if isinstance(value, list | tuple):
            return tuple(self.key(v, layer) for v in value)
        return value  # type: ignore[no-any-return]


__all__ = ["Fold", "Group", "Names", "fold", "indices_label", "instance_path", "layer_of"]
