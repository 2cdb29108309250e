"""Save the CLI's output on the bundled models in every format, to compare a refactor byte for byte.

Run it before a change and after it, into two folders, then compare::

    python scripts/cli_snapshot.py save /tmp/before
    ... change the code ...
    python scripts/cli_snapshot.py save /tmp/after
    python scripts/cli_snapshot.py compare /tmp/before /tmp/after

Each command's standard output goes to ``NAME.out``, its exit status to ``NAME.rc``, and the files a
command writes (``render``'s diagrams, ``verify --record``, ``baseline write``) under ``NAME.files/``.
Standard error is kept as ``NAME.err`` but not compared (progress and timing lines). What varies
from run to run by design, the date and the seconds of a verify record, is masked before comparing.
``--only PATTERN`` (repeatable) runs the commands whose name holds a PATTERN, ``--missing`` those not saved yet
(a run cut short, continued); ``list`` names them all.

The commands run with ``AMPGRAPH_QUIET=1`` under the interpreter running this script
(``python -m ampgraph``): put the checkout first on ``PYTHONPATH`` and give it a cache folder
(``AMPGRAPH_CACHE_DIR``), which the second run reuses where the analyses did not change.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("opt-125m", "llama-tiny")
#: ``diff --keep-fp32``'s pattern for each model: its MLP's output projection.
KEEP = {"opt-125m": "model.decoder.layers.*.fc2", "llama-tiny": "model.layers.*.mlp.down_proj"}
#: ``fp8 --dot``'s module for each model: its first MLP's input projection.
DOT = {"opt-125m": "model.decoder.layers.0.fc1", "llama-tiny": "model.layers.0.mlp.gate_proj"}

#: The commands whose ``--help`` is compared (their format choices come from the formats).
HELPED = (("table",), ("check",), ("render",), ("verify",), ("audit",), ("diff",),
          ("baseline", "check"), ("ranges",), ("compiled",), ("fp8",), ("fp8-ranges",),
          ("policy",))  # fmt: skip

#: What a run records that differs from one run to the next by design, masked in ``compare``: the
#: date of a verify record, and the seconds of a run (a number, or an object of them per stage).
VOLATILE = re.compile(rb'("(?:date|seconds)": )("[^"]*"|[0-9.e+-]+|\{[^{}]*\})')


def commands(model: str) -> list[tuple[str, list[str]]]:
    """``(name, argv)`` of every command and format of one model; ``{out}`` is its file folder."""
    m = model
    runs: list[tuple[str, list[str]]] = []
    for fmt in ("text", "json", "markdown"):
        runs.append((f"table-{fmt}", ["table", m, "--format", fmt]))
        runs.append((f"table-train-{fmt}", ["table", m, "-s", "amp-fp32", "--pass", "train",
                                            "--format", fmt]))
        runs.append((f"check-{fmt}", ["check", m, "--format", fmt]))
        runs.append((f"diff-{fmt}", ["diff", m, "-s", "amp-fp32", "-s", "amp-half",
                                     "--format", fmt]))
        runs.append((f"diff-keep-{fmt}", ["diff", m, "--keep-fp32", KEEP[m], "--format", fmt]))
    runs.append(("table-only-text", ["table", m, "-s", "amp-fp32", "--only", "Linear"]))
    runs.append(("table-backward-markdown", ["table", m, "-s", "amp-half", "--pass", "backward",
                                             "--format", "markdown"]))
    runs.append(("check-train-text", ["check", m, "-s", "amp-fp32", "--pass", "train"]))
    runs.append(("check-train-json", ["check", m, "-s", "amp-fp32", "--pass", "train",
                                      "--format", "json"]))
    for fmt in ("text", "json", "markdown", "sarif"):
        runs.append((f"audit-{fmt}", ["audit", m, "--format", fmt]))
        runs.append((f"ranges-{fmt}", ["ranges", m, "-s", "amp-fp32", "-s", "half",
                                       "--amp-dtype", "fp16", "--format", fmt]))
    for fmt in ("text", "json"):
        runs.append((f"ranges-diff-{fmt}", ["ranges", m, "-s", "amp-fp32", "-s", "half",
                                            "--amp-dtype", "fp16", "--diff", "--format", fmt]))
        runs.append((f"ranges-train-{fmt}", ["ranges", m, "-s", "half", "--amp-dtype", "fp16",
                                             "--pass", "train", "--format", fmt]))
        runs.append((f"verify-{fmt}", ["verify", m, "--device", "cpu", "-s", "amp-fp32",
                                       "-s", "half", "--format", fmt,
                                       "--record", "{out}/record.json"]))
        runs.append((f"verify-train-{fmt}", ["verify", m, "--device", "cpu", "-s", "amp-fp32",
                                             "--pass", "train", "--format", fmt]))
    for fmt in ("text", "json"):  # the overlays' paths: after the text, or on stderr
        runs.append((f"ranges-overlay-{fmt}", ["ranges", m, "-s", "amp-fp32", "--amp-dtype",
                                               "fp16", "--format", fmt, "--overlay", "{out}"]))
    runs.append(("render-dot", ["render", m, "--format", "dot", "--out", "{out}"]))
    runs.append(("render-train-dot", ["render", m, "-s", "amp-fp32", "--pass", "train",
                                      "--format", "dot", "--out", "{out}"]))
    runs.append(("render-svg-html", ["render", m, "-s", "amp-fp32", "--format", "svg",
                                     "--format", "html", "--format", "explorer",
                                     "--out", "{out}"]))
    runs.append(("baseline-write", ["baseline", "write", "{out}/base.json", m, "-s", "amp-half"]))
    for fmt in ("text", "json", "markdown"):
        # The baseline of another setting, so that the check has a diff to print.
        runs.append((f"baseline-check-{fmt}", ["baseline", "check", "{base}", m, "-s",
                                               "amp-half", "--format", fmt]))
    # --update rewrites the copy with the new flow (the baseline file's text, compared).
    runs.append(("baseline-check-update", ["baseline", "check", "{base}", m, "-s", "amp-half",
                                           "--update"]))
    for view in ("table", "diff", "audit", "json"):
        runs.append((f"compiled-{view}", ["compiled", m, "--view", view]))
    for fmt in ("text", "json"):
        runs.append((f"fp8-{fmt}", ["fp8", m, "--recipe", "torchao:tensorwise", "--format", fmt]))
        runs.append((f"fp8-ranges-{fmt}", ["fp8-ranges", m, "--recipe", "torchao:tensorwise",
                                           "--advise", "--format", fmt]))
    # Two recipes' graphs and survival: of llama-tiny alone (30 s; tracing OPT-125M's training
    # step under rowwise took over 15 minutes on the 2-core machine).
    for fmt in ("text", "json", "markdown") if model == MODELS[1] else ():
        runs.append((f"fp8-diff-{fmt}", ["diff", m, "--recipe", "torchao:tensorwise", "--recipe",
                                         "torchao:rowwise", "--format", fmt]))
    runs.append(("fp8-dot", ["fp8", m, "--recipe", "torchao:tensorwise", "--dot", DOT[m]]))
    # Any operand that flushes a value is kept in bf16: a filter with names in it.
    runs.append(("fp8-ranges-filter", ["fp8-ranges", m, "--recipe", "torchao:tensorwise",
                                       "--advise", "--max-zero-share", "0",
                                       "--write-filter", "{out}/keep.py"]))
    runs.append(("fp8-render-dot", ["render", m, "--recipe", "torchao:tensorwise",
                                    "--format", "dot", "--out", "{out}"]))
    runs.append(("compiled-render-dot", ["render", m, "-s", "amp-fp32", "--compile", "inductor",
                                         "--format", "dot", "--out", "{out}"]))
    if model == MODELS[0]:  # the model-independent commands, once
        for fmt in ("text", "json", "markdown"):
            runs.append((f"policy-{fmt}", ["policy", "--format", fmt]))
            runs.append((f"policy-since-{fmt}", ["policy", "--since", "2.8", "--format", fmt]))
        runs.append(("models", ["models"]))
        for command in HELPED:  # the --format choices as --help shows them
            runs.append((f"help-{'-'.join(command)}", [*command, "--help"]))
    return runs


def save(folder: Path, only: list[str] | None, missing: bool = False) -> int:
    """Run every command (or those whose name holds a pattern of ``only``; with ``missing``,
    those not yet saved in ``folder``) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AMPGRAPH_QUIET": "1"}
    for model in MODELS:
        base = folder / f"{model}.baseline-write.files" / "base.json"
        for name, argv in commands(model):
            key = f"{model}.{name}"
            if (only and not any(o in key for o in only)) or (missing and (folder / f"{key}.rc").exists()):
                continue
            out = folder / f"{key}.files"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            args = [a.format(out=out, base=base) for a in argv]
            if name.startswith("baseline-check"):
                # The check rewrites nothing (no --update), but keep the written file apart.
                copy = out / "base.json"
                shutil.copy(base, copy)
                args = [str(copy) if a == str(base) else a for a in args]
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "ampgraph", *args], env=env,
                                  capture_output=True, cwd=out)  # fmt: skip
            (folder / f"{key}.out").write_bytes(done.stdout.replace(bytes(out), b"{out}"))
            (folder / f"{key}.err").write_bytes(done.stderr)
            (folder / f"{key}.rc").write_text(f"{done.returncode}\n")
            print(f"{key}: exit {done.returncode}, {time.monotonic() - start:.1f} s", flush=True)
    return 0


def _masked(path: Path) -> bytes:
    return VOLATILE.sub(rb"\1<masked>", path.read_bytes())


def compare(before: Path, after: Path) -> int:
    """Every compared file of ``before`` against ``after``'s, byte for byte (volatile masked)."""
    names = sorted(
        p.relative_to(before) for p in before.rglob("*")
        if p.is_file() and p.suffix != ".err"
    )  # fmt: skip
    differ = 0
    for name in names:
        other = after / name
        if not other.exists():
            print(f"missing after: {name}")
            differ += 1
        elif not filecmp.cmp(before / name, other, shallow=False) and (
            _masked(before / name) != _masked(other)
        ):
            print(f"differs: {name}")
            differ += 1
    print(f"{len(names)} files compared, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("save")
    s.add_argument("folder", type=Path)
    s.add_argument("--only", action="append", help="a part of the names to run (repeatable)")
    s.add_argument("--missing", action="store_true", help="only the commands not saved yet")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    sub.add_parser("list")
    args = parser.parse_args()
    if args.what == "save":
        return save(args.folder, args.only, args.missing)
    if args.what == "compare":
        return compare(args.before, args.after)
    for model in MODELS:
        for name, argv in commands(model):
            print(f"{model}.{name}: ampgraph {' '.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
