"""A library call leaves torch as it found it (issue 46): importing ampgraph changes nothing in
torch, and analyses of every kind (forward, train, verify, ranges in memory and streamed, a
what-if, a forward that raises) restore what they changed (:mod:`ampgraph.capture.environment`).

Each observation runs in a fresh process, so nothing another test did is seen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from ampgraph.capture.environment import active, analysis_environment

#: What torch's kernel really does for each op ampgraph's meta kernels may replace (every entry
#: ``meta_kernels.REPLACED`` has on any torch: a test checks it): operands of mixed
#: dtypes, where torch's kernel and ampgraph's differ, called on fake tensors (a
#: ``FakeTensorMode``, as a fake-tensor trace outside any analysis runs them), on meta tensors and
#: in ``make_fx``: each call's output dtypes, or the first line of its error. Python Meta kernels
#: are called through the dispatcher's map in the first and last (``capture/scoped_library.py``),
#: which ``Library._destroy()`` left naming ampgraph's.
_KERNEL_BEHAVIOUR = r"""
def kernel_behaviour():
    import logging
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32

    def calls(device):
        def e(*shape, dtype=f32):
            return torch.empty(shape, dtype=dtype, device=device)
        return {
            "_grouped_mm": [(e(8, 16, dtype=bf), e(4, 16, 32), e(4, dtype=i32)),
                            (e(8, 16), e(4, 16, 32), e(4, dtype=i32))],
            "addr": [(e(), e(3, dtype=bf), e(4, dtype=bf))],
            "huber_loss": [(e(3, dtype=bf), e(3))],
            "soft_margin_loss": [(e(3, dtype=bf), e(3))],
            "binary_cross_entropy_with_logits": [(e(5), e(5, dtype=bf)), (e(5, dtype=bf), e(5))],
            "threshold_backward": [(e(3, dtype=bf), e(3), 0.0)],
            "mse_loss_backward": [(e(), e(3, dtype=bf), e(3), 1)],
            "addmv": [(e(5), e(5, 10, dtype=bf), e(10, dtype=bf))],
            "native_layer_norm_backward": [(e(2, 4, dtype=bf), e(2, 4, dtype=bf), [4], e(2, 1),
                                            e(2, 1), e(4), e(4), [True, True, True])],
        }

    def outcome(fn, args):
        try:
            out = fn(*args)
        except Exception as exc:
            return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]
        return [str(getattr(o, "dtype", None))
                for o in (out if isinstance(out, (tuple, list)) else (out,))]

    def traced(op, args):  # the op's node in a make_fx trace, constants closed over
        where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        def fn(*tensors):
            full = list(args)
            for i, t in zip(where, tensors):
                full[i] = t
            return op(*full)
        graph = make_fx(fn, tracing_mode="fake")(*[args[i] for i in where]).graph
        [node] = [n for n in graph.nodes if n.target is op]
        return node.meta["val"]

    logging.getLogger("torch._subclasses.fake_tensor").disabled = True  # its refusals' logs
    seen = {}
    for name in calls("cpu"):
        op = getattr(torch.ops.aten, name).default
        with FakeTensorMode():
            fake = [outcome(op, args) for args in calls("cpu")[name]]
        seen[name] = {"fake": fake,
                      "meta": [outcome(op, args) for args in calls("meta")[name]],
                      "make_fx": [outcome(lambda *a: traced(op, a), args)
                                  for args in calls("cpu")[name]]}
    logging.getLogger("torch._subclasses.fake_tensor").disabled = False
    return seen
"""

#: What torch is, as seen by a user's code: the dtypes torch's meta kernels give the ops ampgraph
#: replaces, every kernel registered for them (``_dispatch_dump``), the Python kernels and meta
#: table entries (by identity), the functions and flags ampgraph has ever changed, ATen's ops
#: (ampgraph's own, in a namespace of their own, are inert: ``capture/raises.py``),
#: ``os._exit``, and whether glibc's mmap threshold was fixed (a streamed ranges run used to fix
#: it for the rest of the process).
_OBSERVE = _KERNEL_BEHAVIOUR + r'''
import ctypes, json, os, sys
import torch
import torch.nn.functional as F

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2

def malloc_threshold_fixed():
    """Whether glibc's mmap threshold was fixed (mallopt) rather than rising: after a mapped
    24 MB block is freed, a rising threshold is past 16 MB and a 16 MB block comes from the heap
    (extended for it: the trim leaves no free top to serve it from); a fixed one maps it."""
    libc.free(libc.malloc(24 << 20))
    libc.malloc_trim(0)
    mapped = libc.mallinfo2().hblks
    block = libc.malloc(16 << 20)
    fixed = libc.mallinfo2().hblks > mapped
    libc.free(block)
    libc.malloc_trim(0)
    return fixed

def observe():
    from torch._C import DispatchKey
    from torch._decomp import meta_table
    ops = ["huber_loss", "soft_margin_loss", "addr", "threshold_backward", "mse_loss_backward",
           "binary_cross_entropy_with_logits", "_grouped_mm", "native_layer_norm_backward",
           "addmv", "_thnn_fused_gru_cell", "cudnn_grid_sampler", "cudnn_convolution",
           "scaled_dot_product_attention", "lstm"]
    x = torch.empty(3, dtype=torch.bfloat16, device="meta")
    t = torch.empty(3, device="meta")
    seen = {
        "huber": str(F.huber_loss(x, t).dtype),
        "soft_margin": str(F.soft_margin_loss(x, t).dtype),
        "select_conv_backend": id(torch._C._select_conv_backend),
        "compiler_flags": [torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag],
        "autocast": [id(getattr(torch, q)) for q in dir(torch) if q.startswith(
            ("is_autocast", "set_autocast", "get_autocast"))],
        "cuda": [id(getattr(torch.cuda, q)) for q in ("get_device_capability",
            "get_device_properties", "get_device_name", "is_bf16_supported")],
        "autocast_state": [torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda")],
        # ATen's ops (other namespaces grow with the modules an analysis imports: Inductor's
        # prims; ampgraph's own, ``ampgraph::raises``, with the first raise path).
        "aten_ops": sorted(n for n in torch._C._dispatch_get_all_op_names()
                           if n.startswith("aten::")),
        "os_exit": id(os._exit),
        "malloc_threshold_fixed": malloc_threshold_fixed(),
        "meta_kernels": kernel_behaviour(),
    }
    for name in ops:
        op = getattr(torch.ops.aten, name).default if name != "lstm" else torch.ops.aten.lstm.input
        seen[name] = [torch._C._dispatch_dump(op._schema.name),
                      id(op.py_kernels.get(DispatchKey.Meta)), id(meta_table.get(op))]
    return seen

before = observe()
import ampgraph
import ampgraph.capture, ampgraph.capture.trace, ampgraph.pipeline.stages, ampgraph.review.whatif
import ampgraph.verify, ampgraph.ranges, ampgraph.train.backward
results = {"import": observe() == before}
from click.testing import CliRunner
from ampgraph.cli import main
for name, args in json.loads(sys.argv[1]).items():
    if isinstance(args, str):  # a library call
        exec(args, {})
    else:
        out = CliRunner().invoke(main, ["--no-cache", "-q", "-j", "1", *args])
        assert out.exit_code in (0, 1), (name, out.output, out.exception)
    after = observe()
    results[name] = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
print(json.dumps(results))
'''

#: One analysis of each kind, as the CLI runs it (its exit code may be 1: a finding).
_ANALYSES = {
    "forward": ["table", "llama-tiny", "-s", "amp-fp32"],
    "train": ["table", "llama-tiny", "-s", "amp-fp32", "--pass", "train"],
    "verify": ["verify", "llama-tiny", "-s", "amp-fp32", "--device", "cpu"],
    "ranges": ["ranges", "llama-tiny", "--amp-dtype", "fp16"],
    "what-if": ["diff", "llama-tiny", "-s", "amp-fp32", "--keep-fp32", "*mlp*"],
    "what-if tables": ["diff", "llama-tiny", "-s", "amp-half", "--tables", "2.11", "--tables",
                       "2.14"],
    # One weight at a time from a model folder's safetensors, in this process.
    "ranges streamed": """
import json, tempfile
from pathlib import Path
import torch
from safetensors.torch import save_file
from ampgraph.ranges import value_ranges
folder = Path(tempfile.mkdtemp())
(folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8,
                                                "n_head": 2, "vocab_size": 16, "n_positions": 8}))
save_file({"wte.weight": torch.ones(16, 8)}, str(folder / "model.safetensors"))
result = value_ranges(str(folder), ["amp-fp32"], seq_len=4, weights_dir=folder, stream=True)
assert "read one weight at a time" in result.weights, result.weights
""",
    # A forward that raises in one setting: the capture's ampgraph::raises path.
    "raise": """
import torch
from torch import nn
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_group
net = nn.Sequential(nn.GRU(8, 8, batch_first=True))
reports = analyze_group(ModelInputs("gru", net, (torch.randn(2, 5, 8),)), ["half"])
assert any(n.op == "ampgraph.raises.default" for n in reports[0].nodes), "no raise path"
""",
}


def _run(code: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_and_every_kind_of_analysis_leave_torch_as_it_was() -> None:
    results = json.loads(_run(_OBSERVE, json.dumps(_ANALYSES)).splitlines()[-1])
    assert results == {"import": True, **{name: {} for name in _ANALYSES}}


#: Torch's kernels for the ops ampgraph's meta kernels replace, and ``torch.library._impls``,
#: before any analysis, inside one, and outside after analyses of several kinds in this process.
_KERNELS_AFTER_ANALYSES = _KERNEL_BEHAVIOUR + r"""
import json
import torch
import torch.library
before, impls = kernel_behaviour(), set(torch.library._impls)
import ampgraph
from ampgraph.capture.environment import analysis_environment
from ampgraph.capture.meta_kernels import REPLACED
from ampgraph.pipeline.stages import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.review.whatif import preview_moves
from ampgraph.verify import verify
with analysis_environment():
    inside = kernel_behaviour()
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
model = ModelInputs("net", net, (torch.randn(2, 8),))
analyses = {
    "llama-tiny": lambda: ampgraph.analyze(ampgraph.load_model("llama-tiny"),
                                           ampgraph.Setting.parse("amp-fp32")),
    "train": lambda: analyze(model, "autocast=on,device=cpu", pass_="train"),
    "what-if": lambda: preview_moves(model, "autocast=on,device=cpu", ["linear=fp32"],
                                     check=False),
    "verify": lambda: verify(model, "autocast=on,device=cpu"),
}
changed = {}
for name, run in analyses.items():
    run()
    after = kernel_behaviour()
    changed[name] = {op: [before[op], after[op]] for op in before if before[op] != after[op]}
print(json.dumps({
    "uncovered": sorted(set(REPLACED) - set(before)),
    "differ_inside": sorted(op for op in before if before[op] != inside[op]),
    "changed": changed,
    "impls_lost": sorted(impls - set(torch.library._impls)),
}))
"""


def test_torchs_own_meta_kernels_run_again_after_analyses() -> None:
    """Outside any analysis, a fake tensor, a meta tensor and ``make_fx`` run torch's kernel for
    every op ampgraph's meta kernels replace, after analyses as before them (a fake tensor ran
    ampgraph's ``_grouped_mm`` after one ``ampgraph.analyze``: ``Library._destroy()`` had left
    the dispatcher's map of Python kernels naming it), and ``Library.impl``'s record of
    registered keys keeps torch's. Inside, the kernels type otherwise: the comparison can fail."""
    result = json.loads(_run(_KERNELS_AFTER_ANALYSES).splitlines()[-1])
    assert result["uncovered"] == []
    assert {"_grouped_mm", "huber_loss", "addr"} <= set(result["differ_inside"])
    assert result["changed"] == {"llama-tiny": {}, "train": {}, "what-if": {}, "verify": {}}
    assert result["impls_lost"] == []


def _huber_dtypes() -> tuple[torch.dtype, torch.dtype]:
    x = torch.empty(3, dtype=torch.bfloat16, device="meta")
    t = torch.empty(3, device="meta")
    f = torch.nn.functional
    return f.huber_loss(x, t).dtype, f.soft_margin_loss(x, t).dtype


def test_the_environment_is_what_the_observation_sees_and_is_reentrant() -> None:
    """The observation above can fail: inside, the meta kernels type as the real kernels do (the
    input's dtype); nested entries change nothing; the outermost exit restores, an error too."""
    assert _huber_dtypes() == (torch.float32, torch.float32) and not active()
    with analysis_environment():
        assert _huber_dtypes() == (torch.bfloat16, torch.bfloat16)
        with analysis_environment():
            assert _huber_dtypes() == (torch.bfloat16, torch.bfloat16)
        assert active() and _huber_dtypes() == (torch.bfloat16, torch.bfloat16)
    assert _huber_dtypes() == (torch.float32, torch.float32) and not active()
    with pytest.raises(KeyboardInterrupt), analysis_environment():
        raise KeyboardInterrupt
    assert _huber_dtypes() == (torch.float32, torch.float32) and not active()


def test_a_kernel_torch_would_not_give_back_is_refused_and_the_rest_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over a Python Meta kernel whose function cannot be read back (none is, on torch 2.9 to
    2.14: here one is made so), the environment refuses in one line before it registers there,
    and what it had already replaced (huber_loss's kernels and meta table entry) is torch's
    again: a refusal leaves nothing behind either."""
    from torch._C import DispatchKey
    from torch._decomp import meta_table

    from ampgraph.capture import meta_kernels, scoped_library
    from ampgraph.errors import AmpgraphError

    names = [n for n in meta_kernels.REPLACED
             if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}", "Meta")]  # fmt: skip
    assert names.index("huber_loss") < len(names) - 1
    last = getattr(torch.ops.aten, names[-1]).default
    huber = torch.ops.aten.huber_loss.default
    before = (huber.py_kernels.get(DispatchKey.Meta), meta_table.get(huber))
    read = scoped_library.python_kernel
    monkeypatch.setattr(
        scoped_library, "python_kernel",
        lambda op, key: (True, None) if op is last else read(op, key),
    )  # fmt: skip
    with pytest.raises(AmpgraphError, match="does not give back"), analysis_environment():
        pass
    assert not active() and _huber_dtypes() == (torch.float32, torch.float32)
    assert (huber.py_kernels.get(DispatchKey.Meta), meta_table.get(huber)) == before
    monkeypatch.undo()
    with analysis_environment():  # and the next analysis enters as usual
        assert _huber_dtypes() == (torch.bfloat16, torch.bfloat16)


#: A model whose compiled graph carries the dtypes meta kernels give (aot_autograd runs them on
#: fake tensors): the graph ``torch.compile`` makes, as text with every value's dtype.
_COMPILE = r'''
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

graphs = []
def keep(gm, example_inputs):
    graphs.append("\n".join(f"{n.format_node()} :: {getattr(n.meta.get('val'), 'dtype', None)}"
                            for n in gm.graph.nodes))
    return gm.forward

def step(x, t, w):
    y = torch.relu(x @ w)
    return F.huber_loss(y, t) + F.soft_margin_loss(y, t)

def compiled():
    torch._dynamo.reset()
    args = (torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 8), torch.randn(8, 8,
            dtype=torch.bfloat16))
    torch.compile(step, backend=aot_autograd(fw_compiler=keep))(*args)
    return graphs[-1]

before = compiled()
import ampgraph
from ampgraph.capture.environment import analysis_environment
after_import = compiled()
report = ampgraph.analyze(ampgraph.load_model("llama-tiny"), ampgraph.Setting.parse("amp-fp32"))
after = compiled()
with analysis_environment():
    inside = compiled()
print(before == after_import, before == after, before != inside, "bfloat16" in before)
'''


def test_torch_compile_gives_the_same_graph_before_and_after_an_analysis() -> None:
    assert _run(_COMPILE).split()[-4:] == ["True", "True", "True", "True"]


def test_an_analysis_reads_its_own_tables_and_another_thread_the_installed_ones() -> None:
    """The release an analysis's environment names is this thread's, for the block: another
    thread at that moment, and this one after, read the installed torch's lists."""
    import threading

    from ampgraph.capture.environment import AnalysisEnvironment
    from ampgraph.policy import ACTIVE_RELEASE, lookup, release_in_use

    def seen() -> tuple[str | None, str]:
        return lookup("cuda", "aten::rms_norm", ""), release_in_use()

    installed = seen()
    assert installed[1] == ACTIVE_RELEASE
    # rms_norm joined CUDA's fp32 list after 2.11: the release whose lists answer otherwise.
    release = "2.11" if installed[0] == "fp32" else "2.14"
    other: list[tuple[str | None, str]] = []
    with analysis_environment(AnalysisEnvironment(tables=release)):
        assert seen() == ("fp32" if release == "2.14" else None, release)
        thread = threading.Thread(target=lambda: other.append(seen()))
        thread.start()
        thread.join()
    assert other == [installed] and seen() == installed


def test_the_real_run_is_the_requests_environment_handed_down() -> None:
    """What a real run may do (seed, weights, --force, one weight at a time) is the request's
    frozen environment: ``ranges_of_spec`` passes none of it as an argument, and ``value_ranges``
    reads the seed it was handed (its values change with it), an explicit argument winning."""
    from pathlib import Path

    from ampgraph.capture.environment import AnalysisEnvironment, RealRun, current
    from ampgraph.pipeline.request import AnalysisRequest
    from ampgraph.ranges import value_ranges
    from ampgraph.ranges.spec_run import ranges_of_spec
    from ampgraph.settings import Setting

    request = AnalysisRequest("llama-tiny", (Setting.parse("amp-fp32", amp_dtype="fp16"),),
                              seq_len=4, seed=3, force=True, weights_dir="w", stream=False)
    assert request.environment().real_run == RealRun(3, True, Path("w"), False)
    assert current().real_run == RealRun()  # nothing left behind by building it

    def ranges(**given: object) -> tuple[int, list[object]]:
        result = value_ranges("llama-tiny", request.settings, seq_len=4, **given)
        return result.seed, [(n.name, n.outputs) for n in result.nodes]

    items: list[tuple[str, object]] = []
    ranges_of_spec(replace(request, force=False, weights_dir=None, stream=None), items.append)
    spec_run = items[-1][1]
    seeded = ranges(seed=3)
    assert (spec_run.seed, [(n.name, n.outputs) for n in spec_run.nodes]) == seeded
    assert ranges()[1] != seeded[1]  # the seed changes the values: the comparison can fail
    with analysis_environment(AnalysisEnvironment(real_run=RealRun(seed=3))):
        assert ranges() == seeded and ranges(seed=0)[0] == 0


def _module_state() -> dict[tuple[str, str], object]:
    """Every global of every ampgraph module: its identity, and a container's contents (their
    identities), so that rebinding a global or filling a module-level list, dict or set shows."""
    state: dict[tuple[str, str], object] = {}
    for name, module in list(sys.modules.items()):
        if name != "ampgraph" and not name.startswith("ampgraph."):
            continue
        for attr, value in list(vars(module).items()):
            if attr.startswith("__"):
                continue
            inside: object = None
            if isinstance(value, dict):
                inside = frozenset((id(k), id(v)) for k, v in list(value.items()))
            elif isinstance(value, (list, set)):
                inside = frozenset(map(id, list(value)))
            state[(name, attr)] = (id(value), inside)
    return state


def test_no_module_state_changes_with_an_analysis() -> None:
    """Forward, train, a what-if with moved tables, another release's tables, ranges and verify
    leave every module global of ampgraph as they found it (after a first round, which imports
    what they use and fills the caches of the process's facts)."""
    from ampgraph.capture.environment import AnalysisEnvironment
    from ampgraph.model.build import ModelInputs
    from ampgraph.pipeline.stages import analyze
    from ampgraph.ranges import value_ranges
    from ampgraph.review.whatif import preview_moves
    from ampgraph.verify import verify

    def analyses(moves: str) -> None:
        # The pad is a composite op with no policy inside, which the annotation remembers.
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ConstantPad1d(1, 0.0),
                                  torch.nn.LayerNorm(10), torch.nn.Linear(10, 4))  # fmt: skip
        model = ModelInputs("net", net, (torch.randn(2, 8),))
        analyze(model, "autocast=on,device=cpu")
        analyze(model, "autocast=on,device=cpu", pass_="train")
        preview_moves(model, "autocast=on,device=cpu", [moves], check=False)
        with analysis_environment(AnalysisEnvironment(tables="2.11")):
            analyze(model, "amp-fp32")
        value_ranges(model, ["amp-fp32"], device_type="cpu", amp_dtype="fp16")
        verify(model, "autocast=on,device=cpu")

    analyses("linear=fp32")
    before = _module_state()
    analyses("layer_norm=lower_precision_fp")
    after = _module_state()
    changed = sorted(key for key in before if key in after and before[key] != after[key])
    assert changed == []


#: A model with torchvision's ``roi_align``, for the scripts below (``#ROI_MODEL#`` in them).
_ROI_MODEL = """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1)
    def forward(self, x, boxes):
        return torchvision.ops.roi_align(self.conv(x), boxes, (2, 2))

model = ModelInputs("roi", Net(), (torch.randn(1, 2, 8, 8), torch.tensor([[0., 0., 0., 4., 4.]])))
"""


#: A what-if that moves a kernel another library registered from Python: torchvision 0.29's
#: ``roi_align`` autocast kernel (``_autograd_registrations.py``), and a ``register_autocast``
#: one. Each observation calls the op on fake tensors under CPU autocast, which runs the
#: dispatcher's map of Python kernels, and notes the output's dtype and whether torchvision's
#: function ran; an op whose kernel is a callable object (which cannot be read back) is refused.
_OTHER_LIBRARIES_KERNELS = r"""
import json, sys
import torch, torchvision
import torchvision._autograd_registrations as owner
from torch._subclasses.fake_tensor import FakeTensorMode
from ampgraph.errors import AmpgraphError
from ampgraph.model.build import ModelInputs
from ampgraph.review.whatif import moved_kernels, parse_moves, preview_moves

def observe(op, *shapes):
    entered = set()
    def profile(frame, event, arg):
        if event == "call":
            entered.add(frame.f_code)
    with FakeTensorMode(), torch.autocast("cpu"):
        args = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
        if op is torch.ops.torchvision.roi_align:
            args = [args[0], torch.zeros(1, 5), 1.0, 2, 2, -1, False]
        sys.setprofile(profile)
        try:
            out = op(*args)
        except Exception as error:
            return [str(error).splitlines()[0][:100], None]
        finally:
            sys.setprofile(None)
    return [str(out.dtype), owner._autocast_roi_align.__code__ in entered]

def move(text):
    return moved_kernels(parse_moves([text], "cpu"), "cpu")

@torch.library.custom_op("envtest::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2
scale.register_fake(lambda x: torch.empty_like(x))
torch.library.register_autocast("envtest::scale", "cpu", torch.float32)
lib = torch.library.Library("envtest", "FRAGMENT")
lib.define("odd(Tensor x) -> Tensor")
class Kernel:
    def __call__(self, x):
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return torch.ops.envtest.odd(x.double())
lib.impl("odd", torch.empty_like, "Meta")
lib.impl("odd", Kernel(), "AutocastCPU")

#ROI_MODEL#
roi, seen = torch.ops.torchvision.roi_align, {}
seen["roi_align"] = [observe(roi, (1, 2, 8, 8))]
with move("torchvision::roi_align=fp32"):
    seen["roi_align"].append(observe(roi, (1, 2, 8, 8)))
seen["roi_align"].append(observe(roi, (1, 2, 8, 8)))
reports = preview_moves(model, "autocast=on,device=cpu", ["torchvision::roi_align=fp32"])
seen["previewed"] = [[n.out_dtype for n in r.nodes if n.op == "torchvision.roi_align.default"]
                     for r in reports]
seen["disagreements"] = reports[1].check["disagreements"]
seen["roi_align"].append(observe(roi, (1, 2, 8, 8)))
seen["scale"] = [observe(torch.ops.envtest.scale, 3)[0]]
with move("envtest::scale=lower_precision_fp"):
    seen["scale"].append(observe(torch.ops.envtest.scale, 3)[0])
seen["scale"].append(observe(torch.ops.envtest.scale, 3)[0])
seen["odd"] = [observe(torch.ops.envtest.odd, 3)[0]]
try:
    with move("envtest::odd=lower_precision_fp"):
        pass
except AmpgraphError as error:
    seen["refused"] = str(error)
seen["odd"].append(observe(torch.ops.envtest.odd, 3)[0])
print(json.dumps(seen))
""".replace("#ROI_MODEL#", _ROI_MODEL)


def test_a_what_if_on_another_librarys_python_kernel_leaves_that_kernel_running_after() -> None:
    """Moving torchvision's ``roi_align`` to fp32 (``moved_kernels`` and a whole
    ``preview_moves``), then leaving: a fake tensor under autocast runs torchvision's own
    function again and gets its dtype (the input's), where it ran the moved kernel (fp32) for the
    rest of the process before (the map of Python kernels kept naming it, and torch gives no way
    to read back which function torchvision registered). A ``register_autocast`` kernel, which
    takes the key set first, comes back too; a kernel that cannot be read back is refused before
    anything is registered, in one line."""
    pytest.importorskip("torchvision._autograd_registrations")  # 0.29: its kernels in Python
    seen = json.loads(_run(_OTHER_LIBRARIES_KERNELS).splitlines()[-1])
    theirs, moved = ["torch.bfloat16", True], ["torch.float32", False]
    assert seen["roi_align"] == [theirs, moved, theirs, theirs]
    assert seen["previewed"] == [["bfloat16"], ["float32"]] and seen["disagreements"] == 0
    assert seen["scale"] == ["torch.float32", "torch.bfloat16", "torch.float32"]
    assert seen["odd"] == ["torch.float64", "torch.float64"]
    assert seen["refused"].startswith("envtest.odd.default has a Python kernel at AutocastCPU")
    assert "\n" not in seen["refused"]


#: The same what-if in ampgraph's own use: a CUDA analysis (fake CUDA tensors, the driverless
#: environment) of a model with ``roi_align``, before and after a preview that moves it.
_CUDA_ANALYSIS_AFTER_A_MOVE = r"""
import json
import torch, torchvision
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze
from ampgraph.review.whatif import preview_moves
from ampgraph.settings import Setting

#ROI_MODEL#
setting = Setting.parse("amp-half", device_type="cuda")
def seen(report):
    [node] = [n for n in report.nodes if n.op == "torchvision.roi_align.default"]
    return [node.out_dtype, node.check, report.check["disagreements"]]
before = seen(analyze(model, setting))
moved = seen(preview_moves(model, setting, ["torchvision::roi_align=fp32"])[1])
print(json.dumps([before, moved, seen(analyze(model, setting))]))
""".replace("#ROI_MODEL#", _ROI_MODEL)


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="a CPU-only build of torch")
def test_a_cuda_analysis_after_a_what_if_checks_against_torchvisions_kernel() -> None:
    """After a preview moved ``roi_align`` to fp32, the next CUDA analysis's dispatcher check
    ran the moved kernel on its fake tensors and disagreed with its own prediction (fp32 where
    torchvision's wrapper gives the input's 16-bit dtype); now it is the analysis before."""
    pytest.importorskip("torchvision")
    before, moved, after = json.loads(_run(_CUDA_ANALYSIS_AFTER_A_MOVE).splitlines()[-1])
    assert before[0] == "bfloat16" and before[2] == 0
    assert moved[0] == "float32" and moved[1]["dispatcher"]["outputs"] == ["float32"]
    assert after == before
