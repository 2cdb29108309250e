#!/usr/bin/env python3
"""``ampgraph compiled``'s speed budget: OPT-125M's plan against ``torch.compile``'s own compile.

Each figure comes from a fresh Python process (imports paid before the clock starts), on the
same meta-built OPT-125M (random weights, 8 tokens) in one setting (default ``amp-fp32``, CPU):

* ``capture``: ampgraph's capture of the graph (make_fx with export's passes), which the plan
  starts from;
* ``plan``: :func:`ampgraph.compiled.inductor.plan`: Inductor's lowering, scheduling, fusion
  and kernel code generation on fake tensors, stopped before any compiler runs;
* ``torch.compile cold``: the first call of ``torch.compile(model)`` (Dynamo, AOT autograd,
  Inductor, the C++ compiler, one run) with an empty Inductor cache directory
  (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder: nothing reused);
* ``torch.compile warm``: the same in a second fresh process on that now-filled cache directory
  (Inductor's FX graph cache and compiled kernels reused: what a user sees on a rerun);
* ``eager call``: the model's plain call, for scale.

Times are wall seconds and CPU seconds (this process and the children it has reaped; Inductor's
compile workers live until the process exits, so a compile's CPU figure is a lower bound). The
budget (issue 41): the plan costs at most what ``torch.compile`` takes; judged on wall time
against the cold compile (a warm one skips Inductor's lowering altogether, on an FX graph cache
hit: the plan's own counterpart is ampgraph's analysis cache), and printed PASS or FAIL. ``--profile N`` prints the
plan's N most expensive functions (cProfile, cumulative), to see what it spends on.

    python bench/compiled_bench.py
    python bench/compiled_bench.py --setting half --json bench/results/compiled.json
    python bench/compiled_bench.py --profile 25
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    """CPU seconds of this process and of the children it waited for (compile workers, gcc)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _model(spec: str, setting_name: str) -> tuple[Any, Any, dict[str, Any]]:
    """The loaded model, its setting and real inputs (imports done before any clock)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import compiled_matrix as cm  # the proof's materialisation of meta-built models, reused

    from ampgraph.model.build import load_model
    from ampgraph.settings import Setting

    model = load_model(spec)
    setting = Setting.parse(setting_name, device_type="cpu")
    kwargs = {k: cm._real(v) for k, v in model.kwargs.items()}
    return model, setting, kwargs


def child_plan(spec: str, setting_name: str, profile: int) -> dict[str, Any]:
    """Capture, then plan, timed separately (and profiled where asked)."""
    from ampgraph.capture.trace import capture
    from ampgraph.compiled.inductor import plan

    model, setting, _ = _model(spec, setting_name)
    t, c0 = time.perf_counter(), _cpu()
    c = capture(model, setting)
    out: dict[str, Any] = {"capture_s": time.perf_counter() - t, "capture_cpu_s": _cpu() - c0}
    t, c0 = time.perf_counter(), _cpu()
    if profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        flow = prof.runcall(plan, c)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(profile)
        out["profile"] = text.getvalue()
    else:
        flow = plan(c)
    out.update(plan_s=time.perf_counter() - t, plan_cpu_s=_cpu() - c0,
               kernels=len(flow.kernels), dropped=len(flow.dropped()))  # fmt: skip
    return out


def child_compile(spec: str, setting_name: str) -> dict[str, Any]:
    """``torch.compile``'s first call (compile included), then an eager call for scale."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import compiled_matrix as cm

    model, setting, kwargs = _model(spec, setting_name)
    module = cm._materialise(model.module).to(getattr(torch, setting.param_dtype))
    amp = torch.autocast("cpu", getattr(torch, setting.amp_dtype), enabled=setting.autocast)
    with torch.no_grad(), amp:
        compiled = torch.compile(module, backend="inductor")
        t, c0 = time.perf_counter(), _cpu()
        compiled(**kwargs)
        out = {"compile_s": time.perf_counter() - t, "compile_cpu_s": _cpu() - c0}
        t = time.perf_counter()
        module(**kwargs)
        out["eager_s"] = time.perf_counter() - t
    return out


def _run(kind: str, args: argparse.Namespace, cache: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    cmd = [sys.executable, __file__, "--child", kind, "--model", args.model,
           "--setting", args.setting, "--profile", str(args.profile)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"Error: the {kind} run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-125m")
    p.add_argument("--setting", default="amp-fp32")
    p.add_argument("--profile", type=int, default=0, help="print the plan's N costliest calls")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # one measurement in this fresh process; its JSON on the last line
        fn = {"plan": lambda: child_plan(args.model, args.setting, args.profile),
              "compile": lambda: child_compile(args.model, args.setting)}[args.child]  # fmt: skip
        print(json.dumps(fn()))
        return
    plan = _run("plan", args)
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        cold = _run("compile", args, cache)
        warm = _run("compile", args, cache)
    if plan.get("profile"):
        print(plan.pop("profile"))
    rows = [("capture (ampgraph's trace)", plan["capture_s"], plan["capture_cpu_s"]),
            ("plan (lowering, fusion, kernel codegen)", plan["plan_s"], plan["plan_cpu_s"]),
            ("capture + plan", plan["capture_s"] + plan["plan_s"],
             plan["capture_cpu_s"] + plan["plan_cpu_s"]),
            ("torch.compile, cold cache (first call)", cold["compile_s"], cold["compile_cpu_s"]),
            ("torch.compile, warm cache (first call)", warm["compile_s"], warm["compile_cpu_s"]),
            ("eager call", warm["eager_s"], float("nan"))]  # fmt: skip
    print(f"{args.model}, setting {args.setting} (cpu), {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; fresh process per line")  # fmt: skip
    print(f"{'':44} {'wall s':>8} {'cpu s':>8}")
    for name, wall, cpu in rows:
        print(f"{name:44} {wall:8.1f} {cpu:8.1f}")
    total = plan["capture_s"] + plan["plan_s"]
    verdict = "PASS" if total <= cold["compile_s"] else "FAIL"
    print(f"{verdict}: capture + plan {total:.1f} s against torch.compile's cold compile "
          f"{cold['compile_s']:.1f} s ({total / cold['compile_s']:.2f}x); warm: "
          f"{warm['compile_s']:.1f} s ({total / warm['compile_s']:.2f}x)")
    if args.json:
        record = {"model": args.model, "setting": args.setting, "plan": plan, "cold": cold,
                  "warm": warm, "machine": platform.machine(), "cores": os.cpu_count(),
                  "verdict": verdict}  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
