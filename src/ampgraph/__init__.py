"""ampgraph: what torch.autocast really does inside a PyTorch model, node by node.

>>> from ampgraph import analyze, load_model, Setting
>>> report = analyze(load_model("opt-125m"), Setting.parse("amp-fp32"), check=False)
>>> for call in report.modules[:2]:
...     print(call.hook_line())
[model.decoder.embed_tokens] in=torch.int64 -> out=torch.float32
[model.decoder.embed_positions] in=torch.int64 -> out=torch.float32

Importing ampgraph is cheap: torch is imported by the stages that need it, on first use.
"""

from __future__ import annotations

import sys
import typing

from ampgraph.compat import warn_if_unsupported as _warn_if_unsupported
from ampgraph.errors import (
    AmpgraphError,
    AnalysisError,
    ArgumentError,
    CaptureError,
    ModelSpecError,
    NoDeviceError,
    RenderError,
    SettingError,
    VerifyError,
)
from ampgraph.recipes import Recipe, parse_recipe
from ampgraph.report.records import ModuleCall, NodeRecord, Report
from ampgraph.settings import Setting, seed_matrix
from ampgraph.version import __version__ as __version__

# A torch or transformers outside the range ampgraph was tried with: one warning line, now.
_warn_if_unsupported()

if "IPython" in sys.modules:  # a notebook (or IPython) is running: show reports as diagrams
    from ampgraph.notebook import register as _register_display

    _register_display()

if typing.TYPE_CHECKING:
    from ampgraph.capture.trace import Capture
    from ampgraph.model.build import ModelInputs, load_model
    from ampgraph.pipeline.run import analyze_spec
    from ampgraph.pipeline.stages import analyze, analyze_capture
    from ampgraph.ranges import value_ranges

_LAZY = {
    "analyze": "ampgraph.pipeline.stages",
    "analyze_capture": "ampgraph.pipeline.stages",
    "analyze_spec": "ampgraph.pipeline.run",
    "Capture": "ampgraph.capture.trace",
    "load_model": "ampgraph.model.build",
    "ModelInputs": "ampgraph.model.build",
    "value_ranges": "ampgraph.ranges",
}


def __getattr__(name: str) -> typing.Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ampgraph' has no attribute {name!r}")


__all__ = [
    "AmpgraphError",
    "AnalysisError",
    "ArgumentError",
    "Capture",
    "CaptureError",
    "ModelInputs",
    "ModelSpecError",
    "ModuleCall",
    "NoDeviceError",
    "NodeRecord",
    "Recipe",
    "RenderError",
    "Report",
    "Setting",
    "SettingError",
    "VerifyError",
    "analyze",
    "analyze_capture",
    "analyze_spec",
    "load_model",
    "parse_recipe",
    "seed_matrix",
    "value_ranges",
]


def __dir__() -> list[str]:
    """What users may import (:data:`__all__`, the lazy names included) and the version: not
    the helpers this module imports for itself, nor the submodules that loading attached.

    >>> import ampgraph
    >>> "analyze" in dir(ampgraph), "typing" in dir(ampgraph)
    (True, False)
    """
    return sorted([*__all__, "__version__"])
