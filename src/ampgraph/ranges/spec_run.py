"""``ampgraph ranges``'s work on a request: its model built once, run for real in fp32 and judged
in each of its settings (:func:`ampgraph.ranges.value_ranges`), sending progress notes and the
result as it goes: the work the command line confines (:func:`ampgraph.pipeline.confine.confine`),
as ``verify``'s.

>>> from ampgraph.pipeline.request import AnalysisRequest
>>> from ampgraph.settings import Setting
>>> request = AnalysisRequest("llama-tiny", (Setting.parse("amp-fp32", amp_dtype="fp16"),),
...                           seq_len=4)
>>> items = []
>>> ranges_of_spec(request, items.append)
>>> kinds = [kind for kind, _ in items]
>>> kinds[0], kinds[-1], items[-1][1].model
('progress', 'result', 'llama-tiny')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ampgraph.errors import ArgumentError

if TYPE_CHECKING:
    from ampgraph.pipeline.request import AnalysisRequest

#: What :func:`ranges_of_spec` sends: ``("progress", note)``, then ``("result", RangesResult)``.
Item = tuple[str, Any]


def ranges_of_spec(request: AnalysisRequest, send: Callable[[Item], None]) -> None:
    """Build the model ``request`` names (as :func:`ampgraph.pipeline.run.prepare` does) and send
    its :func:`~ampgraph.ranges.value_ranges` in the request's settings, of its pass (forward or
    train, with its loss), with a progress note before each stage. What the real run may do (its
    seed, the weights' folder, whether they are read one at a time, --force) is the request's
    environment (:meth:`~ampgraph.pipeline.request.AnalysisRequest.environment`), entered here
    and read by :func:`~ampgraph.ranges.value_ranges`. The model's own code runs in
    :func:`ampgraph.model.usercode.model_code` (its prints on standard error)."""
    from ampgraph.capture.environment import analysis_environment
    from ampgraph.model.usercode import model_code
    from ampgraph.pipeline.run import prepare
    from ampgraph.ranges import value_ranges

    if request.model is None:
        raise ArgumentError("ranges_of_spec() takes a request of a model spec, not of a module")

    def note(text: str) -> None:
        send(("progress", text))

    with analysis_environment(request.environment()), model_code():
        built = prepare(request.model, seq_len=request.seq_len, force=request.force,
                        progress=note)  # fmt: skip
        result = value_ranges(built, list(request.settings), progress=note,
                              pass_=request.pass_, loss=request.loss)  # fmt: skip
    send(("result", result))


__all__ = ["Item", "ranges_of_spec"]
