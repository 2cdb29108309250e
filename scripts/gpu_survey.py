#!/usr/bin/env python
"""The real-GPU survey: where real CUDA kernels part from ampgraph's prediction, in one run.

Four parts, all against the real kernels of ``--device`` (a GPU; ``cpu`` runs the same code on
the CPU's kernels, the smoke test CI runs):

* **cases**: a small module per class of issue 33 where real kernels and fake ones part (kernel
  dtype coverage, Python scalars beyond a 16-bit range, the CUDA normalisations' mixed dtypes, a
  Python-level raise, library autocast kernels, the casts inside a loss, SDPA in each dtype, ...),
  each verified with ``ampgraph.verify.verify`` in the seed's four settings with bf16 and fp16:
  every node, module line and cast of ampgraph's prediction against the real run;
* **zoo**: the transformers zoo's committed slice (``tests/data/zoo_slice.json``, issue 42): each
  model type rebuilt from its own tests' tiny config, verified as the cases are, as many types
  as ``--zoo-limit`` allows (with the full survey, or the types ``--zoo`` names: any transformers
  model type, one beyond the slice from the zoo's generic tester, ``scripts/zoo_generic.py``);
* **ops**: the fake-kernel survey's cases (``scripts/fake_kernel_survey.py``: torch's OpInfo
  samples in mixed dtypes), each run on the real device's kernel and on fake tensors of that
  device as ampgraph replays them (``ampgraph.annotate.replay.fake_session``);
* **compiled**: ``scripts/compiled_slice.py``: ampgraph's plan of what ``torch.compile`` rounds
  against the code Inductor generates on the device (Triton on a GPU) and its outputs.

It writes a JSON record and a docs page, ``docs/verification/<device>-survey.{json,md}``. Exit
status 1 where anything parts (the record is written all the same). No network; one GPU; about
two minutes on an H100-class machine, bounded by ``--limit`` for the ops::

    PYTHONPATH=src python3 scripts/gpu_survey.py                      # on the GPU machine
    PYTHONPATH=src python3 scripts/gpu_survey.py --device cpu         # the CPU's kernels
    PYTHONPATH=src python3 scripts/gpu_survey.py --cases pdist --zoo llama,bert --ops none
    PYTHONPATH=src python3 scripts/gpu_survey.py --device cpu --cases pad-finfo-min \\
        --settings half --amp-dtypes bf16 --ops addmm --out /tmp/survey   # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_kernel_survey as fks  # noqa: E402 - the survey beside this script, reused
import zoo_slice  # noqa: E402 - the transformers zoo's committed slice (issue 42)
import compiled_slice  # noqa: E402 - torch.compile's generated code against the plan (issue 41)

SCHEMA, VERSION = "ampgraph.gpu_survey", 1
MIN32 = torch.finfo(torch.float32).min
SHORT = {"bfloat16": "bf16", "float16": "fp16"}


# -- the cases: one small module per class ---------------------------------------------------------
def _as_params(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``x`` in the dtype of ``module``'s parameters, as a model's embedding hands it on: the op
    under test is reached in every setting (not stopped by a 16-bit layer fed fp32)."""
    return x.to(next(module.parameters()).dtype)


class Head(nn.Module):
    """A Linear (16 bits where the setting says), then ``fn`` on its output: the op under test
    gets the dtype each setting gives an activation."""

    def __init__(self, fn: Callable[..., torch.Tensor], features: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(features, features)
        self.fn = fn

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.fn(self.lin(_as_params(x, self.lin)), *rest)


class Stack(nn.Module):
    """Modules in a row, as a model wires them; ``cast``: the input in the parameters' dtype
    (without, an fp32 input meets 16-bit parameters: the cases named ``*-fp32-input``)."""

    def __init__(self, *mods: nn.Module, cast: bool = True) -> None:
        super().__init__()
        self.mods = nn.ModuleList(mods)
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_params(x, self) if self.cast else x
        for m in self.mods:
            x = m(x)
        return x[0] if isinstance(x, tuple) else x


class Rnn(nn.Module):
    def __init__(self, kind: type[nn.Module], cast: bool) -> None:
        super().__init__()
        self.rnn = kind(8, 8, batch_first=True)
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(_as_params(x, self) if self.cast else x)[0]


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 8, mode="sum")

    def forward(self, idx: torch.Tensor, offsets: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.bag(idx, offsets, per_sample_weights=w)


class Attention(nn.Module):
    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.masked = masked

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv(_as_params(x, self)).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if self.masked:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Roi(nn.Module):
    """A convolution, then one of torchvision's roi ops (their own autocast kernels)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8 if name.startswith("ps_") else 4, 3, padding=1)
        self.name = name

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        from torchvision import ops

        return getattr(ops, self.name)(self.conv(_as_params(x, self)), boxes, output_size=2)


def _roi_case(name: str) -> Callable[[], Any] | None:
    """The case of one roi op, where torchvision is installed."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    boxes = [[0, 0.0, 0.0, 4.0, 4.0], [0, 1.0, 1.0, 6.0, 6.0]]
    return lambda: (Roi(name), (torch.randn(1, 3, 8, 8), torch.tensor(boxes)))


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


#: name -> (issue 33's class, factory returning (module, example inputs)); None: not installed.
CASES: dict[str, tuple[str, Callable[[], Any] | None]] = {
    "pdist": ("kernel coverage", lambda: (Head(torch.pdist), (_x(4, 8),))),
    "rfft": ("kernel coverage", lambda: (Head(lambda h: torch.fft.rfft(h).abs()), (_x(2, 8),))),
    "pad-finfo-min": ("scalar range", lambda: (
        Head(lambda h: F.pad(h, (1, 1), value=MIN32)), (_x(2, 8),))),
    "masked-fill-finfo-min": ("scalar range", lambda: (
        Head(lambda h: h.masked_fill(h > 0, MIN32)), (_x(2, 8),))),
    "cdist": ("kernel coverage", lambda: (Head(lambda h: torch.cdist(h, h)), (_x(4, 8),))),
    # From ATen's CUDA sources, not yet seen on a GPU (docs/fake-kernels.md, device rules): a
    # 16-bit input with fp32 parameters, which the CPU's group norm takes and CUDA's refuses;
    # BatchNorm1d's 2-D input, CUDA's channels-last kernel.
    "groupnorm-16bit-input": ("CUDA normalisations", lambda: (Head(lambda h: F.group_norm(
        h.to(torch.bfloat16).view(2, 8, 1, 1).expand(2, 8, 2, 2).contiguous(), 2,
        h.new_ones(8, dtype=torch.float32), h.new_zeros(8, dtype=torch.float32))), (_x(2, 8),))),
    "batchnorm1d-fp32-input": ("CUDA normalisations", lambda: (
        Stack(nn.BatchNorm1d(8), cast=False), (_x(4, 8),))),
    "groupnorm-batchnorm": ("CUDA normalisations", lambda: (
        Stack(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.BatchNorm2d(4)), (_x(2, 3, 6, 6),))),
    "groupnorm-instancenorm": ("CUDA normalisations", lambda: (
        Stack(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True)),
        (_x(2, 3, 6, 6),))),
    "layernorm-fp32-input": ("CUDA normalisations", lambda: (
        Stack(nn.LayerNorm(8), cast=False), (_x(2, 8),))),
    "gru-fp32-input": ("Python-level raise", lambda: (Rnn(nn.GRU, False), (_x(2, 4, 8),))),
    "lstm": ("cuDNN RNN autocast", lambda: (Rnn(nn.LSTM, True), (_x(2, 4, 8),))),
    "roi-align": ("library autocast kernels", _roi_case("roi_align")),
    "roi-pool": ("library autocast kernels", _roi_case("roi_pool")),
    "ps-roi-align": ("library autocast kernels", _roi_case("ps_roi_align")),
    "cross-entropy": ("casts inside a loss", lambda: (
        Head(lambda h, y: F.cross_entropy(h, y)), (_x(4, 8), torch.tensor([0, 1, 2, 3])))),
    "huber-loss": ("loss kernels", lambda: (Head(F.huber_loss), (_x(2, 8), _x(2, 8)))),
    "sdpa-causal": ("SDPA", lambda: (Attention(False), (_x(2, 8, 16),))),
    "sdpa-float-mask": ("SDPA", lambda: (
        Attention(True), (_x(2, 8, 16), torch.zeros(8, 8).masked_fill(torch.ones(8, 8).triu(1)
                                                                      .bool(), MIN32)))),
    "conv-fp32-input": ("checks fake kernels skip", lambda: (
        Stack(nn.Conv2d(3, 4, 3, bias=True), cast=False), (_x(1, 3, 6, 6),))),
    "embedding-bag-weights": ("checks fake kernels skip", lambda: (
        Bag(), (torch.tensor([1, 2, 4, 5]), torch.tensor([0, 2]), _x(4)))),
    # index_put's paths (ampgraph.annotate.index_checks): a one-element CPU value under a mask is
    # a masked fill (any dtype, every device); accumulate takes CUDA's sort kernel.
    "index-put-mask-scalar": ("index_put paths", lambda: (Head(lambda h: h.index_put(
        (h[:, 0] > 0,), torch.tensor(1.0))), (_x(4, 8),))),
    "index-put-accumulate": ("index_put paths", lambda: (Head(lambda h: h.index_put(
        (torch.tensor([0, 1]),), torch.ones(2, 8, device=h.device), accumulate=True)),
        (_x(4, 8),))),
}


@dataclass
class CaseRun:
    """One case in one setting: verify's verdict, or the error that stopped it."""

    case: str
    klass: str
    amp_dtype: str
    setting: str
    ok: bool
    summary: str = ""
    disagreements: list[str] = field(default_factory=list)
    eager_hooks: list[str] = field(default_factory=list)
    error: str | None = None


def run_case(name: str, amp: str, setting_names: Sequence[str], device: str) -> list[CaseRun]:
    """``verify`` of one case in each setting; an error (ampgraph's or the case's) is a row."""
    from ampgraph.errors import first_line
    from ampgraph.formats.verify import disagreement_lines, summary_line
    from ampgraph.model.build import ModelInputs
    from ampgraph.settings import seed_matrix
    from ampgraph.verify import verify

    klass, factory = CASES[name]
    assert factory is not None
    rows = []
    for setting in seed_matrix(device, amp):
        if setting.name not in setting_names:
            continue
        torch.manual_seed(0)
        module, inputs = factory()
        model = ModelInputs(name, module.eval(), tuple(inputs))
        try:
            result = verify(model, setting, device=device)
        except Exception as exc:  # noqa: BLE001 - a crash of ampgraph is a finding, not the end
            rows.append(CaseRun(name, klass, amp, setting.name, False,
                                error=f"{type(exc).__name__}: {first_line(exc)}"))  # fmt: skip
            continue
        rows.append(CaseRun(name, klass, amp, setting.name, result.ok, summary_line(result),
                            disagreement_lines(result), result.eager_hooks))  # fmt: skip
    return rows


# -- the ops: OpInfo samples in mixed dtypes, real kernel against ampgraph's fake one -------------
@dataclass
class OpVariant:
    op: str
    call: str
    kind: str  # agrees | lenient | strict | dtype (fake_kernel_survey's names)
    real: str
    ampgraph: str


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # an asynchronous kernel error surfaces at its own call


def _ampgraph_call(call: Callable[[list[Any]], Any], values: list[Any], device: str,
                   seconds: float) -> fks.Outcome:  # fmt: skip
    """The call on fake tensors of ``device`` as ampgraph's annotator replays it."""
    from ampgraph.annotate.replay import fake_session
    from ampgraph.settings import Setting

    def go() -> Any:
        with fake_session(Setting.parse("fp32", device_type=device)):
            fakes = [
                torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
                if isinstance(v, torch.Tensor) else v
                for v in values
            ]  # fmt: skip
            return call(fakes)

    return fks._run(go, fake=True, seconds=seconds)


def survey_sample(opinfo: Any, name: str, sample: Any, device: str) -> list[OpVariant]:
    """Every mixed-dtype variant of one OpInfo sample: the real kernel against ampgraph's."""
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, v in enumerate(leaves) if fks._floating(v)]
    if len(positions) < 2:
        return []

    def call(values: list[Any]) -> Any:
        inp, args, kwargs = pytree.tree_unflatten(values, spec)
        return opinfo.op(inp, *args, **kwargs)

    def real(values: list[Any]) -> fks.Outcome:
        moved = [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]

        def go() -> Any:
            out = call(moved)
            _sync(device)
            return out

        return fks._run(go, fake=False, seconds=5.0)

    base = list(leaves)
    real0, fake0 = real(base), _ampgraph_call(call, base, device, 5.0)
    if real0.error or fake0.error or real0.dtypes != fake0.dtypes:
        return []  # fp32 already parts: a value or a data-dependent size, not a dtype
    out = []
    for assignment in fks._variants(len(positions)):
        dtypes = dict(zip(positions, assignment, strict=True))
        values = [v.to(dtypes[i]) if i in dtypes else v for i, v in enumerate(leaves)]
        got, fake = real(values), _ampgraph_call(call, values, device, 5.0)
        if got.unsupported or fake.unsupported:
            continue
        variant = fks.Variant(name, fks._describe_call(name, values, spec), got, fake)
        out.append(OpVariant(name, variant.call, variant.kind(fake), got.describe(),
                             fake.describe()))  # fmt: skip
    return out


def _op_list(only: Sequence[str] | None) -> list[Any]:
    """The OpInfo entries surveyed, in the database's order (a worker finds them by index)."""
    return [o for o in fks.load_op_db()
            if not only or o.name in only or f"{o.name}.{o.variant_test_name}" in only]  # fmt: skip


def _op_name(opinfo: Any) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def ops_worker(device: str, only: Sequence[str] | None, first: int, limit_s: float,
               log: Path) -> None:  # fmt: skip
    """Survey the ops from index ``first`` on, one JSON line before and after each op in ``log``.

    A CUDA kernel that faults (an illegal memory access) poisons the process's CUDA context: every
    later call fails. So the ops run in a worker process the parent restarts after the op it died
    on; the line written before each op names the culprit."""
    import ampgraph.capture.meta_kernels  # noqa: F401 - ampgraph's replaced meta kernels

    start = time.perf_counter()
    with log.open("a") as out:
        for index, opinfo in enumerate(_op_list(only)[first:], start=first):
            if time.perf_counter() - start > limit_s:
                break
            print(json.dumps({"start": index, "op": _op_name(opinfo)}), file=out, flush=True)
            if os.environ.get("AMPGRAPH_SURVEY_DIE_AT") == _op_name(opinfo):
                os.abort()  # the test's stand-in for a kernel that kills its process
            found: list[OpVariant] = []
            if not fks._skip_reason(opinfo):
                torch.manual_seed(0)
                try:
                    with fks._time_limit(5.0):
                        samples = list(opinfo.sample_inputs("cpu", torch.float32))[:6]
                except Exception:  # noqa: BLE001 - a sample generator that fails or is slow
                    samples = []
                name = _op_name(opinfo)
                found = [v for s in samples for v in survey_sample(opinfo, name, s, device)][:24]
                parting = [v for v in found if v.kind != fks.AGREES]
                if parting:
                    print(f"  {name}: {len(parting)} of {len(found)} part", file=sys.stderr)
            print(json.dumps({"done": index, "variants": [asdict(v) for v in found]}), file=out,
                  flush=True)  # fmt: skip


def _fault(stderr: str) -> str:
    """The line of a dead worker's stderr that says why (the exception's, else the last)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if "Error" in ln.split(":", 1)[0]]
    return (said or lines or ["the worker died without a word"])[-1][:300]


def survey_ops(device: str, only: Sequence[str] | None, limit_s: float) -> dict[str, Any]:
    """The OpInfo pass within ``limit_s`` seconds, at most six samples an op, in worker processes
    (:func:`ops_worker`): an op whose kernel kills its process is a finding of its own, ``crash``,
    and the pass goes on from the next op."""
    import subprocess
    import tempfile

    total, start = len(_op_list(only)), time.perf_counter()
    variants: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []
    visited = first = 0
    while first < total and (left := limit_s - (time.perf_counter() - start)) > 0:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "ops.jsonl"
            command = [sys.executable, __file__, "--device", device, "--ops-worker", str(first),
                       "--limit", f"{left:.1f}", "--ops-log", str(log)]  # fmt: skip
            if only:
                command += ["--ops", ",".join(only)]
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines()
                                     if ln.startswith("  ")))  # fmt: skip
            started, done = None, None
            for line in log.read_text().splitlines() if log.exists() else []:
                entry = json.loads(line)
                if "start" in entry:
                    started = entry
                else:
                    done = entry["done"]
                    variants += entry["variants"]
        visited = (done + 1) if done is not None else visited
        if proc.returncode == 0:
            break
        if started is None or started["start"] == done:
            raise RuntimeError(f"the ops worker failed before any op: {_fault(proc.stderr)}")
        crashes.append(asdict(OpVariant(started["op"], "(the op's whole run: its process died)",
                                        "crash", _fault(proc.stderr), "")))  # fmt: skip
        print(f"  {started['op']}: its process died: {_fault(proc.stderr)}", file=sys.stderr)
        first = visited = started["start"] + 1
    parting = [v for v in variants if v["kind"] != fks.AGREES] + crashes
    return {"visited": visited, "of": total, "seconds": round(time.perf_counter() - start, 1),
            "variants": len(variants), "ops": len({v["op"] for v in variants}),
            "parting": parting}  # fmt: skip


# -- the record and the page -----------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def render(record: dict[str, Any]) -> str:
    """The docs page: where and how it ran, the cases, the ops that part."""
    v, runs, ops = record["versions"], record["cases"], record["ops"]
    parted = [r for r in runs if not r["ok"]]
    lines = [
        f"# Real-kernel survey: {record['device_name']} ({record['device']})", "",
        (f"Written by `scripts/gpu_survey.py` on {record['date'][:10]} with torch "
         f"{v.get('torch')}, transformers {v.get('transformers')}, Python {v.get('python')}"
         + (f", CUDA {v['cuda']}" if record["device"] == "cuda" else "")
         + f", ampgraph {v.get('ampgraph')}, in {record['seconds']:.0f} s: "
         f"`{_cell(record['command'])}`. The JSON record beside this page has every line."),
        "",
        (f"**Cases**: {len(runs) - len(parted)} of {len(runs)} runs agree (each case verified with "
         "`ampgraph verify` against the real kernels: every node, module line and cast). "
         f"**Ops**: {ops['variants']} mixed-dtype variants of {ops['ops']} OpInfo ops "
         f"({ops['visited']} of {ops['of']} visited in {ops['seconds']:.0f} s), "
         f"{len(ops['parting'])} part from ampgraph's fake kernels."),
        "", "## Cases", "",
        "| case | class | autocast dtype | setting | result |", "|---|---|---|---|---|",
    ]  # fmt: skip
    for r in runs:
        result = r["error"] or r["summary"].split(": ", 1)[-1]
        lines.append(f"| {r['case']} | {r['klass']} | {SHORT[r['amp_dtype']]} | {r['setting']} "
                     f"| {'' if r['ok'] else '**parts**: '}{_cell(result)} |")  # fmt: skip
    if record["skipped_cases"]:
        lines += ["", "Not run (library not installed): " + ", ".join(record["skipped_cases"])]
    if parted:
        lines += ["", "### Where the cases part", "", "Each case's first parting run in full; the "
                  "JSON record has every line.", ""]  # fmt: skip
    for case in dict.fromkeys(r["case"] for r in parted):
        mine = [r for r in parted if r["case"] == case]
        where = ", ".join(f"{r['setting']} ({SHORT[r['amp_dtype']]})" for r in mine)
        first = mine[0]
        detail = [first["error"]] if first["error"] else first["disagreements"]
        lines += [f"- **{case}** parts in {where}:"]
        lines += [f"  - `{_cell(d.strip()[:400])}`" for d in detail[:4]]
        if len(detail) > 4:
            lines.append(f"  - and {len(detail) - 4} more lines")
    lines += ["", "## Ops where the real kernel and ampgraph part", ""]
    if not ops["parting"]:
        lines.append("None: every variant surveyed agrees.")
    else:
        lines += ["| op | class | call | real kernel | ampgraph |", "|---|---|---|---|---|"]
        lines += [f"| `{p['op']}` | {p['kind']} | `{_cell(p['call'])}` | {_cell(p['real'])} "
                  f"| {_cell(p['ampgraph'])} |" for p in ops["parting"]]  # fmt: skip
    lines += compiled_slice.render(record.get("compiled") or []) if record.get("compiled") else []
    return "\n".join(lines) + "\n"


def write(out: Path, record: dict[str, Any]) -> tuple[Path, Path]:
    from ampgraph.report.writing import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{record['device']}-survey"
    data, page = stem.with_suffix(".json"), stem.with_suffix(".md")
    atomic_write(data, (json.dumps(record, indent=1) + "\n").encode())
    atomic_write(page, render(record).encode())
    return data, page


def _names(text: str | None, known: Sequence[str]) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()] or list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        raise SystemExit(f"unknown: {', '.join(unknown)} (known: {shown})")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--settings", help="comma-separated settings (default: the four)")
    parser.add_argument("--amp-dtypes", default="bf16,fp16")
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all); 'none': skip")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds for the ops pass")
    parser.add_argument("--zoo", help="zoo types (default: the slice's, with all the cases; "
                        "'none'; a type beyond the slice: the generic tester)")
    parser.add_argument("--zoo-limit", type=float, default=180.0, help="seconds for the zoo")
    parser.add_argument("--compiled", help="compiled-flow models (default: all, with the full "
                        "survey; 'none'): Inductor's code on the device against ampgraph's plan")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "verification")
    parser.add_argument("--ops-worker", type=int, help=argparse.SUPPRESS)  # survey_ops's child
    parser.add_argument("--ops-log", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    only = [o.strip() for o in (args.ops or "").split(",") if o.strip()] or None
    if args.ops_worker is not None:
        with _quiet():
            ops_worker(args.device, only, args.ops_worker, args.limit, args.ops_log)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run this on the GPU machine, or pass --device cpu",
              file=sys.stderr)  # fmt: skip
        return 2
    cases = _names(args.cases, list(CASES))
    settings = _names(args.settings, ["fp32", "half", "amp-half", "amp-fp32"])
    amps = [{"bf16": "bfloat16", "fp16": "float16"}.get(a, a) for a in _names(
        args.amp_dtypes, ["bf16", "fp16"])]  # fmt: skip
    start = time.perf_counter()
    runs: list[CaseRun] = []
    with _quiet():
        for name in (c for c in cases if CASES[c][1] is not None):
            for amp in amps:
                rows = run_case(name, amp, settings, args.device)
                for r in rows:
                    verdict = r.error or ("agrees" if r.ok else "PARTS")
                    print(f"{r.case} {r.setting} {SHORT[amp]}: {verdict}", file=sys.stderr)
                    for line in [] if r.ok else r.disagreements[:6]:
                        print(f"    {line.strip()[:300]}", file=sys.stderr)
                runs += rows
        runs += _zoo(args, amps, settings)
        compiled = [] if args.compiled == "none" or (args.compiled is None and args.cases) else (
            compiled_slice.survey(_names(args.compiled, compiled_slice.MODELS), [
                s for s in compiled_slice.SETTINGS if s in settings], amps, args.device))
        record = _record(args, argv, start, cases, runs, NO_OPS, compiled)
        write(args.out, record)  # the cases kept, whatever becomes of the ops pass
        ops = survey_ops(args.device, only, args.limit) if args.ops != "none" else NO_OPS
    record = _record(args, argv, start, cases, runs, ops, compiled)
    data, page = write(args.out, record)
    print(f"record: {data}\npage: {page}", file=sys.stderr)
    return 0 if record["ok"] else 1


def _zoo(args: argparse.Namespace, amps: Sequence[str], settings: Sequence[str]) -> list[CaseRun]:
    """The zoo slice's types verified as cases (all of them with the full survey, those ``--zoo``
    names with a slice of the cases), as many as ``--zoo-limit`` seconds allow."""
    if args.zoo == "none" or (args.zoo is None and args.cases):
        return []
    slice_names = list(zoo_slice.load_slice())
    if args.zoo is None:
        names = slice_names
    else:  # a type beyond the slice comes from the zoo's generic tester
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        beyond = sorted(set(MODEL_MAPPING_NAMES) - set(slice_names))
        names = _names(args.zoo, [*slice_names, *beyond])
    rows, unreached = zoo_slice.survey(names, amps, settings, args.device, args.zoo_limit)
    for r in rows:
        print(f"{r['case']} {r['setting']} {SHORT[r['amp_dtype']]}: "
              f"{r['error'] or ('agrees' if r['ok'] else 'PARTS')}", file=sys.stderr)  # fmt: skip
    if unreached:
        print(f"zoo: not reached in {args.zoo_limit:.0f} s: {', '.join(unreached)}", file=sys.stderr)
    return [CaseRun(**r) for r in rows]


NO_OPS: dict[str, Any] = {"visited": 0, "of": 0, "seconds": 0.0, "variants": 0, "ops": 0,
                          "parting": []}  # fmt: skip


def _record(args: argparse.Namespace, argv: Sequence[str] | None, start: float,
            cases: Sequence[str], runs: Sequence[CaseRun], ops: dict[str, Any],
            compiled: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The JSON record of what ran so far."""
    from ampgraph.verify import device_name
    from ampgraph.verify.results import now, versions

    record = {
        "schema": SCHEMA, "version": VERSION, "device": args.device,
        "device_name": device_name(args.device), "versions": versions(), "date": now(),
        "platform": platform.platform(),
        "command": " ".join(["scripts/gpu_survey.py", *(sys.argv[1:] if argv is None else argv)]),
        "seconds": round(time.perf_counter() - start, 1),
        "skipped_cases": [c for c in cases if CASES[c][1] is None],
        "cases": [asdict(r) for r in runs], "ops": ops, "compiled": list(compiled),
    }  # fmt: skip
    record["ok"] = all(r.ok for r in runs) and not ops["parting"] and all(
        r["ok"] for r in compiled)
    return record


@contextlib.contextmanager
def _quiet() -> Any:
    """The kernels' warnings and fake_tensor's log of a kernel that raises are noise here."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
