"""Values a real run computes shapes from: a model's small integer buffers, followed on their
real values while the forward is traced on fake tensors.

A capture swaps every parameter and buffer for a fake tensor, which has a shape and a dtype and no
values. Some models keep sizes in buffers: EnCodec's convolutions hold ``kernel_size`` and
``stride`` as 0-d int64 buffers and pad their input by ``kernel_size - stride`` and by an extra
length computed from them with ``torch.ceil``. On fake tensors each such value is an unknown
(``Eq(u0, 1)`` where the code compares two of them, a zero-length convolution input further
on), where a real run simply knows it. :class:`KnownValues` is a ``TorchFunctionMode`` that
carries, beside each fake tensor made from such a buffer, the buffer's real value; every torch
call whose tensors all carry one is computed on the real values too, and a call that reads a
value into Python (``int()``, ``bool()``, ``.item()``, ``.tolist()``, a size argument) gets the
real one: the trace takes the path and the sizes a real run takes, with the computed values as
constants of the graph, as export bakes any Python number. Integer and bool buffers of at
most :data:`LIMIT` elements of a model built for real are followed: sizes, strides and counts.

The example inputs' integer and bool tensors of at most :data:`INPUT_LIMIT` elements are followed
too (:func:`remembering` with ``limit``), and so are the tensors a forward makes from Python
numbers alone (``torch.ones(shape)``, ``torch.arange(n)``): a real run decides from their values
(transformers drops an all-ones ``attention_mask`` before the attention, and the scores stay bf16
under autocast; a vision embedding splits its patches by the counts it reads from its grid), and
so does the capture. Model code that asks whether it is being traced before it reads such a value
gets a real run's answer (:func:`real_run_answers`). Floating inputs are data the graph computes
on, never followed.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> real = torch.tensor(5)
>>> with FakeTensorMode() as mode:
...     fake = torch.empty((), dtype=torch.int64)
>>> with KnownValues({id(fake): (fake, real)}), mode:
...     int((fake - 2) * 3)
9
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ampgraph.compat import unbacked_value_setter

#: The most elements a followed buffer may have.
LIMIT = 64
#: The most elements a followed input, or a value computed from followed ones, may have: a
#: memory bound (64 Ki elements, 512 KiB in int64), far above a padding mask's batch x length.
INPUT_LIMIT = 1 << 16

#: Calls that make a tensor from Python numbers alone, the same values in every run: followed.
FACTORIES = frozenset({"ones", "zeros", "full", "arange", "tensor", "eye", "as_tensor"})
#: Calls that make a tensor of unset values from sizes alone, which the forward then writes
#: (ERNIE-VL's resampler: ``offsets = torch.empty(n)``, ``offsets[0] = 0``, ``offsets[1:] =
#: counts.cumsum(0)[:-1]``, then ``torch.arange`` between them): followed as the writes set them,
#: from zeros where a real run has whatever the allocator gave (no value the code reads).
UNSET = frozenset({"empty"})

#: Calls that read a tensor's value into Python: answered from the real value.
VALUE_READS = frozenset({
    "item", "__index__", "__int__", "__bool__", "__float__", "tolist", "__format__",
})  # fmt: skip


def follows(tensor: torch.Tensor, limit: int = LIMIT) -> bool:
    """Whether a capture follows ``tensor``'s real value: an integer or bool buffer (or input) of
    at most ``limit`` elements, held for real (not on meta, not fake).

    >>> follows(torch.tensor(3)), follows(torch.tensor(0.5))
    (True, False)
    >>> follows(torch.zeros(LIMIT + 1, dtype=torch.int64))
    False
    >>> follows(torch.ones(2, 512, dtype=torch.int64), INPUT_LIMIT)
    True
    """
    from torch._subclasses.fake_tensor import FakeTensor

    return not (
        isinstance(tensor, (nn.Parameter, FakeTensor))
        or tensor.is_meta
        or tensor.is_floating_point()
        or tensor.is_complex()
        or tensor.numel() > limit
    )


def _on_cpu(item: Any) -> Any:
    """``item`` as a CPU device where it names another one (the real values are on the CPU; the
    fake tensors on the setting's device, a CUDA one without a GPU)."""
    if isinstance(item, torch.device) and item.type != "cpu":
        return torch.device("cpu")
    if isinstance(item, str) and item.split(":")[0] in ("cuda", "xpu", "mps", "meta", "hpu"):
        return "cpu"
    return item


def _real(call: Any, args: Any, kwargs: Any) -> Any:
    """``call`` on real CPU tensors, past every mode of the trace (fake tensors, the tracer)."""
    args, kwargs = pytree.tree_map(_on_cpu, (args, kwargs))
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return call(*args, **kwargs)


class KnownValues(TorchFunctionMode):
    """Fake tensors with their real values beside them (see the module docstring): ``known``
    maps ``id(fake)`` to ``(fake, real)``; values computed from them are added as the forward
    runs, for as long as the mode lasts."""

    def __init__(self, known: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        # Shared with :func:`remembering`, which fills it as the tensors are swapped. The fake
        # tensor is kept with its value, so that its id is not reused while this lasts.
        self._known = known
        #: The value of each data-dependent size (``u0``) an op on followed values made
        #: (``repeat_interleave`` by a grid's counts): what the replays give the same sizes.
        self.sizes: dict[str, int] = {}
        self._symbols: dict[Any, int] = {}  # the same, by sympy symbol

    @property
    def known(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The followed tensors, ``id(fake) -> (fake, real)`` (what :func:`remembering` fills)."""
        return self._known

    def value(self, t: Any) -> torch.Tensor | None:
        """``t``'s real value, or None where it carries none."""
        pair = self._known.get(id(t)) if isinstance(t, torch.Tensor) else None
        return pair[1] if pair is not None and pair[0] is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        if getattr(func, "__name__", "") in FACTORIES | UNSET and not any(
            isinstance(t, torch.Tensor) for t in leaves
        ):
            return self._made(func, args, kwargs)
        if not self._known:  # nothing followed yet: nothing to look for
            return func(*args, **kwargs)
        # A slice's bounds too (``hidden[:length]``): pytree takes a slice for a leaf.
        bounds = pytree.tree_map_only(slice, lambda s: (s.start, s.stop, s.step), (args, kwargs))
        tensors = [t for t in pytree.tree_leaves(bounds) if isinstance(t, torch.Tensor)]
        values = [self.value(t) for t in tensors]
        if not tensors or not any(v is not None for v in values):
            return func(*args, **kwargs)
        # A followed bound of a slice is read as a number, here as in a real run.
        args, kwargs = pytree.tree_map_only(slice, self._slice, (args, kwargs))
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        values = [self.value(t) for t in tensors]
        if not tensors:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name == "new_tensor" and values[0] is None and None not in values[1:]:
            # ``h.new_tensor(data)`` of followed elements: ``h`` gives a dtype and a device,
            # never a value, so the data's values are the new tensor's, as in a real run.
            like = _real(torch.empty, ((),), {"dtype": args[0].dtype})
            data_args, data_kwargs = pytree.tree_map_only(
                torch.Tensor, self.value, (args[1:], kwargs)
            )
            return self._computed(func, args, kwargs, (like, *data_args), data_kwargs)
        if any(v is None for v in values):
            # A value the call takes as a size (``F.pad(x, (left, right))``): its real number.
            # Each argument is looked into, never the call's own tuple of arguments (``a + b``
            # of a followed 0-d ``a`` is an op on it, not a size).
            def sizes(arg: Any) -> Any:
                return pytree.tree_map_only(
                    (list, tuple), self._sizes, arg, is_leaf=_is_size_list
                )

            # A followed 0-d tensor where the op takes an integer (``torch.multinomial(p, n)``,
            # ViLT's ``n`` a count it computed from the pixel mask): torch reads its value in
            # C++, past this mode, into a size with no value; the real number, as a real run.
            positions, names = _int_arguments(getattr(func, "__name__", ""))
            args = tuple(
                self._number(a) if i in positions else sizes(a) for i, a in enumerate(args)
            )
            kwargs = {k: self._number(v) if k in names else sizes(v) for k, v in kwargs.items()}
            self._forget_written(name, args, kwargs)  # written from values it does not know
            return func(*args, **kwargs)
        real_args, real_kwargs = pytree.tree_map_only(torch.Tensor, self.value, (args, kwargs))
        if name in VALUE_READS:
            return _real(func, real_args, real_kwargs)
        if name == "unbind" and (args[1] if args[1:] else kwargs.get("dim", 0)) == 0:
            # ``for row in t`` and a fake tensor's ``tolist()``: by rows, as many as the real
            # value has, each 0-d where the size depends on the values (fake ``unbind`` splits
            # such a size into pieces of a size it cannot tell is 1).
            return tuple(self._rows(args[0], real_args[0]))
        # A followed 0-d tensor where the op takes a number (``torch.arange(start, end)``
        # between offsets a forward computed from its grid, ERNIE-VL's resampler): torch reads
        # its value in C++, which on a fake tensor is a new unknown per read, and the output's
        # size a difference of unknowns no value is ever given for; a real run reads the
        # number, and so does the trace.
        positions, names = _int_arguments(name, SCALAR)
        args = tuple(self._number(a) if i in positions else a for i, a in enumerate(args))
        kwargs = {k: self._number(v) if k in names else v for k, v in kwargs.items()}
        return self._computed(func, args, kwargs, real_args, real_kwargs)

    def _forget_written(self, name: str, args: Any, kwargs: Any) -> None:
        """Stop following the tensor an in-place call writes (``t[i] = v``, ``t.copy_(v)``,
        ``out=``) where its real value is not written too: a tensor ``torch.empty`` or
        ``torch.zeros`` made is followed, and a write of values the capture does not know
        (float data, an unfollowed index) would leave the real copy stale, a wrong value read
        where a real run reads the written one."""
        written = [kwargs.get("out")]
        if args and (name == "__setitem__" or (name.endswith("_") and not name.startswith("_"))):
            written.append(args[0])
        for t in pytree.tree_leaves(written):
            if self.value(t) is not None:
                del self._known[id(t)]

    def _rows(self, fake: torch.Tensor, real: torch.Tensor) -> list[torch.Tensor]:
        """``fake``'s rows, each followed: as many as ``real`` has (a fake tensor of a size that
        depends on the values has none it can count by itself)."""
        rows = []
        for i, real_row in enumerate(_real(torch.unbind, (real,), {})):
            row = fake[i]
            self._known[id(row)] = (row, real_row)
            rows.append(row)
        return rows

    def _computed(
        self, func: Any, args: Any, kwargs: Any, real_args: Any, real_kwargs: Any,
        real_func: Any = None,
    ) -> Any:  # fmt: skip
        """``func``'s traced output, each tensor of it noted with its value on the real ones
        (computed by ``real_func`` where given)."""
        out = func(*args, **kwargs)
        fakes = pytree.tree_leaves(out)
        # A count computed from known sizes (``torch.ones(v)``) is checked at its value.
        if not all(_small(t, self._size) for t in fakes if isinstance(t, torch.Tensor)):
            return out  # beyond the memory bound
        try:
            # A random op (ViLT's torch.multinomial) draws its own values, from a copy of the
            # generator's state: the capture leaves the caller's random stream where it was.
            with torch.random.fork_rng(devices=[]):
                real_out = _real(real_func or func, real_args, real_kwargs)
        except Exception:  # noqa: BLE001 - not computable on the CPU values: no longer followed
            self._forget_written(getattr(func, "__name__", ""), args, kwargs)
            return out
        reals = pytree.tree_leaves(real_out)
        for fake, real in zip(fakes, reals) if len(fakes) == len(reals) else ():
            if (
                isinstance(fake, torch.Tensor)
                and isinstance(real, torch.Tensor)
                and real.numel() <= INPUT_LIMIT
                and self._sized(fake, real)
            ):
                self._known[id(fake)] = (fake, real)
        return out

    def _sized(self, fake: torch.Tensor, real: torch.Tensor) -> bool:
        """Whether ``fake`` has ``real``'s shape, each data-dependent size of it (an op whose
        output size depends on the values: ``repeat_interleave``, ``unique``) given the real
        one, as a real run has it."""
        if fake.dim() != real.dim():
            return False
        env = getattr(getattr(fake, "fake_mode", None), "shape_env", None)
        for size, value in zip(fake.shape, real.shape):
            if not isinstance(size, torch.SymInt):
                if size != value:
                    return False
                continue
            expr = size.node.expr
            if expr.is_Symbol and str(expr).startswith("u") and env is not None:
                getattr(env, unbacked_value_setter())(expr, int(value))
                self.sizes[str(expr)] = int(value)
                self._symbols[expr] = sympy.Integer(int(value))
                continue
            # A size computed from such sizes (``u0 + 1`` past a pad): known once they are.
            known = sympy.sympify(expr.xreplace(self._symbols))
            if not (known.is_number and int(known) == value):
                return False
        return True

    def _made(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A tensor made from Python numbers alone, followed where its size is within bounds:
        a size that depends on followed values (``torch.ones(v)`` of a ``v`` read from the
        size of a boolean-mask index, ViLT's patch weights) is made real in its value; a size
        that is itself unknown leaves it unfollowed."""
        real_args, real_kwargs = pytree.tree_map_only(torch.SymInt, self._size, (args, kwargs))
        if any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((real_args, real_kwargs))):
            return func(*args, **kwargs)
        real_func = _zeroed if getattr(func, "__name__", "") in UNSET else None
        return self._computed(func, args, kwargs, real_args, real_kwargs, real_func)

    def _size(self, size: torch.SymInt) -> int | torch.SymInt:
        """``size``'s value where the sizes it is computed from are known, else ``size``."""
        known = sympy.sympify(size.node.expr.xreplace(self._symbols))
        return int(known) if known.is_number else size

    def _number(self, item: Any) -> Any:
        """``item`` as its Python number where it is a followed 0-d integer tensor."""
        value = self.value(item)
        if value is None or value.dim() != 0 or value.is_floating_point():
            return item
        return _real(torch.Tensor.item, (value,), {})

    def _slice(self, item: slice) -> slice:
        """``item`` with each followed 0-d integer bound as its Python number: torch reads a
        slice's bounds as integers, in C++ past this mode (``hidden[:length]`` of a length
        computed from a padding mask, pe_audio_video's alignment), as a real run does.

        >>> import torch
        >>> t = torch.tensor(3)
        >>> KnownValues({id(t): (t, t)})._slice(slice(None, t))
        slice(None, 3, None)
        """
        return slice(self._number(item.start), self._number(item.stop), self._number(item.step))

    def _sizes(self, seq: Any) -> Any:
        """``seq`` with each followed 0-d tensor in it as its Python number."""
        made = [
            _real(torch.Tensor.item, (v,), {})
            if (v := self.value(item)) is not None and v.dim() == 0 and not v.is_floating_point()
            else item
            for item in seq
        ]
        return type(seq)(made) if isinstance(seq, tuple) and not hasattr(seq, "_fields") else made


def _zeroed(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.empty(*args, **kwargs)`` with its values set to zero (real, on the CPU)."""
    return torch.empty(*args, **kwargs).zero_()


def _small(t: torch.Tensor, value: Callable[[Any], Any] = lambda n: n) -> bool:
    """Whether ``t`` has at most :data:`INPUT_LIMIT` elements, or a number of them that depends
    on values still unknown (the real output's count is checked once it is computed);
    ``value`` gives a symbolic count's value where it is known."""
    numel = t.numel()
    numel = value(numel) if isinstance(numel, torch.SymInt) else numel
    return not isinstance(numel, int) or numel <= INPUT_LIMIT


def remembering(
    make: Callable[[torch.Tensor], torch.Tensor],
    known: dict[int, tuple[torch.Tensor, torch.Tensor]],
    limit: int = LIMIT,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``make`` (a capture's maker of fake parameters and buffers, or of its inputs with
    ``limit=INPUT_LIMIT``), noting in ``known`` each fake tensor made from a tensor
    :func:`follows` within ``limit``, with a copy of its real value."""

    def make_and_remember(t: torch.Tensor) -> torch.Tensor:
        new = make(t)
        if follows(t, limit):
            known[id(new)] = (new, t.detach().clone())
        return new

    return make_and_remember


@contextlib.contextmanager
def real_run_answers(values: KnownValues) -> Iterator[None]:
    """While it lasts, transformers' questions "is this traced?" get a real run's answer where
    the capture has the values they guard: ``is_tracing(t)`` is false for a fake tensor that
    ``values`` follows, and ``is_torchdynamo_exporting()`` is false, as in a real run.

    transformers reads a mask's values only where neither says tracing (``masking_utils``:
    ``not (is_torchdynamo_exporting() or is_tracing(padding_mask)) and padding_mask.all()``), so
    on fake tensors it always built the mask a real run drops when no token is padded: the mask
    (fp32) then promoted the bf16 attention scores under autocast, a silent wrong answer (issue
    42). A fake tensor without known values is still "traced" (its values cannot be read), so
    the mask built then is export's, as before. Nothing is changed where transformers is not
    imported; the functions are put back on exit.

    >>> with real_run_answers(KnownValues({})):
    ...     pass
    """
    utils = sys.modules.get("transformers.utils.import_utils")
    if utils is None or not hasattr(utils, "is_fake_tensor"):
        yield
        return
    fake_check, exporting = utils.is_fake_tensor, getattr(utils, "is_torchdynamo_exporting", None)

    def is_fake_tensor(x: Any) -> bool:
        return bool(fake_check(x)) and values.value(x) is None

    def is_torchdynamo_exporting() -> bool:
        return False

    # Modules import the function by name (``from .utils.import_utils import ...``).
    swaps = [(utils, "is_fake_tensor", fake_check, is_fake_tensor)] + [
        (module, "is_torchdynamo_exporting", exporting, is_torchdynamo_exporting)
        for name, module in list(sys.modules.items())
        if exporting is not None
        and name.startswith("transformers")
        and vars(module).get("is_torchdynamo_exporting") is exporting
    ]
    try:
        for module, name, _, new in swaps:
            setattr(module, name, new)
        yield
    finally:
        for module, name, old, _ in swaps:
            setattr(module, name, old)


#: The argument types torch reads a number from: integers...
INT = ("int", "SymInt")
#: ...and any number (a ``Scalar``: ``torch.arange``'s bounds, ``torch.full``'s value).
SCALAR = (*INT, "number")


@functools.cache
def _int_arguments(
    name: str, kinds: tuple[str, ...] = INT
) -> tuple[frozenset[int], frozenset[str]]:
    """The positions and names of the arguments that every ATen overload called ``name`` takes
    as one of ``kinds`` (an integer: ``int``, ``SymInt``), never as a tensor: where torch reads a
    0-d tensor given there as its value.

    >>> _int_arguments("multinomial")
    (frozenset({1}), frozenset({'num_samples'}))
    >>> _int_arguments("add"), _int_arguments("not_an_op")
    ((frozenset(), frozenset()), (frozenset(), frozenset()))
    >>> _int_arguments("arange"), _int_arguments("arange", SCALAR)[0]
    ((frozenset(), frozenset()), frozenset({0, 1, 2}))
    """
    packet = getattr(torch.ops.aten, name, None) if name and not name.startswith("_") else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return frozenset(), frozenset()
    positions: dict[int, bool] = {}
    names: dict[str, bool] = {}
    for overload in packet.overloads():
        for i, arg in enumerate(getattr(packet, overload)._schema.arguments):
            is_int = str(getattr(arg, "real_type", arg.type)) in kinds
            if not arg.kwarg_only:
                positions[i] = positions.get(i, True) and is_int
            names[arg.name] = names.get(arg.name, True) and is_int
    return (
        frozenset(i for i, ok in positions.items() if ok),
        frozenset(n for n, ok in names.items() if ok),
    )


def _is_size_list(node: Any) -> bool:
    """A list or tuple of numbers and 0-d tensors: what torch reads as sizes."""
    return isinstance(node, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dim() == 0 for i in node
    ) and all(isinstance(i, (int, torch.Tensor)) for i in node)


def following_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], values: KnownValues
) -> Callable[[tuple[Any, ...], dict[str, Any]], None]:
    """What notes the inputs export's forward is called with (export makes fake inputs of its
    own) as followed in ``values`` where the example inputs ``args`` and ``kwargs`` at the same
    places are followed (:func:`remembering` with :data:`INPUT_LIMIT`)."""

    # Copied here, not in the traced forward, where the copy would be ops of the graph.
    copy = functools.partial(
        pytree.tree_map_only,
        torch.Tensor,
        lambda t: t.detach().clone() if follows(t, INPUT_LIMIT) else None,
    )
    examples_args, examples_kwargs = copy(args), copy(kwargs)

    def pairs(arrived: Any, example: Any) -> Iterator[tuple[Any, Any]]:
        leaves, examples = pytree.tree_leaves(arrived), pytree.tree_leaves(example)
        return zip(leaves, examples) if len(leaves) == len(examples) else iter(())

    def note(called: tuple[Any, ...], named: dict[str, Any]) -> None:
        arrived = [*pairs(called, examples_args)]
        arrived += [p for k, v in named.items() for p in pairs(v, examples_kwargs.get(k))]
        for new, real in arrived:
            if (
                isinstance(real, torch.Tensor)
                and isinstance(new, torch.Tensor)
                and new.shape == real.shape
            ):
                values.known[id(new)] = (new, real)

    return note


__all__ = [
    "FACTORIES", "INPUT_LIMIT", "LIMIT", "UNSET", "VALUE_READS", "KnownValues", "follows",
    "following_inputs", "real_run_answers", "remembering",
]
