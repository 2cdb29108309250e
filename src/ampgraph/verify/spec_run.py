"""``ampgraph verify``'s work: a model spec built once and verified for real in each setting of
an :class:`~ampgraph.pipeline.request.AnalysisRequest`, in a process group of its own.

The model's code runs for real in a process group that is killed after ``request.timeout``,
as every analysis does; torch and the device are there, never in the caller (a CUDA context
made before the fork would not work in it). Torch-free itself.

>>> from ampgraph.pipeline.request import AnalysisRequest
>>> items = []
>>> verify_spec(AnalysisRequest("llama-tiny", ("fp32,device=cpu",), seq_len=4), items.append)
>>> [kind for kind, _ in items], items[-1][1][0].ok
(['progress', 'progress', 'step'], True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ampgraph.capture.environment import analysis_environment
from ampgraph.pipeline.request import AnalysisRequest

#: What :func:`verify_spec` hands its caller: ``("progress", note)`` or ``("step", results)``.
Item = tuple[str, Any]


def produce(request: AnalysisRequest, send: Callable[[Item], None]) -> None:
    """Build the model, then verify it in each setting, sending notes and results: the work
    :func:`verify_spec` confines (the command line confines it itself, before torch is
    imported: this package imports it). The real runs read their seed and what they may do
    from the request's environment (:meth:`~ampgraph.pipeline.request.AnalysisRequest.
    environment`), not from arguments handed to each setting."""
    with analysis_environment(request.environment()):
        _produce(request, send)


def _produce(request: AnalysisRequest, send: Callable[[Item], None]) -> None:
    from ampgraph.model.usercode import model_code
    from ampgraph.pipeline.run import prepare
    from ampgraph.verify.training import verify_train
    from ampgraph.verify import resolve_device
    from ampgraph.verify import verify as verify_model

    settings = request.settings
    for setting in settings:
        resolve_device(setting)  # no GPU: one line now, before the model is built
    send(("progress", f"building {request.model} on the meta device..."))
    with model_code():  # its prints go to stderr; the lines between are ours
        built = prepare(request.model or "", seq_len=request.seq_len, force=request.force,
                        tracer=request.traced_by)  # fmt: skip
    for i, setting in enumerate(settings, 1):
        send(("progress", f"verifying {setting.name} on real tensors ({i} of {len(settings)})"))
        step: list[Any] = []
        with model_code():
            if request.pass_ != "backward":
                step.append(verify_model(built, setting))
            if request.training:
                step.append(verify_train(built, setting, loss=request.loss,
                                         backward_autocast=request.backward_autocast))  # fmt: skip
        send(("step", step))


def verify_spec(request: AnalysisRequest, take: Callable[[Item], None]) -> None:
    """Verify ``request``'s model (a spec) in each of its settings against real execution
    (:func:`ampgraph.verify.verify`, and :func:`ampgraph.verify.training.verify_train` for a
    training pass), with weights from ``request.seed``: ``take`` receives ``("progress",
    note)`` and ``("step", results)`` for each setting as they come.

    Confined (:func:`ampgraph.pipeline.confine.confine`): in a process group of its own, killed
    after ``request.timeout``, where this process has not imported torch; here, under the alarm,
    where it has.
    """
    from ampgraph.pipeline.confine import confine

    confine(
        lambda send: produce(request, send), take, name="verification",
        timeout=request.timeout, counted=lambda item: item[0] == "step",
        expected=len(request.settings),
    )  # fmt: skip


__all__ = ["Item", "produce", "verify_spec"]
