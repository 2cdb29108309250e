#!/usr/bin/env python3
"""Where a cold ``ampgraph render`` spends its time, phase by phase, in one process.

Runs what ``ampgraph render MODEL`` runs on an empty cache, but serially in this one process
(``-j 1``), and times each phase: imports, building the model, capture, annotation (with the
proof that a shared graph serves a setting), the dispatcher check, the diagrams' layout. Each
phase is given in wall seconds and in CPU seconds (this process's, plus ``dot``'s): CPU time is
what a loaded machine does not distort, and the sum of the phases is the floor a parallel run
divides among its cores. Prints one JSON object; ``bench/bench.py`` runs it as a cold process
and prints the table.

    python bench/profile_cold.py opt-125m -s fp32 -s half -s amp-half -s amp-fp32
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

START_WALL = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Phases:
    """Wall and CPU seconds per named phase; nested phases count only in the innermost."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[str] = []
        self._paused: dict[str, tuple[float, float]] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        outer = self._stack[-1] if self._stack else None
        now_wall, now_cpu = time.perf_counter(), time.process_time() + children_cpu()
        if outer is not None:  # stop the outer phase's clock while this one runs
            w, c = self._paused.pop(outer)
            self.wall[outer] = self.wall.get(outer, 0.0) + now_wall - w
            self.cpu[outer] = self.cpu.get(outer, 0.0) + now_cpu - c
        self._stack.append(name)
        self._paused[name] = (now_wall, now_cpu)
        try:
            yield
        finally:
            end_wall, end_cpu = time.perf_counter(), time.process_time() + children_cpu()
            w, c = self._paused.pop(name)
            self.wall[name] = self.wall.get(name, 0.0) + end_wall - w
            self.cpu[name] = self.cpu.get(name, 0.0) + end_cpu - c
            self.calls[name] = self.calls.get(name, 0) + 1
            self._stack.pop()
            if outer is not None:
                self._paused[outer] = (end_wall, end_cpu)

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        """Time every call of ``owner.attr`` as phase ``name``."""
        real: Callable[..., Any] = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return real(*args, **kwargs)

        setattr(owner, attr, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="opt-125m")
    parser.add_argument("-s", "--setting", action="append", help="default: the four")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--pass", dest="pass_", default="forward",
                        choices=("forward", "backward", "train"), help="as ampgraph render's")  # fmt: skip
    args = parser.parse_args()
    phases = Phases()

    with phases.phase("import ampgraph (no torch)"):
        from ampgraph.model.specs import spec_kind  # noqa: F401 - what the CLI reads before torch
        from ampgraph.pipeline.run import frozen_imports
        from ampgraph.settings import Setting, seed_matrix
    # As the CLI does (ampgraph.pipeline.run.prepare): no garbage collection while torch,
    # transformers and the model load, and what they made frozen after.
    with frozen_imports():
        with phases.phase("import torch"):
            import torch  # noqa: F401
        with phases.phase("import ampgraph's analysis"):
            from ampgraph.capture import reads
            from ampgraph.model.build import architecture_for
            from ampgraph.pipeline import sharing
            from ampgraph.pipeline import stages as analysis
            from ampgraph.render import files
        with phases.phase("import the model's code (transformers)"):
            config = json.loads((ROOT / "src/ampgraph/model/configs" / f"{args.model}.json").read_text()) if (
                ROOT / "src/ampgraph/model/configs" / f"{args.model}.json").is_file() else None  # fmt: skip
            if config is not None:
                import transformers

                for name in (*config.get("architectures", []),
                             architecture_for(config["model_type"]).auto_class):  # fmt: skip
                    getattr(transformers, name, None)  # transformers imports modelling code lazily
        with phases.phase("build the model on meta"):
            from ampgraph.model.build import load_model

            model = load_model(args.model)

    settings = [Setting.parse(s) for s in args.setting] if args.setting else seed_matrix()
    phases.wrap(analysis, "capture", "capture")
    phases.wrap(analysis, "annotate", "annotate")
    phases.wrap(sharing, "annotate_observing", "annotate (+ proof a graph is shared)")
    phases.wrap(reads, "why_not_shared", "annotate (+ proof a graph is shared)")
    phases.wrap(analysis, "run_check", "check (dispatcher)")
    phases.wrap(analysis, "module_calls", "module view")
    if args.pass_ != "forward":
        from ampgraph.train import backward
        from ampgraph.train import joint_check as backward_check

        phases.wrap(backward, "trace_joint", "joint trace (forward + loss + backward)")
        phases.wrap(backward, "backward_section", "backward records")
        phases.wrap(backward_check, "check_backward", "check of the backward (dispatcher)")
    files.LAYOUT_WORKERS = 1  # layouts one at a time, as the phases are timed
    phases.wrap(files, "run_dot", "layout (dot)")
    phases.wrap(files, "diagram", "diagram source")
    phases.wrap(files, "overview_diagram", "diagram source")
    with phases.phase("other"):
        options = {} if args.pass_ == "forward" else {"pass_": args.pass_}
        reports = analysis.analyze_many(
            model, settings, check=not args.no_check, workers=1, **options
        )
        with tempfile.TemporaryDirectory() as out:
            files.render_files(reports, out, pass_=args.pass_)
    total_wall = time.perf_counter() - START_WALL
    total_cpu = time.process_time() + children_cpu()  # the interpreter's start-up included
    shared = sum(1 for r in reports if (r.capture or {}).get("graph_of"))
    timed = {
        name: {"wall_s": phases.wall[name], "cpu_s": phases.cpu[name], "calls": phases.calls[name]}
        for name in phases.wall
    }
    # The interpreter's start-up and what ran between phases.
    rest = {
        "wall_s": total_wall - sum(phases.wall.values()),
        "cpu_s": total_cpu - sum(phases.cpu.values()),
    }
    json.dump(
        {
            "model": args.model,
            "pass": args.pass_,
            "settings": [s.name for s in settings],
            "captures": phases.calls.get("capture", 0),
            "shared": shared,
            "phases": timed,
            "before_s": rest,
            "total": {"wall_s": total_wall, "cpu_s": total_cpu},
        },
        sys.stdout,
        indent=1,
    )


if __name__ == "__main__":
    main()
