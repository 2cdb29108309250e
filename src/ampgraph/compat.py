"""The releases ampgraph supports, and every difference between them that its code depends on.

One place for what changes from one torch (or torchvision) release to the next: each difference is
one function or table here that names the releases it concerns and why, so that the stages call it
and hold no version tests or ``try: import`` of their own. The supported range itself
(:data:`TORCH_RANGE`, :data:`TRANSFORMERS_RANGE`) is read from the installed packages' metadata,
without importing torch, so ``import ampgraph`` and the command line can say in one line that a
release is outside it (:func:`support_message`).

Where the floor is, and why: torch 2.9. Every minor release from 2.9.1 to 2.14.1 runs the
engines, the annotation, ``check``, ``verify --device cpu`` and the training pass
(``docs/support-matrix.md``, made by ``scripts/support_matrix.py``). On 2.9 that needs three
differences made up: without a GPU driver, fake CUDA tensors reach the driver from C++ where 2.10
gives them a driverless CUDA device guard (``FakeTensorMode.__enter__`` ->
``c10::impl::ensureCUDADeviceGuardSet``) and reads a device property it cannot get as "not
supported" (:func:`fake_cuda_needs_help`, done by ``capture/driverless_29.py``); 2.9's ``make_fx``
decomposes composites that have a kernel of their own (:func:`make_fx_keeps_fused_kernels`);
its meta ``native_layer_norm_backward`` mistypes mixed-dtype gradients
(:func:`layer_norm_backward_meta_is_right`). torch 2.8 and older are not tried; torch 2.6 also lacks
``guard_or_true`` (kept up below). A floor that CI proves (``make test-floor``) is worth more
than one hoped for.

>>> version_tuple("2.11.0+cu130"), version_tuple("2.14.1"), version_tuple("5.0.0rc1")
((2, 11, 0), (2, 14, 1), (5, 0, 0))
>>> print(support_message("torch", "2.8.0").replace("; ", ";\\n"))
ampgraph supports torch 2.9 to 2.14.1;
this is torch 2.8.0: pip install 'torch>=2.9,<=2.14.1'
>>> support_message("torch", "2.11.0+cu130") is None
True
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Final, NamedTuple


class Range(NamedTuple):
    """A package's supported releases: from ``floor`` up to ``tested`` (the newest tried)."""

    package: str
    floor: str
    tested: str
    #: The ``pip install`` argument that gets a supported release.
    spec: str


#: torch: the floor CI runs the quick suite on (``make test-floor``), the newest release tried.
TORCH_RANGE: Final = Range("torch", "2.9", "2.14.1", "torch>=2.9,<=2.14.1")
#: transformers: 5.17 (the first GPU machine's, fact 18) to 5.24. Older 5.x lines fail on models
#: ampgraph bundles: 5.0.0's ``PhiConfig`` has no ``pad_token_id``; 5.1.0's Jamba asks for
#: mamba's CUDA kernels and its outputs have no pytree ``flatten_with_keys_fn`` (the training
#: pass). A transformers outside the range is warned of, not refused: the model code is its own.
#: 4.x's ``transformers.utils.fx`` is the hf-fx tracer's, laid over in a side environment by
#: ``scripts/hf_fx_env.sh``, and not warned of.
TRANSFORMERS_RANGE: Final = Range("transformers", "5.17", "5.24", "transformers>=5.17,<6")


def version_tuple(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: ``"2.11.0+cu130"`` -> ``(2, 11, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed_version(package: str) -> str | None:
    """``package``'s installed version from its metadata (no import), or None if it is absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def support_message(package: str, version: str | None) -> str | None:
    """One line where ``version`` of ``package`` lies outside its supported range; else None.

    Below the floor (or absent) the line says what to install; above the newest release tried it
    says so, since nothing proves the newer one (callers warn then, they do not refuse).

    >>> print(support_message("transformers", "4.57.1").replace("; ", ";\\n"))
    ampgraph supports transformers 5.17 to 5.24;
    this is transformers 4.57.1: pip install 'transformers>=5.17,<6'
    >>> print(support_message("torch", "2.15.0").replace("; ", ";\\n"))
    ampgraph was tried with torch 2.9 to 2.14.1;
    this is torch 2.15.0, newer: its results are unproven
    """
    known = {TORCH_RANGE.package: TORCH_RANGE, TRANSFORMERS_RANGE.package: TRANSFORMERS_RANGE}
    span = known[package]
    if version is None:
        return (
            f"ampgraph needs {package} ({span.floor} to {span.tested}): pip install '{span.spec}'"
        )
    release = version_tuple(version)
    if release < version_tuple(span.floor):
        return (
            f"ampgraph supports {package} {span.floor} to {span.tested}; this is {package} "
            f"{version}: pip install '{span.spec}'"
        )
    tested = version_tuple(span.tested)
    if release[: len(tested)] > tested:
        return (
            f"ampgraph was tried with {package} {span.floor} to {span.tested}; this is {package} "
            f"{version}, newer: its results are unproven"
        )
    return None


#: transformers 4.45 to 4.49: the hf-fx tracer's line (``transformers.utils.fx``), laid over a
#: supported environment by ``scripts/hf_fx_env.sh``; said nothing about, as it is deliberate.
HF_FX_TRANSFORMERS: Final = ((4, 45), (4, 50))


class UnsupportedVersionWarning(UserWarning):
    """torch or transformers outside the range ampgraph was tried with (:func:`unsupported`)."""


def unsupported() -> list[tuple[bool, str]]:
    """``(refuse, line)`` for each installed package outside its range. Refuse only torch below
    the floor (or no torch): ampgraph's own code fails there. Above the newest release tried,
    and for a transformers outside its range (its model code, not ampgraph's, is what differs),
    warn. Cheap: package metadata only, no import.

    >>> all(isinstance(line, str) for _, line in unsupported())
    True
    """
    out = []
    for span in (TORCH_RANGE, TRANSFORMERS_RANGE):
        version = installed_version(span.package)
        release = version_tuple(version or "")
        if span is TRANSFORMERS_RANGE and HF_FX_TRANSFORMERS[0] <= release < HF_FX_TRANSFORMERS[1]:
            continue
        line = support_message(span.package, version)
        if line is not None:
            refuse = span is TORCH_RANGE and release < version_tuple(span.floor)
            out.append((refuse, line))
    return out


def _started_as_cli() -> bool:
    """Whether this process is the ``ampgraph`` command, which says it once itself.

    ``python -m ampgraph`` imports the package while ``sys.argv[0]`` is still ``"-m"``, which
    Python sets only while it locates the module to run: then that module is ampgraph's own.
    """
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(argv[0]) == "ampgraph" or argv[0] == "-m"


def warn_if_unsupported() -> None:
    """At ``import ampgraph``: one warning line for each package outside its range (the command
    line prints the same lines as ``Error:``/``Warning:`` instead, and refuses below the floor).

    >>> warn_if_unsupported()  # torch and transformers in range here: nothing
    """
    if _started_as_cli():
        return
    for _, line in unsupported():
        # Level 3 is the import machinery's frozen frame: the warning is one line, with no
        # source line printed under it.
        warnings.warn(line, UnsupportedVersionWarning, stacklevel=3)


def guard_or_true(condition: Any) -> bool:
    """``condition`` as a bool, True where it depends on a size known only at run time (an
    unbacked size after ``nonzero``): no guard raises on it.

    ``torch.fx.experimental.symbolic_shapes.guard_or_true`` is in every supported release; torch
    2.6 lacks it (importing it was every command's traceback there, before the range check
    existed), so this falls back to what it does: evaluate, and answer True where evaluating
    would need the data.

    >>> guard_or_true(3 > 2), guard_or_true(1 > 2)
    (True, False)
    """
    from torch.fx.experimental import symbolic_shapes

    torch_guard = getattr(symbolic_shapes, "guard_or_true", None)
    if torch_guard is not None:
        return bool(torch_guard(condition))
    try:
        return bool(condition)
    except symbolic_shapes.GuardOnDataDependentSymNode:
        return True


@contextlib.contextmanager
def fx_stack_traces(keep: bool) -> Iterator[None]:
    """Record each traced node's Python stack (``node.meta["stack_trace"]``) only if ``keep``.

    ``torch.fx.config.do_not_emit_stack_traces`` is the switch from torch 2.13 on; torch 2.9 to
    2.11 have none (``AttributeError`` on every make-fx capture there) and always record them:
    the graph is the same, the trace a sixth slower. There this does nothing.

    >>> with fx_stack_traces(False):
    ...     pass
    """
    import torch.fx.config as fx_config

    if not hasattr(fx_config, "do_not_emit_stack_traces"):
        yield
        return
    previous = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = not keep
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = previous


def replace_kernel(
    lib: Any, name: str, kernel: Callable[..., Any], key: str, with_keyset: bool = False
) -> None:
    """``lib.impl(name, kernel, key, with_keyset=...)``, replacing a kernel torch registered from
    Python too.

    ``torch.library.Library.impl`` refuses a key that some Python library already registered for
    the op unless given ``allow_override=True``, the default from torch 2.13 on; torch 2.9 to
    2.12 default to refusing, and torch 2.11 registers ``_grouped_mm``'s Meta kernel with
    ``torch.library`` itself (importing ampgraph raised there). The dispatcher lets a later
    registration override an earlier one, with a warning, on every release.
    """
    lib.impl(name, kernel, key, with_keyset=with_keyset, allow_override=True)


#: Where torchvision registers its autocast wrappers (:data:`ampgraph.policy.LIBRARY_KERNELS`),
#: as a fragment of the path the dispatcher names: C++ files, one per op, in torchvision 0.24 to
#: 0.26 at least (``csrc/ops/autocast/roi_align_kernel.cpp``: ``cached_cast(at::kFloat, ...)``
#: on each floating input, then ``.to(input.scalar_type())``, none for ``nms``); one Python file
#: in 0.29, which does the same for the same ops and devices. Either is the rule ampgraph models.
TORCHVISION_AUTOCAST_SITES: Final = (
    "torchvision/_autograd_registrations.py",
    "torchvision/csrc/ops/autocast/",
)


def fill_placeholder_values(graph: Any, values: list[Any]) -> None:
    """Give each placeholder of ``graph`` without a ``meta["val"]`` its input's value.

    ``make_fx`` records a non-tensor input's value (``use_cache=False``) as its placeholder's
    ``val`` in torch 2.14; 2.9 to 2.11 record nothing there, and export's ``lift_constants_pass``,
    which the make-fx engine runs after it, reads every placeholder's ``val`` (``KeyError:
    'val'`` on every model). ``values`` are the graph's inputs in placeholder order.
    """
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    for node, value in zip(placeholders, values, strict=False):
        node.meta.setdefault("val", value)


def unbacked_value_setter() -> str:
    """The name of the ``ShapeEnv`` method that records the real value of a data-dependent
    (unbacked) symbol while real tensors propagate: ``set_real_tensor_prop_unbacked_vals`` from
    torch 2.11 on, ``set_unbacked_var_to_val`` in 2.9 and 2.10 (the same record under its old
    name).

    >>> unbacked_value_setter() in ("set_real_tensor_prop_unbacked_vals", "set_unbacked_var_to_val")
    True
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    new = "set_real_tensor_prop_unbacked_vals"
    return new if hasattr(ShapeEnv, new) else "set_unbacked_var_to_val"


def real_symbol_values(shape_env: Any) -> dict[Any, Any]:
    """The value each of ``shape_env``'s symbols took in a real run, where it knows one: the
    data-dependent ones' (``real_tensor_prop_unbacked_vals`` from torch 2.11 on,
    ``unbacked_var_to_val`` in 2.9 and 2.10: what :func:`unbacked_value_setter`'s method sets),
    then the backed ones' (``backed_var_to_val`` from 2.11 on, ``var_to_val`` before). Empty
    where no real value is known (a trace on fake tensors alone).

    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> real_symbol_values(ShapeEnv())
    {}
    """
    unbacked = getattr(shape_env, "real_tensor_prop_unbacked_vals", None)
    if unbacked is None:
        unbacked = getattr(shape_env, "unbacked_var_to_val", None)
    if not unbacked:
        return {}
    backed = getattr(shape_env, "backed_var_to_val", None)
    if backed is None:
        backed = getattr(shape_env, "var_to_val", {})
    return {**unbacked, **backed}


def soft_pending_unbacked() -> contextlib.AbstractContextManager[Any]:
    """Let a draft export that fixed a data-dependent size to its real value go on without that
    size in its output (``soft_pending_unbacked_not_found_error``, from torch 2.11 on). torch
    2.9 and 2.10 have no such option and no such check there: nothing to set.

    >>> with soft_pending_unbacked():
    ...     pass
    """
    from torch.fx.experimental import _config as fx_config

    if hasattr(fx_config, "soft_pending_unbacked_not_found_error"):
        return fx_config.patch(soft_pending_unbacked_not_found_error=True)
    return contextlib.nullcontext()


def custom_op_autocast_dtype(opdef: Any, device_type: str) -> Any:
    """The ``cast_inputs`` dtype ``torch.library.register_autocast`` left on a ``custom_op``'s
    definition for ``device_type``, or None: a dict by device type (``_autocast_dtype``) in
    torch 2.13 on; one attribute per device, ``_autocast_cuda_dtype`` and ``_autocast_cpu_dtype``
    (the only two it took), in 2.9 to 2.12.
    """
    table = getattr(opdef, "_autocast_dtype", None)
    if isinstance(table, dict):
        return table.get(device_type)
    return getattr(opdef, f"_autocast_{device_type}_dtype", None)


def torch_release() -> tuple[int, ...]:
    """The installed torch's release numbers (``(2, 11, 0)``), read from its metadata.

    >>> len(torch_release()) >= 2
    True
    """
    return version_tuple(installed_version("torch") or "")


def mse_loss_backward_takes_mixed_dtypes() -> bool:
    """Whether ``mse_loss_backward``'s kernel takes a target or gradient of another dtype than
    the input (``Loss.cpp``: the result is the input's): from torch 2.12 on. In 2.9 to 2.11 it
    refuses, ``Found dtype BFloat16 but expected Float``, naming the target before the gradient
    (seen on the CPU kernel, which shares the code with CUDA's).
    """
    return torch_release() >= (2, 12)


def addmv_meta_checks_dtypes() -> bool:
    """Whether ``TORCH_META_FUNC(addmv)`` refuses ``self``, ``mat`` and ``vec`` of different
    dtypes: from torch 2.12 on. Before, it makes the result with ``vec``'s options and checks no
    dtype (the kernels copy ``self`` into it, casting; 2.11's real CPU kernel: ``addmv(f32[5],
    bf16[5, 10], bf16[10])`` is bf16).

    >>> addmv_meta_checks_dtypes() == (torch_release() >= (2, 12))
    True
    """
    return torch_release() >= (2, 12)


def torch_minor() -> str:
    """The installed torch's release as ``MAJOR.MINOR`` (``"2.14"``), what versioned tables are
    keyed by.

    >>> torch_minor() == ".".join(map(str, torch_release()[:2]))
    True
    """
    return ".".join(map(str, torch_release()[:2]))


def draft_export_names_branches() -> bool:
    """Whether ``torch.export.draft_export`` reports each branch it decided on data, with the
    source line (``if x.sum() > 0:``), among its failures: from torch 2.13 on. 2.9 to 2.12
    decide the branch alike and report nothing, so the warning that the forward branches on
    data cannot say where.
    """
    return torch_release() >= (2, 13)


def fake_cuda_needs_help() -> bool:
    """Whether fake CUDA tensors on a machine without a GPU driver need ampgraph's help to run
    (``capture/driverless_29.py`` gives it): torch 2.9. Two C++ paths ask the driver there:

    * the CUDA device guard (``c10/cuda/impl/CUDAGuardImpl.h``), asked for the current stream by
      autograd's ``InputMetadata`` (``torch/csrc/autograd/input_metadata.cpp``, the first op on
      a parameter that requires grad; ``getStream`` is ``noexcept``: SIGABRT) and for the
      current device by indexing's ``OptionalDeviceGuard`` (``THPVariable_getitem``) and
      ``.to("cuda")``. torch 2.10 swaps in a driverless guard when fake tensors start
      (``torch._C._ensureCUDADeviceGuardSet``, where the CUDA guard counts no device), which 2.9
      lacks;
    * ``scaled_dot_product_attention``'s CUDA backend choice (``sdp_utils.cpp``:
      ``select_sdp_backend`` reads the device's properties): 2.10 catches the driver's error
      there and takes the math backend, 2.9 raises. So does the convolution backend choice
      fake tensors ask for (``torch._C._select_conv_backend``: cuDNN's bf16 and depthwise
      checks), which 2.10 answers without cuDNN.

    >>> isinstance(fake_cuda_needs_help(), bool)
    True
    """
    return torch_release() < (2, 10)


@contextlib.contextmanager
def make_fx_keeps_fused_kernels() -> Iterator[None]:
    """While ``make_fx`` traces below autograd (``pre_dispatch=False``: the training pass's joint
    trace), decompose a composite op only where autograd would have: where the op has no kernel
    of its own for its first tensor's device. torch 2.10 on asks that itself
    (``proxy_call``: ``autograd_would_have_decomposed``); 2.9 decomposes every op with a
    ``CompositeImplicitAutograd`` kernel, so an op that has both (``silu_backward``,
    ``native_layer_norm_backward`` of a mixed layer norm) became ``sigmoid, mul, ...`` in the
    trace where the real kernel runs one ``silu_backward``. On 2.9 this gives
    ``OpOverload.decompose`` 2.10's test for the duration; elsewhere it does nothing.

    >>> with make_fx_keeps_fused_kernels():
    ...     pass
    """
    if torch_release() >= (2, 10):
        yield
        return
    import torch
    from torch._ops import OpOverload

    original = OpOverload.decompose

    def decompose(self: OpOverload, *args: Any, **kwargs: Any) -> Any:
        first = next(
            (a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None
        )
        if first is not None:
            key = torch._C._dispatch_key_for_device(first.device.type)
            if torch._C._dispatch_has_kernel_for_dispatch_key(self.name(), key):
                return NotImplemented  # autograd would have run the op's own kernel
        return original(self, *args, **kwargs)

    OpOverload.decompose = decompose  # type: ignore[method-assign]
    try:
        yield
    finally:
        OpOverload.decompose = original  # type: ignore[method-assign]


def layer_norm_backward_meta_is_right() -> bool:
    """Whether ``native_layer_norm_backward``'s meta kernel gives the weight's and bias's
    gradients their own dtypes, as the CPU and CUDA kernels do (``empty_like(*gamma)``): from
    torch 2.10 on. 2.9's gives all three gradients the input's dtype (bf16 for an fp32
    LayerNorm after a bf16 Linear under autocast, where the real kernels give fp32);
    ``capture/meta_kernels.py`` replaces it there.

    >>> isinstance(layer_norm_backward_meta_is_right(), bool)
    True
    """
    return torch_release() >= (2, 10)


#: ``torch._functorch.config.backward_pass_autocast``'s default, per release: the autocast state
#: AOT autograd traces a compiled region's backward in, when the forward is compiled (so the
#: backward's ops get the forward's autocast, as if ``backward()`` ran inside the context).
#: Read from each release's own ``torch/_functorch/config.py`` and
#: ``_aot_autograd/graph_capture_wrappers.py`` (the 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0,
#: 2.14.0 wheels and the installed 2.14.1; 2.15.0 too): every one defaults to
#: ``"same_as_forward"`` (added by pytorch/pytorch#156356, June 2025). A proposal to default to
#: ``"off"`` (#177286, #177287, March 2026) is in none of them. Eager's AMP recipe calls
#: ``backward()`` outside the context, which is ``"off"``.
BACKWARD_PASS_AUTOCAST_DEFAULT: Final = {
    (2, 9): "same_as_forward", (2, 10): "same_as_forward", (2, 11): "same_as_forward",
    (2, 12): "same_as_forward", (2, 13): "same_as_forward", (2, 14): "same_as_forward",
}  # fmt: skip


def backward_pass_autocast_default(release: tuple[int, ...] | None = None) -> str | None:
    """The default of ``backward_pass_autocast`` on ``release`` (the installed torch by default);
    None for a release outside the table.

    >>> backward_pass_autocast_default((2, 9, 1))
    'same_as_forward'
    >>> backward_pass_autocast_default((2, 8, 0)) is None
    True
    """
    return BACKWARD_PASS_AUTOCAST_DEFAULT.get(tuple((release or torch_release())[:2]))


def compiled_backward_lowering() -> dict[str, bool]:
    """The ``torch._functorch.config`` options that make AOT autograd lower a compiled backward
    when the forward is compiled, not at the backward's first run: ``force_non_lazy_backward_
    lowering`` from torch 2.10; 2.9.1 has no such option (an empty dict: the backward is lowered
    lazily there and a plan cannot see it without running it).

    >>> compiled_backward_lowering() in ({}, {"force_non_lazy_backward_lowering": True})
    True
    """
    return {"force_non_lazy_backward_lowering": True} if torch_release() >= (2, 10) else {}


def flex_attention_autocast_casts_qkv() -> bool:
    """Whether the ``flex_attention`` higher-order op has autocast kernels (CPU and CUDA) that
    cast query, key and value to autocast's dtype and nothing else: from torch 2.11
    (``torch/_higher_order_ops/flex_attention.py``, ``_flex_attention_autocast_impl``); 2.9 and
    2.10 have none, so autocast falls through and the op runs in its inputs' dtypes.

    >>> flex_attention_autocast_casts_qkv() == (torch_release() >= (2, 11))
    True
    """
    return torch_release() >= (2, 11)


def compiler_disable_annotates() -> bool:
    """Whether ``torch.compiler.disable``'s wrapper annotates the nodes traced inside it while
    exporting (``_torchdynamo_disable_method``, in ``torch/_dynamo/eval_frame.py``): from 2.10;
    2.9.1's wrapper has no such annotation.

    >>> compiler_disable_annotates() == (torch_release() >= (2, 10))
    True
    """
    return torch_release() >= (2, 10)
