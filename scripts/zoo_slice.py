"""The zoo's committed slice (tests/data/zoo_slice.json): transformers model types rebuilt from
their testers' exported tiny configs and inputs, for the suite and the GPU survey (issue 42).

``scripts/zoo.py --export-slice`` writes the data (a config dict, and each input's shape, dtype
and, for integer inputs, values); no transformers checkout is needed to rebuild them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_generic, beside this file
SLICE_FILE = ROOT / "tests" / "data" / "zoo_slice.json"


def load_slice(path: Path = SLICE_FILE) -> dict[str, dict[str, Any]]:
    """The slice's entries by model type.

    >>> "llama" in load_slice()
    True
    """
    return json.loads(path.read_text())


def _tensor(spec: dict[str, Any]) -> Any:
    import torch

    if "value" in spec:  # a plain keyword (the generic tester's use_cache=False)
        return spec["value"]
    dtype = getattr(torch, spec["dtype"])
    if "values" in spec:
        return torch.tensor(spec["values"], dtype=dtype).reshape(spec["shape"])
    # Floating inputs were exported as shape and dtype: drawn here from seed 0.
    return torch.rand(spec["shape"], generator=torch.Generator().manual_seed(0)).to(dtype)


def build(name: str, entry: dict[str, Any]) -> Any:
    """``name``'s base model from its exported config (eager attention, seed 0, eval mode) with
    its exported inputs, as a ``ModelInputs``."""
    import torch
    from transformers import AutoConfig, AutoModel

    from ampgraph.model.build import ModelInputs

    config = dict(entry["config"])
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    inputs = {k: _tensor(v) for k, v in entry["inputs"].items()}
    return ModelInputs(name, model, (), inputs)


def model(name: str) -> Any:
    """``name`` as the survey builds it: from the slice, else a transformers model type from the
    zoo's generic tester (``zoo_generic``: no transformers checkout needed), as a ``ModelInputs``.
    """
    entries = load_slice()
    if name in entries:
        return build(name, entries[name])
    import torch

    from ampgraph.model.build import ModelInputs
    from zoo_args import base_model
    from zoo_generic import generic

    config, inputs = generic(name)
    torch.manual_seed(0)
    module = base_model(name, config).eval()
    return ModelInputs(name, module, (), inputs)


def survey(names: Sequence[str], amps: Sequence[str], settings: Sequence[str], device: str,
           limit_s: float) -> tuple[list[dict[str, Any]], list[str]]:
    """``verify`` of each type (:func:`model`) against ``device``'s real kernels in each setting,
    as the GPU survey's rows (``case``, ``setting``, ``ok``...), until ``limit_s`` seconds have
    passed; and the types not reached."""
    from ampgraph.errors import first_line
    from ampgraph.settings import seed_matrix
    from ampgraph.formats.verify import disagreement_lines, summary_line
    from ampgraph.verify import verify

    start, rows = time.perf_counter(), []
    for i, name in enumerate(names):
        if time.perf_counter() - start > limit_s:
            return rows, list(names[i:])
        pairs = ((a, s) for a in amps for s in seed_matrix(device, a) if s.name in settings)
        for amp, setting in pairs:
            row = {"case": f"zoo/{name}", "klass": "transformers zoo", "amp_dtype": amp,
                   "setting": setting.name, "ok": False, "summary": "", "disagreements": [],
                   "eager_hooks": [], "error": None}  # fmt: skip
            try:
                result = verify(model(name), setting, device=device)
            except Exception as exc:  # noqa: BLE001 - a crash of ampgraph is a finding
                row["error"] = f"{type(exc).__name__}: {first_line(exc)}"
            else:
                row.update(ok=result.ok, summary=summary_line(result),
                           disagreements=disagreement_lines(result))  # fmt: skip
            rows.append(row)
    return rows, []
