#!/usr/bin/env python3
"""The support matrix: each torch release in a venv of its own, each engine and main command run
there on a small model, the results written to ``docs/support-matrix.md``.

Each release gets ``VENVS/torch-X.Y.Z`` (created once: ``pip install torch==X.Y.Z`` from PyPI,
the CUDA build, then this checkout editable with its test extras, so the code tried is the code
here). Then, with that venv's ``ampgraph`` and a cold cache: ``table`` with each tracer (make-fx,
export, fx), and ``table``, ``check``, ``verify --device cpu``, ``render`` and ``table --pass
train``. A cell is ``ok`` where the command exits 0, else the first line it said.

    scripts/support_matrix.py                                  # every release below
    scripts/support_matrix.py --release torch==2.11.0:transformers==5.17.0
    scripts/support_matrix.py --venvs /work/venvs --no-install --out /tmp/matrix.md

Torch is a large download (about 0.9 GB, 5 to 7 GB installed with its CUDA libraries): a
release whose venv cannot be made is a row that says so.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: torch release -> the transformers it is tried with (None: what pip picks for this checkout).
RELEASES: dict[str, str | None] = {
    "torch==2.9.1": None,
    "torch==2.10.0": None,
    "torch==2.11.0": "transformers==5.17.0",  # the first GPU machine's image (DESIGN.md fact 18)
    "torch==2.12.1": None,
    "torch==2.13.0": None,
    "torch==2.14.1": None,
}

#: Column -> the ampgraph arguments it runs (the model is appended).
ENGINES = {
    "make-fx": ["table", "-s", "amp-fp32", "--tracer", "make-fx"],
    "export": ["table", "-s", "amp-fp32", "--tracer", "export"],
    # torch.fx.symbolic_trace cannot trace transformers 5's models (co_varnames): a plain module.
    "fx": ["table", "-s", "amp-fp32", "--tracer", "fx", "--module", "{tmp}/mlp.py:build"],
}

#: The plain module the fx column traces: Linear, LayerNorm, GELU, Linear and a residual add.
MLP = """import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.norm(self.up(x))))


def build():
    return Block(), (torch.randn(2, 8),)
"""
COMMANDS = {
    "table": ["table"],
    "check": ["check"],
    "verify cpu": ["verify", "--device", "cpu", "-s", "amp-fp32"],
    "render": ["render", "-s", "amp-fp32", "--out", "{tmp}"],
    "train": ["table", "--pass", "train", "-s", "amp-fp32"],
}


#: What the page says besides the table: the range, the floor and why, what CI proves.
PROSE = """## The supported range

- **torch 2.9 to 2.14.1** (`pyproject.toml`: `torch>=2.9,<3`). Outside it, the command line
  and `import ampgraph` say so in one line (`ampgraph.compat`): below the floor the command
  refuses (`Error: ampgraph supports torch 2.9 to 2.14.1; this is torch 2.8.0: pip install
  'torch>=2.9,<=2.14.1'`, exit 1) and the import warns; above 2.14.1 both warn that the
  results are unproven and go on. pip is not told an upper bound, so installing ampgraph
  beside a newer torch never downgrades the torch a GPU image shipped.
- **What 2.9 needs, and where the floor is:** on a CUDA build of torch 2.9 with no GPU driver,
  the fake CUDA tensors ampgraph analyses with reach the driver from C++. The CUDA device guard
  is asked for the current stream when the first op on a parameter that requires grad builds
  its autograd node (`InputMetadata`, `torch/csrc/autograd/input_metadata.cpp`: a C++ abort),
  and for the current device by Python-level indexing (`THPVariable_getitem`'s device guard:
  `CUDA driver version is insufficient`) and `.to("cuda")`; SDPA's backend choice
  (`select_sdp_backend`) and the convolution backend choice fake tensors ask for
  (`_select_conv_backend`, bf16 and depthwise) read the device's properties. torch 2.10 answers
  all of these itself: `FakeTensorMode` swaps in a driverless CUDA guard
  (`c10::impl::ensureCUDADeviceGuardSet`, new in 2.10, not bound in 2.9) and the properties it
  cannot read count as "not supported" (SDPA takes math, bf16 convolutions leave cuDNN). On 2.9
  `ampgraph/capture/driverless_29.py` does the same (the guard built from torch's own no-op and
  CUDA guards, after checking each assumption). Two smaller differences are made up in
  `ampgraph.compat`: 2.9's `make_fx` decomposes a composite op that also has a kernel of its own
  (`silu_backward`; 2.10 asks `autograd_would_have_decomposed`), and 2.9's meta kernel of
  `native_layer_norm_backward` gives an fp32 LayerNorm's weight gradient the bf16 input's dtype.
  With those, `table`, `check`, `verify --device cpu` (forward and `--pass train`), `render`
  and the make-fx and export engines print the same bytes on 2.9.1 as on 2.10.0 for llama-tiny
  and opt-125m. Older releases are not tried; torch 2.6 also lacks `guard_or_true`. With a GPU
  driver, 2.9 needs none of the driverless part and ampgraph does none of it (untried: no GPU
  machine had 2.9).
- **transformers 5.17 to 5.24** (`transformers>=5.17,<6`): older 5.x releases fail on bundled
  models (5.0.0: `PhiConfig` has no `pad_token_id`; 5.1.0: Jamba asks for mamba's CUDA kernels,
  and model outputs have no pytree `flatten_with_keys_fn` for the training pass). Outside the
  range is a warning, not a refusal. transformers 4.45 to 4.49 is the hf-fx tracer's overlay
  (`scripts/hf_fx_env.sh`) and is not warned of.
- Each difference between releases that ampgraph's code meets is one function or table of
  `ampgraph.compat`, which names the releases it concerns.

## What CI proves

`make test` runs the main suite on torch 2.14.1, the hf-fx tests on their overlay, then
`make test-floor`: the quick slice on the floor, torch 2.9.1 with torchvision 0.24 in
`.venv-floor` (about 7 GiB from PyPI; 5 to 11 minutes to install on a busy 2-core machine; the
slice takes about 3.5 minutes there, 250 tests). The slice (`FLOOR_TESTS` and
`FLOOR_TRAIN_TESTS` in the Makefile) is the tests of every stage a release can change: the version checks (`test_compat.py`), the policy tables against that
release's dispatcher (`test_policy.py`), both engines node for node (`test_capture_engines.py`,
`test_tracers.py`), the replaced meta kernels against the real CPU kernels
(`test_meta_kernels.py`), library autocast kernels (`test_autocast_kernels.py`), the single ops
and the seed notebook's lines (`test_single_ops.py`, `test_seed_notebook.py`), the training pass
(`test_backward.py`), `verify --device cpu` (`test_verify.py`) and the command line
(`test_cli.py`), and fake CUDA tensors without a driver (`test_compat_fake_cuda.py`). The
rest of the suite exercises the same stages on more models and formats.
The training pass runs in a pytest process of its own: on torch 2.10 and 2.11 a process that ran
a backward cannot use autograd in workers it forks later (torch refuses, or the worker hangs), so
the two tests that run the command line in-process after that module's backwards are left out
there; a command started on its own (the train column above) is not affected.

`test_policy.py` and `test_compat.py` were also run on 2.11.0, 2.12.1 and 2.13.0 (each release's
autocast lists against its own dispatcher): they pass on every release from 2.9 to 2.14.1.

A contributor tries another release with `make test TORCH_SPEC=torch==2.11.0` (the Makefile picks
its torchvision, 0.(N+15), and rebuilds `.venv` when the spec changes).
"""


@dataclass
class Row:
    """One release's results."""

    spec: str
    versions: str = ""
    install: str = ""
    cells: dict[str, str] = field(default_factory=dict)


def _venv(venvs: Path, spec: str, transformers: str | None, install: bool) -> tuple[Path, str]:
    """The release's venv (made if missing and ``install``), and how long making it took."""
    path = venvs / spec.replace("==", "-")
    python = path / "bin" / "python"
    if python.exists() or not install:
        return path, f"existing venv, {_size(path):.1f} GiB" if python.exists() else "none"
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, spec], check=True)
    extra = [transformers] if transformers else []
    subprocess.run([*pip, "-e", f"{ROOT}[test]", spec, *extra], check=True)
    return path, f"{time.monotonic() - start:.0f} s, {_size(path):.1f} GiB"


def _size(path: Path) -> float:
    """What a venv holds, in GiB."""
    real = path.resolve()
    files = (f for f in real.rglob("*") if f.is_file() and not f.is_symlink())
    return sum(f.stat().st_size for f in files) / 2**30


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    line = (errors or lines[-1:] or ["no output"])[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _run(venv: Path, args: list[str], model: str, timeout: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "mlp.py").write_text(MLP)
        argv = [str(venv / "bin" / "ampgraph"), "--no-cache", "-q"]
        argv += [a.replace("{tmp}", tmp) for a in args]
        argv += [] if "--module" in args else [model]
        env = {**os.environ, "AMPGRAPH_CACHE_DIR": tmp}
        try:
            out = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout} s"
    if out.returncode == 0:
        return "ok"
    return f"exit {out.returncode}: {_first_line(out.stderr or out.stdout)}"


def _versions(venv: Path) -> str:
    code = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300
    )
    return out.stdout.strip() if out.returncode == 0 else _first_line(out.stderr)


def measure(spec: str, transformers: str | None, venvs: Path, model: str, install: bool,
            timeout: int) -> Row:  # fmt: skip
    """Make (or find) the release's venv and run every engine and command there."""
    row = Row(spec)
    try:
        venv, row.install = _venv(venvs, spec, transformers, install)
    except subprocess.CalledProcessError as exc:
        row.install = f"could not be installed ({exc})"
        return row
    if not (venv / "bin" / "ampgraph").exists():
        row.install = "no venv (run without --no-install)"
        return row
    row.versions = _versions(venv)
    for name, args in {**ENGINES, **COMMANDS}.items():
        row.cells[name] = _run(venv, args, model, timeout)
        print(f"{spec} {name}: {row.cells[name]}", file=sys.stderr)
    return row


def markdown(rows: list[Row], model: str) -> str:
    """The page: one row per release, a column per engine and command, failures as notes."""
    columns = [*ENGINES, *COMMANDS]
    notes: list[str] = []
    lines = [
        "| torch, transformers | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = []
        for name in columns:
            result = row.cells.get(name, "not run")
            if result == "ok":
                cells.append("ok")
            else:
                notes.append(f"{row.spec}, {name}: {result}")
                cells.append(f"[{len(notes)}]")
        lines.append(f"| {row.versions or row.spec} | " + " | ".join(cells) + " |")
    installs = [f"- {row.spec}: {row.install}" for row in rows]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    where = f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU" if not shutil.which(
        "nvidia-smi") else f"{platform.machine()} with a GPU"  # fmt: skip
    return "\n".join([
        "# Support matrix",
        "",
        "Which torch and transformers releases ampgraph runs on, engine by engine and command by",
        f"command, on `{model}` (the fx tracer on a small plain module: it cannot trace",
        "transformers 5's models). Made by `scripts/support_matrix.py` on",
        f"{when} ({where}); each",
        "release is a venv of its own with the CUDA build of torch from PyPI. `ok`: the command",
        "exited 0; a number: the note below says what it said instead.",
        "",
        *lines,
        "",
        *([f"{i}. {note}" for i, note in enumerate(notes, 1)] or ["No failures."]),
        "",
        "Venvs (time to make, size installed):",
        "",
        *installs,
        "",
        PROSE,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", help="torch==X.Y.Z[:transformers==A.B.C]")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "ampgraph-venvs")
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per command")
    parser.add_argument("--no-install", action="store_true", help="use existing venvs only")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "support-matrix.md")
    args = parser.parse_args(argv)
    releases = RELEASES
    if args.release:
        releases = {}
        for item in args.release:
            spec, _, transformers = item.partition(":")
            releases[spec] = transformers or None
    args.venvs.mkdir(parents=True, exist_ok=True)
    rows = [
        measure(spec, tf, args.venvs, args.model, not args.no_install, args.timeout)
        for spec, tf in releases.items()
    ]
    args.out.write_text(markdown(rows, args.model))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
