"""A model folder's safetensors checkpoint copied into a model, every tensor checked first.

Which files: those ``model.safetensors.index.json`` names (its ``weight_map``), or without an
index every ``*.safetensors`` in the folder (never a pickle: ``*.bin`` files are not opened).
Each is read by :class:`~ampgraph.ranges.shards.Shard` (regular files only, sizes checked).

Every header is read and every tensor checked against the model before a byte of data is: a
tensor is refused, with its name, when

* its shape is not the model's;
* it is in two shards, or under two names that are one tensor of the model (``model.x`` and
  ``x``), or the index puts it in another shard than the one that holds it;
* its dtype is not the model's and converting it is not exact: a floating checkpoint of a
  narrower floating dtype (fp16 or bf16 for fp32 parameters: many checkpoints are saved so) is
  widened exactly and said so; a wider float (float64), an integer, a bool, a complex number or
  a float8 (quantized: its scales live in other tensors) for a floating parameter is refused, as
  is any dtype but its own for an integer or bool buffer.

>>> import tempfile, pathlib, torch
>>> from safetensors.torch import save_file
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> save_file({"weight": torch.ones(2, 2, dtype=torch.bfloat16)}, str(folder / "m.safetensors"))
>>> lin = torch.nn.Linear(2, 2)
>>> got = load_safetensors(lin, folder)
>>> got.loaded, got.widened, lin.weight.dtype
(['weight'], {'bfloat16': 1}, torch.float32)
>>> save_file({"weight": torch.ones(2, 2, dtype=torch.int8)}, str(folder / "m.safetensors"))
>>> load_safetensors(lin, folder)                               # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ampgraph.ranges.data.RangesError: m.safetensors: weight is int8, but the model's weight is ...
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ampgraph.ranges.data import RangesError
from ampgraph.ranges.shards import DTYPES, Entry, Shard, safetensors_dtype

#: Hugging Face's name for the index of a sharded safetensors checkpoint.
INDEX = "model.safetensors.index.json"


@dataclass
class Loaded:
    """What :func:`load_safetensors` copied: the files read, the model's tensors (qualified
    names) that came from them, how many were widened from each dtype, and how many tensors of
    the files are not the model's (ignored)."""

    files: list[Path] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    widened: dict[str, int] = field(default_factory=dict)
    ignored: int = 0


def shard_paths(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The shards to read, and the index's tensor -> shard map (None without an index).

    >>> import tempfile, pathlib
    >>> shard_paths(pathlib.Path(tempfile.mkdtemp()))
    ([], None)
    """
    from ampgraph.report.reading import CONFIG_LIMIT, read_text

    index = folder / INDEX
    if not os.path.lexists(index):
        return sorted(folder.glob("*.safetensors")), None
    text = read_text(index, "safetensors index", limit=CONFIG_LIMIT)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RangesError(f"{index}: not JSON ({str(exc).splitlines()[0][:200]})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise RangesError(f"{index}: no weight_map object of tensor names -> shard file names")
    for name in sorted(set(weight_map.values())):
        # A shard is a file of this folder: never a path that leaves it.
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise RangesError(f"{index}: the shard {name[:200]!r} is not a file name in {folder}")
    return [folder / n for n in sorted(set(weight_map.values()))], weight_map


def _refuse_dtype(where: str, key: str, src: torch.dtype, target: str, dest: torch.dtype) -> None:
    """A one-line :class:`RangesError` unless ``src`` converts to ``dest`` exactly."""
    short = str(src).removeprefix("torch.")
    want = str(dest).removeprefix("torch.")
    if src == dest:
        return
    if dest.is_floating_point and src.is_floating_point and src.itemsize > 1:
        if torch.promote_types(src, dest) == dest:
            return  # fp16 or bf16 into fp32: every value exact
        why = f"{short} does not fit {want} exactly (a narrowing)"
    elif dest.is_floating_point and src.is_floating_point:
        why = f"{short} weights are quantized (their scales are other tensors)"
    elif dest.is_floating_point:
        why = f"{short} is not a floating dtype (a quantized or foreign checkpoint?)"
    else:
        why = "an integer or bool tensor is read in its own dtype only"
    raise RangesError(
        f"{where}: {key} is {short}, but the model's {target} is {want}: {why}; ampgraph judges "
        "a checkpoint in its own values only"
    )


def _plan(
    shards: list[Shard], named: dict[str, torch.Tensor], prefix: str,
    index: dict[str, str] | None,
) -> tuple[dict[str, Source], int]:  # fmt: skip
    """Model name -> where its tensor is, each checked from the headers alone; and how many
    keys are not the model's."""
    plan: dict[str, Source] = {}
    ignored = 0
    for shard in shards:
        for key, entry in shard.entries.items():
            said = index.get(key) if index is not None else None
            if said is not None and said != shard.path.name:
                raise RangesError(f"{shard.path.name}: holds {key}, which {INDEX} puts in "
                                  f"{said}: which one is the checkpoint's?")  # fmt: skip
            candidates = [key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")]
            target = next((k for k in candidates[: 3 if prefix else 1] if k in named), None)
            if target is None:
                ignored += 1
                continue
            if target in plan:
                first = plan[target]
                raise RangesError(
                    f"{shard.path.name}: {key} is the model's {target}, which {first.path.name} "
                    f"holds already (as {first.entry.name}): one tensor twice in the checkpoint; "
                    "which one is it?"
                )
            dest = named[target]
            if entry.shape != tuple(dest.shape):
                raise RangesError(
                    f"{shard.path.name}: {key} has shape {list(entry.shape)} but the model's "
                    f"{target} is {list(dest.shape)}: the weights are not this config's"
                )
            src = safetensors_dtype(entry.dtype)
            assert src is not None  # Shard refuses unknown dtypes
            _refuse_dtype(shard.path.name, key, src, target, dest.dtype)
            plan[target] = Source(shard.path, shard.what, entry, dest.dtype)
    for key, name in (index or {}).items():
        if not any(key in s.entries for s in shards if s.path.name == name):
            raise RangesError(f"{INDEX} puts {key} in {name}, which does not hold it")
    return plan, ignored


def check_checkpoint(module: nn.Module, folder: Path) -> tuple[Loaded, dict[str, Source]]:
    """Every shard's header read and every tensor checked against ``module``, no data read:
    what a load will copy (:class:`Loaded`), and model name -> where each tensor is.

    Names are matched as they are, or with the model's ``base_model_prefix`` added or removed
    (checkpoints of the bare model). Every refusal is one line (:class:`RangesError`, or
    :class:`~ampgraph.errors.FileReadError` for a file that is not a safetensors file).

    >>> import tempfile
    >>> from safetensors.torch import save_file
    >>> folder = Path(tempfile.mkdtemp())
    >>> save_file({"bias": torch.zeros(2), "extra": torch.ones(1)}, str(folder / "m.safetensors"))
    >>> loaded, sources = check_checkpoint(torch.nn.Linear(2, 2), folder)
    >>> loaded.loaded, loaded.ignored, sources["bias"].entry.shape
    (['bias'], 1, (2,))
    """
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    prefix = str(getattr(module, "base_model_prefix", "") or "")
    paths, index = shard_paths(folder)
    what = f"shard named by {INDEX}" if index is not None else "safetensors file"
    with contextlib.ExitStack() as stack:
        shards = [stack.enter_context(Shard(p, what)) for p in paths]
        sources, ignored = _plan(shards, named, prefix, index)
    widened = Counter(
        DTYPES[s.entry.dtype] for s in sources.values()
        if safetensors_dtype(s.entry.dtype) != s.dtype
    )  # fmt: skip
    return Loaded(paths, list(sources), dict(widened), ignored), sources


def load_safetensors(module: nn.Module, folder: Path) -> Loaded:
    """Copy ``folder``'s safetensors tensors into ``module``, one at a time, all checked first
    (:func:`check_checkpoint`)."""
    loaded, sources = check_checkpoint(module, folder)
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    # Tied tensors (one tensor, two names) stored twice: the first copy is kept to compare.
    count = Counter(id(t) for t in named.values())
    copied: dict[int, tuple[str, torch.Tensor]] = {}
    with ShardPool() as pool:
        for target, source in sources.items():
            tensor, dest = pool.read(source), named[target]
            _same_as_tied(copied.get(id(dest)), source, target, tensor)
            with torch.no_grad():
                dest.copy_(tensor)
            if count[id(dest)] > 1:
                copied.setdefault(id(dest), (target, tensor))
    return loaded


@dataclass(frozen=True)
class Source:
    """Where one of the model's tensors is: its file, the header entry checked, and the model's
    dtype it is read into."""

    path: Path
    what: str
    entry: Entry
    dtype: torch.dtype


class ShardPool:
    """Shards opened on demand and kept open until the pool closes; :meth:`read` gives a
    tensor in the model's dtype, refusing one whose entry changed since it was checked."""

    def __init__(self) -> None:
        self.open: dict[Path, Shard] = {}

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        for shard in self.open.values():
            shard.close()
        self.open.clear()

    def read(self, source: Source) -> torch.Tensor:
        if source.path not in self.open:
            self.open[source.path] = Shard(source.path, source.what)
        shard = self.open[source.path]
        if shard.entries.get(source.entry.name) != source.entry:
            raise shard.refuse(f"{source.entry.name} changed since it was checked",
                               "was the file rewritten while ampgraph read it?")  # fmt: skip
        return shard.read(source.entry.name).to(source.dtype)


def _same_as_tied(
    first: tuple[str, torch.Tensor] | None, source: Source, target: str, tensor: torch.Tensor
) -> None:
    """Tied weights (one tensor under two names) stored twice must hold the same values."""
    if first is None:
        return
    a, b = first[1], tensor
    if not bool(((a == b) | (a != a) & (b != b)).all()):  # NaN where both hold NaN is the same
        raise RangesError(
            f"{source.path.name}: {source.entry.name} and the model's {first[0]} are one tied "
            f"tensor of the model ({target}), but the checkpoint holds different values for them"
        )


__all__ = [
    "INDEX", "Loaded", "ShardPool", "Source", "check_checkpoint", "load_safetensors",
    "shard_paths",
]  # fmt: skip
