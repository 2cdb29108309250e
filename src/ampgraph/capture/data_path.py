"""The capture of a forward that branches on data (a detection model's ``if boxes.numel() ==
0`` after NMS): traced by ``draft-export`` on seeded values, then in its setting along the path
those values take (:func:`trace_data_path`). :mod:`ampgraph.capture.trace` turns to it where a
trace in the setting stops at such a branch.

>>> branches_on_data(RuntimeError("Could not guard on data-dependent expression u0 > 0"))
True
"""

from __future__ import annotations

from ampgraph.capture.draft_export import _draft_export
from ampgraph.capture.engines import Traced, _export
from ampgraph.capture.module_io import ModuleIORecorder, error_line
from ampgraph.capture.raises import ends_at_a_raise
from ampgraph.capture.retrace import draft_to_the_guard
from ampgraph.errors import CaptureError, exception_chain
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import torch_dtype, unbacked_values

#: A forward that branches on data (a detection model's ``if boxes.numel() == 0`` after NMS)
#: cannot be traced on fake tensors, which have no values. Traced instead by
#: ``torch.export.draft_export`` on real, seeded random weights and inputs on the CPU, with fp32
#: parameters and no autocast; each branch on data is decided as those values decide it (listed
#: in :attr:`Capture.data_dependent`), then replayed in the setting like ``export-retyped``.
DRAFT_EXPORT = "draft-export"
#: A forward that branches on data, traced in its setting like ``export`` (fake tensors of the
#: setting's device and dtypes, autocast on), with each size that depends on data given the value
#: the ``draft-export`` run found for it: every branch on data is decided as that run decided it
#: (:attr:`Capture.data_dependent`), and every dtype the code reads at trace time is the
#: setting's own, which a retyped fp32 trace cannot give (a detector's anchors follow its
#: feature maps' dtype). Where that trace raises (the ``half`` setting's first layer), the
#: ``draft-export`` graph is replayed instead.
EXPORT_DATA_PATH = "export-data-path"
#: Every method that decides branches on data (the report lists the branches).
DATA_PATH_METHODS = (DRAFT_EXPORT, EXPORT_DATA_PATH)


def branches_on_data(exc: BaseException) -> bool:
    """Whether export failed because the forward branched on a data-dependent value."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return any(
        isinstance(e, GuardOnDataDependentSymNode) or "data-dependent" in str(e)
        for e in exception_chain(exc)
    )


def _trace_on_path(
    model: ModelInputs,
    setting: Setting,
    recorder: ModuleIORecorder,
    unbacked: dict[str, int | float],
) -> Traced | None:
    """Trace in ``setting`` with each data-dependent value given as ``unbacked`` has it; None
    where the forward still branches on a value it lacks (a branch the setting's dtypes reach
    and the run that found ``unbacked`` did not). Any other error is raised."""
    try:
        with unbacked_values(unbacked):
            program = _export(model, setting.device_type, torch_dtype(setting.param_dtype), setting)
        # A size this trace computed from followed values (capture/known_values.py) has the
        # real one, given after the name's value from the run on values: that run numbers its
        # sizes otherwise (it reads ``int(mask.sum())`` into a size of its own, this trace into
        # a number), so its value for the name can be another size's. The replays take this.
        program.unbacked = {**unbacked, **program.unbacked}
        return program
    except Exception as exc:
        if not branches_on_data(exc):
            raise
        recorder.reset()
        return None


def _follow_setting_run(
    model: ModelInputs,
    setting: Setting,
    recorder: ModuleIORecorder,
    neutral: list[str],
    unbacked: dict[str, int | float],
) -> tuple[Traced, list[str], dict[str, int | float]]:
    """The graph in ``setting`` along the path a run in its own dtypes takes on seeded values,
    with that run's branches and values. Where no such run decides it (the CPU cannot run the
    setting's dtypes), ``neutral`` gains a line saying the graph past the branch is the fp32
    run's path, and the error propagates to the caller's fallback (the draft graph)."""
    try:
        _, branches, values = _draft_export(model, setting)
        recorder.reset()
        program = _trace_on_path(model, setting, recorder, values)
        if program is None:
            raise CaptureError("the run in its dtypes left a branch on data undecided")
    except Exception as exc:  # the CPU cannot run the setting's dtypes here, or it raised
        neutral.append(
            f"the {setting.name} setting branches on data where the fp32 run does not, and no "
            f"run in its dtypes decided it ({error_line(exc)}): past that branch the graph is "
            "the fp32 run's path, not analysed in this setting"
        )
        raise
    return program, branches, values


def trace_data_path(
    model: ModelInputs, setting: Setting, recorder: ModuleIORecorder
) -> tuple[Traced, str, list[str], dict[str, int | float]]:
    """A forward that branches on data: traced by ``draft-export`` on seeded values, then
    again in the setting along that path where it can be (``export-data-path``): the program,
    the method, the branches decided on data and the value of each size that depends on it."""
    recorder.reset()
    program, data_dependent, unbacked = draft_to_the_guard(model, recorder)
    method = DRAFT_EXPORT
    draft = (program, dict(recorder.calls), list(recorder.order))
    recorder.reset()
    try:
        if ends_at_a_raise(program.graph_module):  # so would any trace
            raise CaptureError("no run decides a size there: the draft")
        on_path = _trace_on_path(model, setting, recorder, unbacked)
        if on_path is None:  # the setting branches on data the neutral run
            # never met (inside `if x.dtype == torch.float16`): follow a run
            # in the setting's own dtypes, or say the graph cannot follow it.
            on_path, data_dependent, unbacked = _follow_setting_run(
                model, setting, recorder, data_dependent, unbacked
            )
        program, method, unbacked = on_path, EXPORT_DATA_PATH, on_path.unbacked
    except Exception:  # noqa: BLE001 - it raises in its setting: the draft
        program, calls, order = draft
        recorder.calls.clear()
        recorder.calls.update(calls)
        recorder.order[:] = order
    return program, method, data_dependent, unbacked


__all__ = [
    "DATA_PATH_METHODS",
    "DRAFT_EXPORT",
    "EXPORT_DATA_PATH",
    "branches_on_data",
    "trace_data_path",
]
