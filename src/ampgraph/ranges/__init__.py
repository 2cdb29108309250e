"""Will it overflow? Value ranges from one real fp32 run, judged against each setting's dtypes.

ampgraph says which dtype every value has in a setting; this says whether the values fit it.
The pieces, one job each:

=========== ==================================================================================
weights     real fp32 weights: the module's own, a folder's safetensors (lazily), or seeded
collect     the captured graph run once for real on the CPU in fp32, each node's outputs reduced
            to their range (largest and smallest non-zero magnitude, zeros, inf, NaN), then dropped
judge       each setting's node records against those ranges: overflow, flush to zero,
            subnormals, casts and constants that do not fit (torch-free)
records     the results as plain data, and the dtypes' limits
formats     the table and summary, JSON and Markdown
=========== ==================================================================================

The reference run uses the graph of the setting ``fp32,inputs=fp32`` (no autocast, fp32
parameters and inputs) on the settings' device type; each setting is captured and annotated as
``ampgraph table`` does, so findings name the nodes and modules the reports and diagrams name.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> lin = torch.nn.Linear(4, 4)
>>> _ = torch.nn.init.constant_(lin.weight, 3e4)
>>> m = ModelInputs("big", lin, (torch.ones(1, 4),))
>>> result = value_ranges(m, ["amp-fp32"], device_type="cpu", amp_dtype="fp16")
>>> print(result.settings[0].first.message)                            # doctest: +ELLIPSIS
linear (linear): max 1.2e+05 > fp16's 65,504; autocast runs linear in fp16 because ...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ampgraph.capture.casts import cast_floating
from ampgraph.capture.trace import capture
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_capture
from ampgraph.ranges.collect import graph_constants, run_ranges
from ampgraph.ranges.judge import judge_setting, reference_findings
from ampgraph.ranges.records import (
    KINDS,
    LIMITS,
    NodeRange,
    RangeFinding,
    RangesError,
    RangesResult,
    SettingRanges,
    ValueRange,
)
from ampgraph.ranges.weights import check_memory, real_state
from ampgraph.settings import Setting

Progress = Callable[[str], None] | None


def _say(progress: Progress, text: str) -> None:
    if progress is not None:
        progress(text)


def value_ranges(
    model: ModelInputs,
    settings: Sequence[Setting | str],
    *,
    device_type: str = "cuda",
    amp_dtype: str = "bf16",
    seed: int = 0,
    weights_dir: Path | None = None,
    force: bool = False,
    progress: Progress = None,
) -> RangesResult:
    """Run ``model`` once for real in fp32 on the CPU and judge its values in each setting.

    ``settings`` are :class:`~ampgraph.settings.Setting` objects or names (parsed with
    ``device_type`` and ``amp_dtype``). Weights: see :mod:`ampgraph.ranges.weights`;
    ``weights_dir`` is a folder of ``*.safetensors`` shards. A model whose fp32 weights do not fit
    this machine's memory is a one-line :class:`RangesError` unless ``force``.
    """
    from ampgraph import __version__

    parsed = [
        s if isinstance(s, Setting) else Setting.parse(s, device_type=device_type,
                                                       amp_dtype=amp_dtype)
        for s in settings
    ]  # fmt: skip
    check_memory(model.module, model.name, force=force)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    reference = Setting.parse("fp32,inputs=fp32", device_type=parsed[0].device_type)
    _say(progress, "capturing the fp32 reference graph")
    ref_cap = capture(model, reference)
    ref_report = analyze_capture(ref_cap, check=False)
    reports = []
    for i, setting in enumerate(parsed, 1):
        _say(progress, f"analysing {setting.name} ({i} of {len(parsed)})")
        cap = ref_cap if setting == reference else capture(model, setting)
        report = ref_report if cap is ref_cap else analyze_capture(cap, check=False)
        reports.append((report, graph_constants(cap.graph_module)))
    seconds["capture_annotate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _say(progress, "materialising fp32 weights on the CPU")
    state, source = real_state(model.module, seed, weights_dir)
    from ampgraph.verify.tensors import graph_inputs, real_inputs

    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(seed)
    args, kwargs = cast_floating(real_inputs(model, cpu, gen), "float32")
    values = graph_inputs(ref_cap, model, args, kwargs, cpu, gen, known=state)
    del state
    seconds["materialise"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _say(progress, "running the model in fp32 on the CPU")
    modules = {r.name: r.module for r in ref_report.nodes}
    kinds = {r.name: r.kind for r in ref_report.nodes}
    measured = run_ranges(ref_cap, values, modules, kinds)
    del values
    seconds["run"] = time.perf_counter() - t0

    verdicts = [judge_setting(rep, ref_report.nodes, measured, consts) for rep, consts in reports]
    ordered = [measured[r.name] for r in ref_report.nodes if r.name in measured]
    ordered += [n for name, n in measured.items() if name not in modules]  # region bodies
    return RangesResult(
        model=model.name,
        weights=source,
        seed=seed,
        reference=reference.to_dict(),
        nodes=ordered,
        settings=verdicts,
        reference_findings=reference_findings(ref_report.nodes, measured),
        versions={"ampgraph": __version__, "torch": torch.__version__},
        seconds={k: round(v, 3) for k, v in seconds.items()},
        reports=[rep for rep, _ in reports],
    )


__all__ = [
    "KINDS",
    "LIMITS",
    "NodeRange",
    "RangeFinding",
    "RangesError",
    "RangesResult",
    "SettingRanges",
    "ValueRange",
    "value_ranges",
]
