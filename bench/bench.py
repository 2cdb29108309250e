#!/usr/bin/env python3
"""ampgraph's speed budgets, measured as cold processes on this machine.

Runs each case as a fresh Python process, several times, and prints a table of the median wall
time and the peak resident memory of each, with the ratios the budgets are written in:

* ``ampgraph cold``: ``ampgraph render`` of OPT-125M in the four settings, with the dispatcher
  check, into a fresh output folder, with an empty cache;
* ``ampgraph warm``: the same with the cache filled by a previous run;
* ``torchview``: ``torchview.draw_graph`` of the same OPT-125M on the meta device, rendered to SVG
  (the reference peer; installed for the benchmark only, into ``bench/.deps``);
* ``export floor``: one bare ``torch.export`` of OPT-125M on meta (what any capture costs);
* ``llama-3-70b``: ampgraph on the Llama-3-70B-shaped config, one setting, folded render.

Budgets (issue 5): cold <= torchview; warm <= torchview / 4; llama-3-70b <= 30 s and <= 2 GB;
no diagram's layout over 5 s.

    python bench/bench.py            # 3 runs per case
    python bench/bench.py --runs 5 --json bench/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / "bench" / ".deps"
PYTHON = sys.executable
AMPGRAPH = [PYTHON, "-m", "ampgraph"]

TORCHVIEW_SCRIPT = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from torchview import draw_graph
data = json.load(open(sys.argv[1]))
data = {k: v for k, v in data.items() if not k.startswith("_")}
config = AutoConfig.for_model(data.pop("model_type"), **data)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config).eval()
ids = torch.ones(1, 8, dtype=torch.long, device="meta")
graph = draw_graph(model, input_data=ids, device="meta", depth=3, use_cache=False)
graph.visual_graph.render(sys.argv[2], format="svg")
"""

EXPORT_SCRIPT = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
data = json.load(open(sys.argv[1]))
data = {k: v for k, v in data.items() if not k.startswith("_")}
config = AutoConfig.for_model(data.pop("model_type"), **data)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config).eval()
ids = torch.ones(1, 8, dtype=torch.long, device="meta")
ep = torch.export.export(model, (), {"input_ids": ids, "use_cache": False}, strict=False)
print(len(ep.graph.nodes))
"""


@dataclass
class Case:
    name: str
    walls: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def rss(self) -> float:
        return max(self.rss_mb)


def tree_rss_mb(root: int) -> float:
    """Resident memory of a process and all its descendants, summed, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(rss.get(pid, 0) for pid in tree) / 2**20


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run a cold process; return its wall seconds and the peak summed RSS (MB) of it and the
    worker processes it forks, sampled every 20 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mb(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"benchmark step failed: {' '.join(cmd)}\n{stderr}")
    return wall, peak


def ensure_torchview() -> dict[str, str]:
    """torchview for the benchmark only: installed into bench/.deps, never into the project."""
    if not (DEPS / "torchview").exists():
        subprocess.run(
            [PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(DEPS),
             "torchview==0.2.7"],
            check=True,
        )  # fmt: skip
    return {**os.environ, "PYTHONPATH": f"{DEPS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def config_path(name: str) -> str:
    return str(ROOT / "src" / "ampgraph" / "configs" / f"{name}.json")


def layout_times(dot_dir: Path) -> dict[str, float]:
    """Seconds ``dot`` takes to lay out each diagram source in ``dot_dir``."""
    times = {}
    for path in sorted(dot_dir.glob("*.dot")):
        start = time.perf_counter()
        subprocess.run(["dot", "-Tsvg", "-o", os.devnull, str(path)], check=True)
        times[path.name] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median reported)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--skip-70b", action="store_true", help="leave out the 70B-shaped case")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ampgraph-bench-"))
    cases = {n: Case(n) for n in ("ampgraph cold", "ampgraph warm", "torchview", "export floor")}
    if not args.skip_70b:
        cases["llama-3-70b"] = Case("llama-3-70b")
    tv_env = ensure_torchview()
    base_env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(work / "unused")}
    for i in range(args.runs):
        cache = work / f"cache-{i}"
        env = {**base_env, "AMPGRAPH_CACHE_DIR": str(cache)}
        render = [*AMPGRAPH, "render", "--out", str(work / f"cold-{i}")]
        steps = [
            ("ampgraph cold", render, env),
            ("ampgraph warm", [*AMPGRAPH, "render", "--out", str(work / f"warm-{i}")], env),
            ("torchview", [PYTHON, "-c", TORCHVIEW_SCRIPT, config_path("opt-125m"),
                           str(work / f"tv-{i}")], tv_env),
            ("export floor", [PYTHON, "-c", EXPORT_SCRIPT, config_path("opt-125m")], base_env),
        ]  # fmt: skip
        if "llama-3-70b" in cases:
            steps.append((
                "llama-3-70b",
                [*AMPGRAPH, "render", "llama-3-70b", "-s", "amp-fp32", "--out",
                 str(work / f"70b-{i}")],
                {**base_env, "AMPGRAPH_CACHE_DIR": str(work / f"cache70-{i}")},
            ))  # fmt: skip
        for name, cmd, step_env in steps:
            wall, rss = run(cmd, step_env)
            cases[name].walls.append(wall)
            cases[name].rss_mb.append(rss)
            print(f"run {i + 1}/{args.runs} {name:<14} {wall:6.2f} s {rss:7.0f} MB", flush=True)

    dot_dir = work / "dot"
    run([*AMPGRAPH, "render", "--format", "dot", "--out", str(dot_dir)], base_env | {
        "AMPGRAPH_CACHE_DIR": str(work / "cache-0")})  # fmt: skip
    layouts = layout_times(dot_dir)

    tv = cases["torchview"].wall
    print()
    print(f"machine: {platform.node()} · {os.cpu_count()} cores · {platform.processor() or platform.machine()}"
          f" · Python {platform.python_version()} · " + " · ".join(
              f"{k} {v}" for k, v in versions().items()) + f" · {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'case':<16}{'median s':>10}{'min s':>8}{'peak MB':>9}{'vs torchview':>14}")
    for case in cases.values():
        print(f"{case.name:<16}{case.wall:>10.2f}{min(case.walls):>8.2f}{case.rss:>9.0f}"
              f"{case.wall / tv:>13.2f}x")  # fmt: skip
    print()
    budgets = [
        ("cold <= torchview", cases["ampgraph cold"].wall <= tv,
         f"{cases['ampgraph cold'].wall:.2f} s vs {tv:.2f} s"),
        ("warm <= torchview / 4", cases["ampgraph warm"].wall <= tv / 4,
         f"{cases['ampgraph warm'].wall:.2f} s vs {tv / 4:.2f} s"),
        ("layout <= 5 s each", max(layouts.values()) <= 5,
         f"slowest {max(layouts, key=layouts.get)} {max(layouts.values()):.2f} s"),
    ]  # fmt: skip
    if "llama-3-70b" in cases:
        big = cases["llama-3-70b"]
        budgets += [
            ("llama-3-70b <= 30 s", big.wall <= 30, f"{big.wall:.2f} s"),
            ("llama-3-70b <= 2 GB", big.rss <= 2048, f"{big.rss:.0f} MB"),
        ]
    for label, ok, detail in budgets:
        print(f"{'PASS' if ok else 'FAIL'}  {label:<24} {detail}")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": {"node": platform.node(), "cores": os.cpu_count(),
                        "processor": platform.processor(), "python": platform.python_version()},
            "versions": versions(),
            "date": time.strftime("%Y-%m-%d"),
            "cases": {n: asdict(c) | {"median_s": c.wall, "peak_mb": c.rss} for n, c in cases.items()},
            "layouts_s": layouts,
            "budgets": {label: {"pass": ok, "detail": d} for label, ok, d in budgets},
        }, indent=1))  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


def versions() -> dict[str, str]:
    """The installed versions that the figures depend on: those that key ampgraph's cache."""
    from ampgraph.cache import environment

    env = environment()
    return {dist: env[dist] for dist in ("ampgraph", "torch", "transformers")}


if __name__ == "__main__":
    main()
