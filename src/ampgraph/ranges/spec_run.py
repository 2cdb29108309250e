"""``ampgraph ranges``'s work on a model spec: built once, run for real in fp32 and judged in each
setting (:func:`ampgraph.ranges.value_ranges`), sending progress notes and the result as it goes:
the work the command line confines (:func:`ampgraph.pipeline.confine.confine`), as ``verify``'s.

>>> items = []
>>> ranges_of_spec("llama-tiny", ["amp-fp32"], items.append, seq_len=4, amp_dtype="fp16")
>>> kinds = [kind for kind, _ in items]
>>> kinds[0], kinds[-1], items[-1][1].model
('progress', 'result', 'llama-tiny')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampgraph.settings import Setting

#: What :func:`ranges_of_spec` sends: ``("progress", note)``, then ``("result", RangesResult)``.
Item = tuple[str, Any]


def ranges_of_spec(
    spec: str,
    settings: Sequence[Setting | str],
    send: Callable[[Item], None],
    *,
    seq_len: int = 8,
    seed: int = 0,
    weights_dir: Path | None = None,
    force: bool = False,
    pass_: str = "forward",
    loss: str | int | None = None,
    device_type: str = "cuda",
    amp_dtype: str = "bf16",
) -> None:
    """Build the model ``spec`` names (as :func:`ampgraph.pipeline.run.prepare` does) and send
    its :func:`~ampgraph.ranges.value_ranges` in ``settings``, with a progress note before each
    stage; the arguments are :func:`~ampgraph.ranges.value_ranges`'s. The model's own code runs
    in :func:`ampgraph.model.usercode.model_code` (its prints on standard error)."""
    from ampgraph.model.usercode import model_code
    from ampgraph.pipeline.run import prepare
    from ampgraph.ranges import value_ranges

    def note(text: str) -> None:
        send(("progress", text))

    with model_code():
        built = prepare(spec, seq_len=seq_len, force=force, progress=note)
        result = value_ranges(
            built, settings, seed=seed, force=force, progress=note, weights_dir=weights_dir,
            pass_=pass_, loss=loss, device_type=device_type, amp_dtype=amp_dtype,
        )  # fmt: skip
    send(("result", result))


__all__ = ["Item", "ranges_of_spec"]
