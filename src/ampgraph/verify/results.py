"""What a verification found: agreement counts, disagreements, and the JSON record (written to a
file by :func:`ampgraph.formats.outputs.write_verify_record`; the text a person reads is
:mod:`ampgraph.formats.verify`'s).

>>> Agreement(354, 354).to_dict()
{'agree': 354, 'total': 354}
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ampgraph.report.records import Report
from ampgraph.settings import Setting, short_dtype

SCHEMA = "ampgraph.verify"
#: 2: the agree/total counts are ``agreement`` (version 1 called them ``figures``).
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Agreement:
    """How many of the compared items agree: ``agree/total``; apart from the total, how many
    could not be compared: *not analysed* (ampgraph honestly could not follow the forward
    there: no prediction) and *not comparable* (the real run left the captured path), with why.

    >>> Agreement(5, 5, not_analysed=2).to_dict()
    {'agree': 5, 'total': 5, 'not_analysed': 2}
    """

    agree: int
    total: int
    not_analysed: int = 0
    not_comparable: int = 0
    why: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"agree": self.agree, "total": self.total}
        # Only where some were not compared: a record where all were is as it always was.
        for key in ("not_analysed", "not_comparable"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.why:
            out["why"] = list(self.why)
        return out


@dataclass(frozen=True)
class Disagreement:
    """One place where real execution contradicts the annotation."""

    kind: str  # "node" | "module" | "cast"
    node: str  # node name, or module path for kind "module"
    op: str  # op name, or module class
    predicted: str
    observed: str
    module: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "node": self.node, "op": self.op, "module": self.module,
            "predicted": self.predicted, "observed": self.observed,
        }  # fmt: skip


@dataclass(kw_only=True)
class Verification:
    """What every verification of an analysis against real execution records: the model, the
    setting and the real device, the agreement counts, and the disagreements.

    One piece of code for the forward's (:class:`VerifyResult`) and the training step's
    (:class:`ampgraph.verify.training.TrainVerifyResult`) results: each names its counts
    (:meth:`agreement`) and what its record adds.
    """

    model: str
    setting: Setting
    device: str
    device_name: str
    versions: dict[str, str]
    date: str
    disagreements: list[Disagreement]
    seconds: dict[str, float] = field(default_factory=dict)
    #: The prediction that was verified (not part of the JSON record: ``ampgraph table`` has it).
    report: Report | None = field(default=None, repr=False)

    #: What the JSON record calls the agreement counts.
    AGREEMENT_KEY: ClassVar[str] = "agreement"
    #: What was run: the forward (:class:`VerifyResult`) or the training step.
    pass_: ClassVar[str] = "forward"

    @property
    def ok(self) -> bool:
        return not self.disagreements

    def agreement(self) -> dict[str, Agreement]:
        """The agreement counts by name, in the order the summary line and the record give them."""
        raise NotImplementedError

    def _header(self) -> dict[str, Any]:
        """The record's first fields, before ``model``."""
        return {}

    def _run(self) -> dict[str, Any]:
        """The record's fields on what was run, after ``setting``."""
        return {}

    def _observed(self) -> dict[str, Any]:
        """The record's fields on what was observed, after ``disagreements``."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON record: device, versions and date, setting, agreement, disagreements."""
        return {
            **self._header(),
            "model": self.model,
            "setting": self.setting.to_dict(),
            **self._run(),
            "device": self.device,
            "device_name": self.device_name,
            "versions": self.versions,
            "date": self.date,
            "ok": self.ok,
            self.AGREEMENT_KEY: {k: a.to_dict() for k, a in self.agreement().items()},
            "disagreements": [d.to_dict() for d in self.disagreements],
            **self._observed(),
            "seconds": self.seconds,
        }


@dataclass(kw_only=True)
class VerifyResult(Verification):
    """The three cross-checks of one model in one setting on one real device."""

    nodes: Agreement
    modules: Agreement
    casts: Agreement
    #: The seed notebook's hook lines, as the eager model printed them.
    eager_hooks: list[str] = field(default_factory=list)

    def agreement(self) -> dict[str, Agreement]:
        return {"nodes": self.nodes, "modules": self.modules, "casts": self.casts}

    def _header(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": SCHEMA_VERSION}

    def _observed(self) -> dict[str, Any]:
        return {"eager_hooks": self.eager_hooks}


def verify_record(results: Sequence[VerifyResult], **extra: Any) -> dict[str, Any]:
    """One JSON record for several results (the file ``ampgraph verify --record`` writes).

    ``extra`` fields (a command line, timings) are added at the top level.

    >>> verify_record([], command="ampgraph verify")["command"]
    'ampgraph verify'
    """
    first = results[0] if results else None
    record = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "device": first.device if first else None,
        "device_name": first.device_name if first else None,
        "versions": first.versions if first else versions(),
        "date": first.date if first else now(),
        "ok": all(r.ok for r in results),
        "results": [r.to_dict() for r in results],
    }
    record.update(extra)
    return record


def versions() -> dict[str, str]:
    """The analysis's versions (:func:`ampgraph.pipeline.stages.versions`), Python's and CUDA's."""
    import torch

    from ampgraph.pipeline.stages import versions as analysis_versions

    out = analysis_versions()
    out["python"] = platform.python_version()
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def now() -> str:
    """The time a record is made, in UTC, as ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "SCHEMA",
    "Agreement",
    "Disagreement",
    "Verification",
    "VerifyResult",
    "verify_record",
]
