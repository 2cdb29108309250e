"""Fake CUDA tensors without a GPU driver, on every supported torch (compat.fake_cuda_needs_help).

torch 2.10 on gives fake CUDA tensors a driverless device guard and an SDPA backend choice that
falls back to math by itself; on 2.9 ``capture/driverless_29.py`` does the same. Each check runs
in a fresh process: without that help, 2.9 ends the process (SIGABRT) at the first op on a
parameter that requires grad, which no ``pytest.raises`` could catch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ampgraph import compat
from ampgraph.capture import driverless_29

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not torch.version.cuda,
    reason="needs a CUDA build of torch on a machine without a CUDA device",
)

_PRELUDE = """
import torch
from ampgraph.capture.environment import analysis_environment
from ampgraph.torchutil import fake_mode
_ENVIRONMENT = analysis_environment()  # kept: a collected one would exit
_ENVIRONMENT.__enter__()  # what the release needs, as every analysis has it
"""


def _run(body: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_grad_indexing_and_device_resolution_need_no_driver() -> None:
    """Autograd's InputMetadata asks the guard for a stream; indexing and ``.to("cuda")`` ask it
    for the device. The dtypes are the real autocast kernels' (bf16 linear, fp32 sum)."""
    out = _run("""
with fake_mode():
    w = torch.empty(8, 4, device="cuda", requires_grad=True)
    x = torch.nn.functional.embedding(torch.zeros(2, dtype=torch.long, device="cuda"), w)
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    y = torch.nn.functional.linear(x, torch.empty(3, 4, device="cuda", requires_grad=True))
    torch.set_autocast_enabled("cuda", False)
    print(x.grad_fn is not None, y.dtype, y.sum().dtype, x[None, :, None].shape,
          torch.empty(2).to("cuda").device, torch.zeros(3, device="cuda")[1:].device)
""")
    assert out.split() == [
        "True", "torch.bfloat16", "torch.bfloat16", "torch.Size([1,", "2,", "1,", "4])",
        "cuda:0", "cuda:0",
    ]  # fmt: skip


def test_sdpa_takes_the_math_backend_as_torch_does_without_a_device() -> None:
    """The graph of SDPA on fake CUDA tensors is the math backend's, node for node: what 2.10 on
    choose when the device cannot be asked, and what the stand-in gives on 2.9."""
    out = _run("""
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel
def graph(kw, dtype):
    q = torch.empty(1, 2, 4, 8, device="cuda", dtype=dtype)
    gm = make_fx(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, **kw))(q)
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
same = []
with fake_mode():
    for kw in ({}, {"is_causal": True}):
        for dtype in (torch.float16, torch.float32):
            chosen = graph(kw, dtype)
            with sdpa_kernel([SDPBackend.MATH]):
                same.append(chosen == graph(kw, dtype) and "aten.bmm.default" in chosen)
print(all(same), len(same))
""")
    assert out.split() == ["True", "4"]


def test_the_help_is_for_torch_2_9_only_and_only_inside_an_analysis() -> None:
    assert compat.fake_cuda_needs_help() == (compat.torch_release() < (2, 10))
    assert driverless_29.problem() is None  # every slot it uses holds the function it says
    chooser = torch._C._select_conv_backend
    undo = driverless_29.install()
    # The SDPA stand-in exists exactly where the help was given, and only until the undo.
    assert bool(driverless_29.STAND_INS) == compat.fake_cuda_needs_help()
    assert (torch._C._select_conv_backend is chooser) != compat.fake_cuda_needs_help()
    undo()
    assert driverless_29.STAND_INS == {} and torch._C._select_conv_backend is chooser


def test_a_bf16_convolution_needs_no_driver() -> None:
    """Fake tensors ask ``_select_conv_backend`` for a convolution's memory format; its cuDNN
    checks for bf16 read the device's properties. Without a device the choice leaves cuDNN
    (2.10 on by itself), and the real autocast kernel's dtype comes out."""
    out = _run("""
with fake_mode():
    x = torch.empty(1, 3, 4, 4, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(4, 3, 1, 1, device="cuda", dtype=torch.bfloat16)
    print(torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, None))
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    print(torch.nn.functional.conv2d(x.float(), w.float(), torch.empty(4, device="cuda")).dtype)
""")
    assert out.split() == ["_ConvBackend.Slow2d", "torch.bfloat16"]
