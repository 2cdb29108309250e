"""Inductor's plan of a model spec in settings, cached like every other analysis.

What ``table``, ``render``, ``check``, ``diff`` and ``audit`` run for ``--compile inductor``:
each setting's plan (:func:`ampgraph.compiled.inductor.plan`) is read from the cache before torch
is imported; the rest are made in one confined process (:func:`ampgraph.pipeline.confine.confine`:
the model's code cannot reach the command), after building and tracing the model once, and
stored. An entry is keyed by what the setting's report is keyed by (the model's config, the
setting, the environment: ampgraph, torch and where they are installed,
:func:`ampgraph.pipeline.cache.entry_requests`) plus the plan's own inputs: the Inductor options
asked for (``emulate_precision_casts``) and every ``TORCHINDUCTOR_*`` variable of the
environment, which set the defaults of the rest of Inductor's options.

>>> request = AnalysisRequest("opt-125m", ("amp-fp32",), check=False)
>>> plan_requests(request, True)[0]["request"]["compiled"]["emulate_precision_casts"]
True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ampgraph.compiled.flow import CompiledFlow
from ampgraph.pipeline.request import AnalysisRequest

#: Bump when the plan's records change in a way the environment does not capture.
PLAN_FORMAT = 2


def plan_requests(request: AnalysisRequest, emulate: bool) -> list[dict[str, Any] | None]:
    """What each setting's plan is cached under (None: never cached, as the report is not)."""
    from ampgraph.pipeline import cache

    inductor = {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCHINDUCTOR_")}
    extra = {"compiled": {"backend": "inductor", "emulate_precision_casts": emulate,
                          "environment": inductor, "format": PLAN_FORMAT}}  # fmt: skip
    # The plan is of the captured forward graph: the check and the sources change no node of it.
    base = AnalysisRequest(request.model, request.settings, seq_len=request.seq_len,
                           check=False, tracer=request.tracer, force=request.force)  # fmt: skip
    return [None if r is None else {**r, "request": {**r["request"], **extra}}
            for r in cache.entry_requests(base)]  # fmt: skip


def refuse_devices(request: AnalysisRequest) -> None:
    """A :class:`~ampgraph.errors.SettingError` (one line) for a setting off the CPU: Inductor's
    Triton backend asks the GPU for its properties to plan, so without one it cannot.

    >>> refuse_devices(AnalysisRequest("opt-125m", ("amp-fp32,device=cpu",)))
    """
    from ampgraph.errors import SettingError

    for s in request.settings:
        if s.device_type != "cpu":
            raise SettingError(
                f"the compiled analysis plans Inductor's C++ backend (device cpu); {s.name} runs "
                f"on {s.device_type}, whose Triton backend needs a GPU to plan: use a cpu setting"
            )


def _entry(flow: CompiledFlow, request: dict[str, Any]) -> dict[str, Any]:
    """A plan as the cache holds it: wrapped in what :func:`ampgraph.pipeline.cache.describes`
    checks of every entry (model, setting, versions)."""
    env = request["env"]
    return {"model": request["model"]["name"], "setting": request["request"]["setting"],
            "versions": {k: env[k] for k in ("ampgraph", "torch", "transformers")},
            "compiled": flow.to_dict()}  # fmt: skip


def _cached(request: dict[str, Any] | None) -> CompiledFlow | None:
    from ampgraph.pipeline import cache

    data = cache.load(request) if request is not None else None
    try:
        return CompiledFlow.from_dict(data["compiled"]) if data is not None else None
    except (KeyError, TypeError, ValueError):  # a damaged entry: a miss, recomputed
        return None


def compiled_flows(
    request: AnalysisRequest, emulate: bool = False, *, use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[CompiledFlow]:  # fmt: skip
    """Inductor's plan of ``request``'s model (a spec) in each of its settings, in order.

    >>> flows = compiled_flows(AnalysisRequest("tests.compiled_models:gelu_chain",
    ...                                         ("amp-fp32,device=cpu",), check=False))
    >>> [n.name for n in flows[0].dropped()]
    ['gelu', 'mul']
    """
    from ampgraph.pipeline.confine import confine

    if request.model is None:
        raise TypeError("compiled_flows() needs a request that names a model spec")
    refuse_devices(request)
    requests = plan_requests(request, emulate) if use_cache else [None] * len(request.settings)
    flows = [_cached(r) for r in requests]
    missing = [i for i, f in enumerate(flows) if f is None]
    if not missing:
        return [f for f in flows if f is not None]

    confine(lambda send: _produce(request, emulate, missing, send), _taker(flows, progress),
            name="compiled plan", timeout=request.timeout,
            counted=lambda item: item[0] == "plan", expected=len(missing))  # fmt: skip
    from ampgraph.pipeline import cache

    for i in missing:
        flow, asked = flows[i], requests[i]
        if flow is not None and asked is not None:
            cache.store(asked, _entry(flow, asked))
    return [f for f in flows if f is not None]


def _taker(
    into: list[Any], progress: Callable[[str], None] | None
) -> Callable[[tuple[str, Any]], None]:  # fmt: skip
    """The confined run's callback (what :func:`_produce` sends): a progress message is passed on;
    a plan, ``(index, data)``, is put at its index in ``into`` as a flow, and a checked one,
    ``(index, data, disagreements)``, as the flow and its disagreements.

    >>> got = [None]
    >>> _taker(got, None)(("plan", (0, CompiledFlow("m", "s", "t", "cpp", {}).to_dict(), ["x"])))
    >>> got[0][1]
    ['x']
    """

    def take(item: tuple[str, Any]) -> None:
        kind, value = item
        if kind == "progress":
            if progress is not None:
                progress(value)
            return
        index, data, *found = value
        flow = CompiledFlow.from_dict(data)
        into[index] = (flow, list(found[0])) if found else flow

    return take


def _produce(
    request: AnalysisRequest, emulate: bool, missing: list[int], send: Callable[[Any], None],
    *, real: bool = False,
) -> None:
    """In the confined process: build and trace the model once, capture and plan each missing
    setting, and send each plan as plain data (``real``: with its disagreements with the code
    Inductor generates)."""
    from ampgraph.capture.trace import capture
    from ampgraph.compiled.inductor import plan
    from ampgraph.pipeline.run import prepare

    assert request.model is not None
    model = prepare(request.model, seq_len=request.seq_len, force=request.force,
                    tracer=request.tracer, progress=lambda m: send(("progress", m)))  # fmt: skip
    for i in missing:
        setting = request.settings[i]
        send(("progress", f"planning {setting.name} with Inductor (fake tensors, no compile)"))
        cap = capture(model, setting)
        flow = plan(cap, emulate_precision_casts=emulate)
        if not real:
            send(("plan", (i, flow.to_dict())))
            continue
        send(("progress", f"compiling {setting.name} with Inductor's C++ backend"))
        send(("plan", (i, flow.to_dict(), _generated_disagreements(cap, flow, emulate))))


def compiled_check(
    request: AnalysisRequest, emulate: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[CompiledFlow, list[str]]]:  # fmt: skip
    """Each setting's plan held against the C++ code Inductor really generates for the same
    captured graph (:mod:`ampgraph.compiled.generated`): the plan and its disagreements (none:
    they agree). Compiles every kernel, so it takes what ``torch.compile`` takes; never cached.
    """
    from ampgraph.pipeline.confine import confine

    if request.model is None:
        raise TypeError("compiled_check() needs a request that names a model spec")
    refuse_devices(request)
    results: list[tuple[CompiledFlow, list[str]] | None] = [None] * len(request.settings)
    every = list(range(len(request.settings)))
    confine(lambda send: _produce(request, emulate, every, send, real=True),
            _taker(results, progress), name="compiled check", timeout=request.timeout,
            counted=lambda item: item[0] == "plan", expected=len(every))  # fmt: skip
    return [r for r in results if r is not None]


def _generated_disagreements(cap: Any, flow: CompiledFlow, emulate: bool) -> list[str]:
    """Compile ``cap``'s graph with Inductor's C++ backend for real and read what it generated.
    Inputs are random tensors of the placeholders' shapes and dtypes (the model was built on
    the meta device): which kernels Inductor writes depends on shapes and dtypes, not values."""
    import torch

    from ampgraph.compiled import generated

    from ampgraph.compiled.inductor import CompiledPlanError

    inputs = []
    for n in cap.graph_module.graph.nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor):  # a Python scalar or flag: passed as traced
                inputs.append(val)
                continue
            make = torch.randn if val.is_floating_point() else torch.zeros
            inputs.append(make(tuple(val.shape), dtype=val.dtype))
    try:
        _, code = generated.compile_for_real(cap, inputs, emulate_precision_casts=emulate)
    except Exception as exc:  # noqa: BLE001 - Inductor's errors (no compiler...): one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CompiledPlanError(f"Inductor could not compile the graph: {first}") from exc
    read = generated.read_code(code)
    if not read.kernels and flow.kernels and any(k.kind != "extern" for k in flow.kernels):
        return ["no C++ kernel read in the generated code: the reader no longer fits it"]
    return generated.disagreements(flow, read)
