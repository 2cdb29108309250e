"""Real fp32 weights for the reference run: the module's own, a folder's safetensors, or seeded.

Where the weights come from, in order:

* a module whose parameters are real already (a ``--module`` factory that built or loaded them):
  those, as fp32 copies where they are 16-bit;
* otherwise the model is built for real on the CPU (Hugging Face models with their own code but
  without their slow initialisation, so buffers such as rotary frequencies are right) and its
  parameters are seeded the way Hugging Face initialises them: normal(0, ``initializer_range``)
  for weights, zeros for biases, ones for normalisation weights;
* then, given a model folder, its ``*.safetensors`` shards, every tensor checked against the
  model before one is read, then read one at a time (:mod:`ampgraph.ranges.checkpoint`; never a
  pickle: ``*.bin`` files are not opened).

The weights line says where each tensor came from: the files, the model's own code (buffers such
as rotary frequencies, computed when the model is built), or the seed.

Before any of it, :func:`check_memory` refuses in one line a model whose fp32 weights do not fit
this process's free memory, with the estimate (a model folder's are then read one weight at a
time instead: :mod:`ampgraph.ranges.stream`).

>>> import torch
>>> state, source = real_state(torch.nn.Linear(2, 2), seed=0)
>>> sorted(state), source
(['bias', 'weight'], "the module's own weights")
"""

from __future__ import annotations

import contextlib
import copy
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ampgraph.ranges.data import RangesError
from ampgraph.verify.device import available_memory, weight_bytes
from ampgraph.verify.tensors import random_like

if TYPE_CHECKING:
    from ampgraph.ranges.checkpoint import Loaded

#: Share of the free memory the fp32 weights may take (the activations need the rest).
MEMORY_SHARE = 0.7


def free_memory() -> int | None:
    """Bytes this process may still take: the machine's available memory, less where a limit
    set on the process (``ulimit -d`` / ``-v``, a container's rlimit) leaves less room.

    >>> free_memory() is None or free_memory() > 0
    True
    """
    free = available_memory(torch.device("cpu"))
    status = _status()
    for limit, field in ((resource.RLIMIT_DATA, "VmData"), (resource.RLIMIT_AS, "VmSize")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and field in status:
            room = max(soft - status[field], 0)
            free = room if free is None else min(free, room)
    return free


def _status() -> dict[str, int]:
    """This process's memory figures from /proc/self/status, in bytes (empty where unknown)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if value.strip().endswith("kB"):
                    found[key] = int(value.split()[0]) * 1024
    return found


def check_memory(
    module: nn.Module, name: str, *, force: bool = False, gradients: bool = False
) -> int:
    """The fp32 weights' bytes (twice that with ``gradients``: each weight's ``.grad`` too, for
    ``--pass train``); one-line :class:`RangesError` when they cannot fit in memory.

    >>> check_memory(torch.nn.Linear(4, 2), "linear")      # 10 fp32 numbers
    40
    >>> check_memory(torch.nn.Linear(4, 2), "linear", gradients=True)
    80
    """
    need = weight_bytes(module, torch.float32) * (2 if gradients else 1)
    free = free_memory()
    what = "weights and their gradients" if gradients else "weights"
    if free is not None and need > MEMORY_SHARE * free and not force:
        raise RangesError(
            f"ranges runs {name} in fp32 on the CPU: about {need / 1e9:.1f} GB of {what}, and "
            f"this machine has {free / 1e9:.1f} GB free; "
            + ("" if gradients else "give its model folder (its .safetensors shards are read "
               "one weight at a time), ")
            + "use a smaller model of the same family, or --force"
        )
    return need


def _is_real(module: nn.Module) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [*module.parameters(), *module.buffers()]
    return bool(tensors) and not any(t.is_meta or isinstance(t, FakeTensor) for t in tensors)


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Hugging Face's own switch that skips weight initialisation (we seed the weights after)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x kept it in modeling_utils
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            no_init_weights = contextlib.nullcontext
    with no_init_weights():
        yield


def build_real(module: nn.Module) -> nn.Module:
    """The same model with real (uninitialised) tensors on the CPU, buffers computed.

    >>> real = build_real(torch.nn.Linear(2, 2, device="meta"))
    >>> real.weight.device, real.weight.is_meta
    (device(type='cpu'), False)
    """
    config = getattr(module, "config", None)
    if config is not None and hasattr(module, "post_init"):
        with _no_init(), torch.device("cpu"):
            real = type(module)(config)
        if hasattr(real, "tie_weights"):
            real.tie_weights()
        return real.train(module.training)
    real = copy.deepcopy(module).to_empty(device="cpu")
    for sub in real.modules():
        if hasattr(sub, "reset_running_stats"):
            sub.reset_running_stats()  # batch norm: mean 0, variance 1
    return real


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def seed_order(module: nn.Module) -> Iterator[tuple[nn.Parameter, str]]:
    """Each floating parameter once, in the order they are seeded, with how: ``zero`` (biases),
    ``one`` (normalisation weights) or ``random`` (drawn from the seed's generator, in this
    order: a block-by-block run replays it to make each weight alone, as the same numbers)."""
    seen: set[int] = set()
    for sub in module.modules():
        for pname, p in sub.named_parameters(recurse=False):
            if id(p) in seen or not p.is_floating_point():
                continue
            seen.add(id(p))
            if pname.endswith("bias"):
                yield p, "zero"
            elif _is_norm(sub) and p.dim() == 1:
                yield p, "one"
            else:
                yield p, "random"


def seed_weights(module: nn.Module, seed: int) -> None:
    """Hugging Face's initialisation, seeded: normal(0, 0.02) weights (tiled from a pool of
    random numbers, as ``verify`` does), zero biases, ones for normalisation weights."""
    gen = torch.Generator().manual_seed(seed)
    for p, how in seed_order(module):
        with torch.no_grad():
            if how == "zero":
                p.zero_()
            elif how == "one":
                p.fill_(1.0)
            else:
                p.copy_(random_like(p.shape, p.dtype, p.device, gen))


def named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by qualified name, a tied one under each of its names.

    >>> sorted(named_tensors(torch.nn.BatchNorm1d(2)))
    ['bias', 'num_batches_tracked', 'running_mean', 'running_var', 'weight']
    """
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return named


def _names(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 4 more``: a line's worth of tensor names.

    >>> _names(["a", "b", "c", "d", "e"])
    'a, b, c and 2 more'
    """
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"


def made_buffers(module: nn.Module, real: nn.Module) -> list[tuple[list[str], str]]:
    """The buffers the real model made itself (no file, no seed), grouped by how, in words.

    >>> made_buffers(torch.nn.Linear(1, 1), torch.nn.BatchNorm1d(2))    # doctest: +ELLIPSIS
    [(['running_mean', 'running_var', 'num_batches_tracked'], 'reset (batch-norm statistics: ...)')]
    """
    hf = getattr(module, "config", None) is not None and hasattr(module, "post_init")
    groups: dict[str, list[str]] = {}
    seen: set[int] = set()
    for sub_name, sub in real.named_modules():
        for name, b in sub.named_buffers(recurse=False):
            if id(b) in seen:
                continue
            seen.add(id(b))
            if hf:
                how = "computed by the model's code"  # rotary frequencies, position ids, masks
            elif hasattr(sub, "reset_running_stats"):
                how = "reset (batch-norm statistics: mean 0, variance 1)"
            else:
                how = "left as torch.empty made them (not seeded)"
            groups.setdefault(how, []).append(f"{sub_name}.{name}" if sub_name else name)
    return [(names, how) for how, names in groups.items()]


def describe_weights(
    real: nn.Module, built: list[tuple[list[str], str]], seed: int, folder: Path | None,
    loaded: Loaded | None,
) -> str:  # fmt: skip
    """Where each tensor came from, in words: the files (``loaded``: what a checkpoint gave),
    the model's own code (``built``: :func:`made_buffers`), or the seed.

    >>> describe_weights(torch.nn.Linear(1, 1), [], 7, None, None)
    'seeded random weights (seed 7)'
    """
    named = named_tensors(real)
    files = loaded.files if loaded is not None else []
    from_files = {id(named[n]) for n in loaded.loaded} if loaded is not None else set()
    seen = from_files | {id(named[n]) for names, _ in built for n in names}
    seeded = [n for n, p in real.named_parameters() if id(p) not in seen]
    if not files or loaded is None:
        parts = [f"seeded random weights (seed {seed})"]
    else:
        n = len(loaded.loaded)
        text = f"{n} tensor{'s' * (n != 1)} from {len(files)} safetensors file" + "s" * (
            len(files) != 1
        )
        widened = ", ".join(f"{n} {d}" for d, n in sorted(loaded.widened.items()))
        text += f" ({widened} widened to fp32 exactly)" if widened else ""
        text += f" ({loaded.ignored} tensors of the files not the model's: ignored)" * bool(
            loaded.ignored
        )
        parts = [text] + [f"seeded (seed {seed}): {_names(seeded)}"] * bool(seeded)
    for names, how in built:
        made = [n for n in names if id(named[n]) not in from_files]
        parts += [f"{how}: {_names(made)}"] * bool(made)
    if folder is not None and not files:
        parts.append(f"no *.safetensors in {folder} (pickle files are never read)")
    return "; ".join(parts)


def real_state(
    module: nn.Module, seed: int, folder: Path | None = None
) -> tuple[dict[str, torch.Tensor], str]:
    """Qualified parameter/buffer name -> a real CPU tensor (floating ones fp32), and where the
    weights came from, in words: which tensors the files held, which the model's code computed
    (rotary frequencies) and which were seeded."""
    if _is_real(module):
        state = named_tensors(module)
        source = "the module's own weights"
    else:
        from ampgraph.ranges.checkpoint import load_safetensors

        real = build_real(module)
        built = made_buffers(module, real)
        seed_weights(real, seed)
        loaded = load_safetensors(real, folder) if folder is not None else None
        source = describe_weights(real, built, seed, folder, loaded)
        state = named_tensors(real)
    return {
        k: v.detach().float() if v.is_floating_point() else v.detach() for k, v in state.items()
    }, source


__all__ = [
    "MEMORY_SHARE", "build_real", "check_memory", "describe_weights", "made_buffers",
    "named_tensors", "real_state", "seed_order", "seed_weights",
]  # fmt: skip
