"""What one analysis is asked for, in one immutable value that the stages hand down.

An :class:`AnalysisRequest` is built once, where the command line (``ampgraph.cli``) or the
Python API (:func:`ampgraph.analyze`, :func:`ampgraph.analyze_spec`, ...) reads its arguments,
and every stage after reads what it needs from it: the model spec, the settings, the pass and
its loss, the sequence length, the tables, the tracer, the bound on the run. It is also what a
cached report is keyed by (:meth:`AnalysisRequest.key_fields`,
:func:`ampgraph.pipeline.cache.entry_requests`). Torch-free and picklable: it crosses to the
worker processes as it is.

>>> request = AnalysisRequest("llama-tiny", ("amp-fp32",), pass_="train", loss="logits")
>>> request.settings[0].name, request.training, request.traced_by
('amp-fp32', True, 'make-fx')
>>> sorted(request.key_fields(request.settings[0]))
['backward_autocast', 'check', 'loss', 'pass_', 'seq_len', 'setting']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import ampgraph.arguments as arguments
from ampgraph.capture.environment import AnalysisEnvironment, RealRun
from ampgraph.errors import SettingError
from ampgraph.model.specs import DEFAULT_TRACER, spec_tracer
from ampgraph.report.records import PASSES
from ampgraph.settings import Setting, seed_matrix


@dataclass(frozen=True)
class AnalysisRequest:
    """One analysis: which model, in which settings, of which pass, and how it is bounded.

    ``model`` is a model spec (``"llama-tiny"``, a :class:`~ampgraph.model.specs.ModelSpec`),
    or None where the caller hands the model itself (:func:`ampgraph.analyze` of an
    ``nn.Module``). ``settings`` are :class:`~ampgraph.settings.Setting` objects or their names
    (none: the seed notebook's four). ``pass_`` is ``forward``, ``backward`` or ``train``;
    ``loss`` names the output the training step's loss reduces and ``backward_autocast`` runs
    its backward inside the autocast context. ``check`` runs the dispatcher check; ``tables``
    annotates with another torch release's policy tables; ``sources`` keeps each node's place
    in the model's code; ``tracer`` is the tracer (None: the spec's own). ``force`` analyses a
    model beyond what ampgraph refuses, and runs one for real beyond its memory checks;
    ``timeout`` bounds the analysis in seconds (None: no bound). ``seed``, ``weights_dir`` and
    ``stream`` are what a real run (``verify``, ``ranges``) chooses:
    :class:`~ampgraph.capture.environment.RealRun`; no report of the dispatcher's depends on them.

    >>> AnalysisRequest("opt", ("fp32",), pass_="sideways")
    Traceback (most recent call last):
    ...
    ampgraph.errors.SettingError: unknown pass 'sideways': use one of forward, backward, train
    """

    model: str | None = None
    settings: tuple[Setting, ...] = ()
    pass_: str = "forward"
    seq_len: int = 8
    loss: str | int | None = None
    backward_autocast: bool = False
    check: bool = True
    tables: str | None = None
    sources: bool = False
    tracer: str | None = None
    force: bool = False
    timeout: float | None = None
    seed: int = 0
    weights_dir: Path | None = None
    stream: bool | None = None

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES:
            raise SettingError(f"unknown pass {self.pass_!r}: use one of {', '.join(PASSES)}")
        # Checked once, here, for every entry point that builds a request (the API's, the CLI's).
        settings = self.settings
        parsed = arguments.settings(settings) if settings != () else tuple(seed_matrix())
        object.__setattr__(self, "settings", parsed)
        object.__setattr__(self, "seq_len", arguments.integer("seq_len", self.seq_len, minimum=1))
        object.__setattr__(self, "timeout", arguments.timeout(self.timeout))
        object.__setattr__(self, "seed", arguments.seed(self.seed))
        object.__setattr__(self, "weights_dir", arguments.path("weights_dir", self.weights_dir))

    @classmethod
    def of(cls, model: str | None = None, settings: Sequence[Setting | str] | None = None,
           options: dict[str, Any] | None = None, **fields_: Any) -> AnalysisRequest:  # fmt: skip
        """A request from loose keyword arguments, as the Python API takes them: ``options``
        (a dict of the pass, ``loss``, ``backward_autocast``, ``tables``, ``sources``...) beside
        the named fields. An unknown option is a :class:`TypeError`.

        >>> AnalysisRequest.of("opt", ["fp32"], {"pass_": "backward"}, seq_len=4).pass_
        'backward'
        """
        known = {f.name for f in fields(cls)}
        given = {**(options or {}), **fields_}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"unknown analysis option {unknown[0]!r}: use one of "
                            f"{', '.join(sorted(known - {'model', 'settings'}))}")  # fmt: skip
        if settings is None:
            return cls(model=model, **given)  # the seed notebook's four
        return cls(model=model, settings=arguments.settings(settings), **given)

    def environment(self) -> AnalysisEnvironment:
        """What the stages run under for this request (handed down by
        :func:`ampgraph.capture.environment.analysis_environment`).

        >>> AnalysisRequest("opt-125m", ("amp-fp32",), sources=True, seed=2).environment()
        ...                                                    # doctest: +NORMALIZE_WHITESPACE
        AnalysisEnvironment(stack_traces=True, tables=None,
            real_run=RealRun(seed=2, force=False, weights_dir=None, stream=None))
        """
        real_run = RealRun(seed=self.seed, force=self.force, weights_dir=self.weights_dir,
                           stream=self.stream)  # fmt: skip
        return AnalysisEnvironment(stack_traces=self.sources, tables=self.tables,
                                   real_run=real_run)  # fmt: skip

    @property
    def training(self) -> bool:
        """Whether the pass is a training step's (the model is traced in training mode)."""
        return self.pass_ != "forward"

    @property
    def traced_by(self) -> str:
        """The tracer: the one asked for, else the spec's own, else make-fx."""
        if self.tracer is not None:
            return self.tracer
        return spec_tracer(self.model) if self.model is not None else DEFAULT_TRACER

    def with_settings(self, settings: Sequence[Setting]) -> AnalysisRequest:
        """The same request for ``settings`` instead (one worker's share of them)."""
        return replace(self, settings=tuple(settings))

    def key_fields(self, setting: Setting) -> dict[str, Any]:
        """What the report in ``setting`` depends on of this request, as the cache keys it.

        Only what differs from the defaults a forward analysis had before each option existed
        is there (a non-default tracer, a training pass, other tables, source lines), so the
        keys of entries stored then stay valid.
        """
        out: dict[str, Any] = {"seq_len": self.seq_len, "setting": setting.to_dict(),
                               "check": self.check}  # fmt: skip
        if self.traced_by != DEFAULT_TRACER:
            out["tracer"] = self.traced_by
        if self.training:
            out.update(pass_=self.pass_, loss=self.loss, backward_autocast=self.backward_autocast)
        if self.tables is not None:
            out["tables"] = self.tables
        if self.sources:
            out["sources"] = True
        return out


__all__ = ["AnalysisRequest"]
