"""Weights larger than memory: each tensor made when a node needs it, and dropped after.

A model folder whose fp32 weights do not fit this process's memory is run block by block: the
model is built with its parameters on the meta device (its buffers real: rotary frequencies are
computed as usual), every tensor of the checkpoint checked from the headers alone
(:func:`~ampgraph.ranges.checkpoint.check_checkpoint`), and each graph input that is a weight
is a :class:`Lazy` handle. The reference run (:class:`~ampgraph.ranges.collect.RangeRun`)
materialises a handle for the node that reads it, records its range the first time, and lets it
go with the node's arguments: resident are the weights of the op being run, the activations
still to be used, and the buffers. Tensors the files do not hold are seeded as
:func:`~ampgraph.ranges.weights.seed_weights` seeds them, the generator's state replayed to
each one's place, so both runs judge the same numbers and agree exactly
(``tests/test_ranges_stream.py``).

>>> import torch
>>> lazy = Lazy("w", lambda: torch.ones(2))
>>> lazy, lazy.load().tolist()
(Lazy('w'), [1.0, 1.0])
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampgraph.ranges.checkpoint import ShardPool, Source, check_checkpoint
from ampgraph.ranges.data import RangesError
from ampgraph.ranges.weights import (
    MEMORY_SHARE,
    build_real,
    describe_weights,
    free_memory,
    made_buffers,
    named_tensors,
    seed_order,
)
from ampgraph.verify.device import weight_bytes
from ampgraph.verify.tensors import RANDOM_POOL, random_like



class Lazy:
    """A weight not in memory: :meth:`load` makes it (read from its shard, or seeded), anew
    each time; the caller drops it when done."""

    __slots__ = ("make", "name")

    def __init__(self, name: str, make: Callable[[], torch.Tensor]) -> None:
        self.name = name
        self.make = make

    def load(self) -> torch.Tensor:
        return self.make()

    def __repr__(self) -> str:
        return f"Lazy({self.name!r})"


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """While a model is built: every parameter it registers moved to the meta device at once
    (its buffers stay real), as ``accelerate.init_empty_weights(include_buffers=False)`` does.

    >>> with meta_parameters():
    ...     bn = torch.nn.BatchNorm1d(2)
    >>> bn.weight.is_meta, bn.running_mean.is_meta
    (True, False)
    """
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def return_freed_memory() -> None:
    """Give the pages of the weights just dropped back to the system (glibc's ``malloc_trim``;
    nothing elsewhere): called after each node that read a weight made for it.

    glibc maps a block above its ``M_MMAP_THRESHOLD`` on its own and unmaps it when freed, but
    the threshold rises to the largest block freed so far (up to 32 MB), and weights freed one
    after another then stay in malloc's heap, a weight at a time holding what the largest ones
    took together. Trimming returns the free pages of the heap and changes nothing that lasts,
    which is enough where memory is counted as resident pages. A limit on the process's data
    (``ulimit -d``, ``RLIMIT_DATA``) counts the heap's extent instead, which holes left between
    live blocks keep wide, so there (a process set up for the run: a batch job, a test's child)
    the threshold is fixed (``mallopt``), the one way glibc unmaps each block when freed; it
    lasts for the process, since glibc has no way back to its rising threshold. A process
    without such a limit (a notebook) is left as it was.

    >>> return_freed_memory()
    """
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.malloc_trim(0)


def _map_blocks_where_data_limited() -> None:
    """Fix glibc's threshold where the process's data is limited (:func:`return_freed_memory`
    says why), before the first weight is made."""
    with contextlib.suppress(OSError, AttributeError):
        if _data_limited():
            _LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024)  # glibc's own starting value


#: glibc's ``mallopt`` parameter for the size above which a block is mapped on its own.
M_MMAP_THRESHOLD = -3


def _data_limited() -> bool:
    import resource

    return any(resource.getrlimit(r)[0] != resource.RLIM_INFINITY
               for r in (resource.RLIMIT_DATA, resource.RLIMIT_AS))  # fmt: skip


#: The C library (glibc's ``malloc_trim``; on another C library the trim is skipped).
_LIBC = ctypes.CDLL(None)


def _seeded(shape: torch.Size, dtype: torch.dtype, how: str, state: torch.Tensor | None
            ) -> torch.Tensor:  # fmt: skip
    if how == "zero":
        return torch.zeros(shape, dtype=dtype).float()
    if how == "one":
        return torch.ones(shape, dtype=dtype).float()
    gen = torch.Generator()
    gen.set_state(state)  # type: ignore[arg-type]
    return random_like(shape, dtype, torch.device("cpu"), gen).float()


def _seed_handles(real: nn.Module, seed: int) -> dict[int, Lazy]:
    """Parameter id -> a handle that makes it as :func:`seed_weights` would: the generator
    advanced past each random one exactly as ``random_like`` draws (its pool), state kept."""
    gen = torch.Generator().manual_seed(seed)
    names = {id(p): n for n, p in real.named_parameters()}
    handles: dict[int, Lazy] = {}
    for p, how in seed_order(real):
        state = None
        if how == "random":
            state = gen.get_state()
            pool = torch.empty(min(p.numel(), RANDOM_POOL), dtype=p.dtype)
            pool.normal_(0.0, 0.02, generator=gen)  # what random_like draws for p
        make = functools.partial(_seeded, p.shape, p.dtype, how, state)
        handles[id(p)] = Lazy(names.get(id(p), "?"), make)
    return handles


def _read(pool: ShardPool, source: Source) -> torch.Tensor:
    return pool.read(source).float() if source.dtype.is_floating_point else pool.read(source)


def stream_state(
    module: nn.Module, seed: int, folder: Path, pool: ShardPool
) -> tuple[dict[str, Any], str]:
    """Qualified name -> a :class:`Lazy` handle for each parameter (a real tensor for each
    buffer), and where the weights come from, in words. Shards are read through ``pool``,
    which the caller closes after the run.

    >>> import json, tempfile
    >>> from safetensors.torch import save_file
    >>> from ampgraph.model.build import load_model
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1,
    ...     "n_embd": 8, "n_head": 2, "vocab_size": 16, "n_positions": 8}))
    >>> model = load_model(str(folder), seq_len=4).module
    >>> save_file({"wte.weight": torch.ones(16, 8)}, str(folder / "model.safetensors"))
    >>> with ShardPool() as pool:
    ...     state, said = stream_state(model, 0, folder, pool)
    ...     state["transformer.wte.weight"], state["transformer.wte.weight"].load().sum().item()
    (Lazy('transformer.wte.weight'), 128.0)
    >>> said                                                         # doctest: +ELLIPSIS
    '1 tensor from 1 safetensors file; seeded (seed 0): ...; read one weight at a time'
    """
    _map_blocks_where_data_limited()
    with meta_parameters():
        real = build_real(module)
    built = made_buffers(module, real)
    loaded, sources = check_checkpoint(real, folder)
    named = named_tensors(real)
    handles = _seed_handles(real, seed)
    for name, source in sources.items():  # the files' values win over the seed's
        handles[id(named[name])] = Lazy(name, functools.partial(_read, pool, source))
    state: dict[str, Any] = {}
    for name, t in named.items():
        if id(t) in handles:
            state[name] = handles[id(t)]
        elif t.is_meta:  # a non-floating parameter: not seeded in memory either
            state[name] = torch.zeros(t.shape, dtype=t.dtype)
        else:
            state[name] = t.detach().float() if t.is_floating_point() else t.detach()
    source_text = describe_weights(real, built, seed, folder, loaded)
    return state, f"{source_text}; read one weight at a time"


def should_stream(
    module: nn.Module, folder: Path | None, *, train: bool, force: bool, asked: bool | None
) -> bool:
    """Whether to run one weight at a time: ``asked`` (True, False), or by default where the
    fp32 weights do not fit (:func:`~ampgraph.ranges.weights.check_memory`'s share of the free
    memory) and come from a folder's shards. ``force`` keeps the run in memory.

    >>> should_stream(torch.nn.Linear(2, 2), None, train=False, force=False, asked=None)
    False
    """
    if asked is None:
        if force or train or not can_stream(folder):
            return False
        free = free_memory()
        return free is not None and weight_bytes(module, torch.float32) > MEMORY_SHARE * free
    if asked and (train or not can_stream(folder)):
        raise RangesError(
            "ranges reads one weight at a time only from a model folder's .safetensors shards, "
            "in the forward pass"
        )
    return asked


def can_stream(folder: Path | None) -> bool:
    """Whether ``folder`` has safetensors weights to read one at a time.

    >>> can_stream(None), can_stream(Path("/nonexistent"))
    (False, False)
    """
    if folder is None:
        return False
    return os.path.lexists(folder / "model.safetensors.index.json") or any(
        folder.glob("*.safetensors")
    )


__all__ = [
    "Lazy", "can_stream", "meta_parameters", "return_freed_memory", "should_stream",
    "stream_state",
]
