"""Verify: prove the annotations against real execution (the README's "verify guide" is the
user's account of it).

Where :mod:`ampgraph.annotate.check` runs autocast's kernels on fake tensors, this runs everything for real,
with random weights from a random seed, and makes three cross-checks against the annotation:

========== ===================================================================================
nodes      the captured graph run node by node under real autocast (:mod:`.execution`):
           each node's output dtypes, or its error, against its annotation
modules    the eager model with the seed notebook's forward hooks (:mod:`.eager`): each hook
           line against the annotation's module view
casts      the ``aten._to_copy`` calls autocast really makes at each node (:mod:`.casts`)
           against the predicted casts
========== ===================================================================================

The pieces: :mod:`.device` (which device, its name, whether the weights fit), :mod:`.tensors`
(real tensors for the graph), :mod:`.compare` (prediction against observation), :mod:`.results`
(agreement counts, disagreements, the JSON record).

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> lin = ModelInputs("linear", torch.nn.Linear(16, 16), (torch.randn(1, 16),))
>>> result = verify(lin, Setting.parse("amp-fp32", device_type="cpu"))
>>> result.ok, result.casts.agree                     # input, weight and bias: seed 001's 3 casts
(True, 3)
"""

from __future__ import annotations

import time

import torch

from ampgraph.capture.casts import cast_floating
from ampgraph.capture.environment import current
from ampgraph.capture.trace import capture
from ampgraph.errors import NoDeviceError, VerifyError
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_capture
from ampgraph.settings import Setting
from ampgraph.verify.cast_log import CastLog
from ampgraph.verify.compare import compare_modules, compare_nodes
from ampgraph.verify.device import NO_CUDA_MESSAGE, check_memory, device_name, resolve_device
from ampgraph.verify.eager import refuse_changing_forward, run_eager
from ampgraph.verify.execution import RealExecution, run_graph
from ampgraph.verify.results import (
    Agreement,
    Disagreement,
    VerifyResult,
    now,
    verify_record,
    versions,
)
from ampgraph.verify.tensors import draft_tensors, graph_inputs, random_like, real_inputs


def verify(
    model: ModelInputs,
    setting: Setting | str,
    *,
    device: str | torch.device | None = None,
    random_seed: int | None = None,
    force: bool | None = None,
) -> VerifyResult:
    """Verify the annotation of ``model`` in ``setting`` against real execution.

    ``device`` is the real device (default: the setting's device type, e.g. ``cpu``); it must be
    of the setting's device type, whose autocast policy tables the annotation used. The weights
    are random, from ``random_seed`` (values never change a dtype). Raises
    :class:`NoDeviceError` for ``cuda`` on a machine without one; refuses weights beyond the
    device's free memory unless ``force``. ``random_seed`` and ``force`` left None are the
    analysis environment's (:class:`~ampgraph.capture.environment.RealRun`: the request's, where
    :func:`ampgraph.verify.spec_run.verify_spec` runs it; 0 and False outside one).

    >>> import torch
    >>> from ampgraph.model.build import ModelInputs
    >>> lin = ModelInputs("linear", torch.nn.Linear(16, 16), (torch.randn(1, 16),))
    >>> r = verify(lin, "autocast=on,device=cpu")
    >>> from ampgraph.formats.verify import summary_line
    >>> print(summary_line(r))                                             # doctest: +ELLIPSIS
    linear amp-fp32 (cpu bf16) on ...: nodes 2/2, modules 1/1, casts 3/3 agree; 0 disagreements
    """
    if isinstance(setting, str):
        setting = Setting.parse(setting)
    real_run = current().real_run.given(seed=random_seed, force=force)
    dev = resolve_device(setting, device)
    check_memory(model, setting, dev, force=real_run.force)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    cap = capture(model, setting)
    report = analyze_capture(cap, check=False)
    seconds["capture_annotate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(real_run.seed)
    # The inputs as the setting's recipe hands them to the forward (its input_dtype).
    # A graph traced along a data path: the draft run's values, so that the sizes are its own.
    draft = draft_tensors(cap, model, dev, real_run.seed)
    args, kwargs = cast_floating(real_inputs(model, dev, gen, draft), setting.input_dtype)
    values = graph_inputs(cap, model, args, kwargs, dev, gen, draft.tensors if draft else None)
    seconds["materialise"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    observed = run_graph(cap, report.nodes, values, dev)
    nodes, casts, found = compare_nodes(report.nodes, observed)
    seconds["graph"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    hooks = run_eager(model, cap, values, args, kwargs, dev, gen)
    refuse_changing_forward(hooks, observed)
    modules, module_found = compare_modules(report, hooks, observed)
    seconds["eager"] = time.perf_counter() - t0
    del values  # the real weights; the result keeps only dtypes
    return VerifyResult(
        model=model.name,
        setting=setting,
        device=str(dev),
        device_name=device_name(dev),
        versions=versions(),
        date=now(),
        nodes=nodes,
        modules=modules,
        casts=casts,
        disagreements=found + module_found,
        eager_hooks=[h.hook_line() for h in hooks],
        seconds={k: round(v, 3) for k, v in seconds.items()},
        report=report,
    )


__all__ = [
    "NO_CUDA_MESSAGE",
    "Agreement",
    "CastLog",
    "Disagreement",
    "NoDeviceError",
    "RealExecution",
    "VerifyError",
    "VerifyResult",
    "device_name",
    "random_like",
    "resolve_device",
    "verify",
    "verify_record",
]
