"""CPU predictions follow the convolution backend this CPU takes (issue 34).

oneDNN takes bf16 convolutions on CPUs with AVX-512 and fp16 ones on CPUs with AVX512-FP16 (an
Intel Xeon of the Sapphire Rapids class), and checks dtypes otherwise than the slow kernels. The
oracle is always the real kernel of the CPU the suite runs on; a child process with oneDNN held
to AVX2 (``ONEDNN_MAX_CPU_ISA``) proves the slow-kernel branch for bf16 on real kernels here too,
and :func:`~ampgraph.annotate.cpu_backend.assumed` shows the prediction switching machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.annotate import cpu_backend
from ampgraph.annotate.cpu_backend import OneDnn, assumed, onednn
from ampgraph.report.records import Report
from ampgraph.settings import Setting

from .conftest import ROOT
from .test_fake_kernels import _agree

aten = torch.ops.aten
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _conv(x_dtype: torch.dtype, w_dtype: torch.dtype, b_dtype: torch.dtype) -> tuple[Any, ...]:
    """A small 2-D convolution's arguments (a shape every backend takes)."""
    return (
        torch.randn(2, 3, 8, 8, dtype=x_dtype), torch.randn(4, 3, 3, 3, dtype=w_dtype),
        torch.randn(4, dtype=b_dtype), [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
    )  # fmt: skip


def _onednn_bias_error(name: str) -> str:
    return (
        f"error: Input type (torch.{name}Tensor) and bias type (torch.FloatTensor) should be the "
        "same or input should be a MKLDNN tensor and bias is a dense tensor"
    )


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_the_probe_is_torchs_own_device_check() -> None:
    built = torch.backends.mkldnn.is_available()
    assert onednn() == OneDnn(
        enabled=built and torch.backends.mkldnn.enabled,
        bf16=built and torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        fp16=built and torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    )
    with torch.backends.mkldnn.flags(enabled=False):
        assert not onednn().enabled and not cpu_backend.takes_low_precision(BF16)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_the_real_kernel_takes_the_backend_the_probe_names(dtype: torch.dtype) -> None:
    """A 16-bit input and weight with an fp32 bias: oneDNN refuses it, the slow 2-D kernel runs
    it. Which of the two this CPU's real kernel does is what the probe says, and the prediction
    is the real outcome."""
    real, predicted = _agree(_conv(dtype, dtype, F32), aten.convolution)
    assert real.startswith("error") == cpu_backend.takes_low_precision(dtype), (real, onednn())
    assert predicted == real


def test_each_machine_has_its_own_prediction() -> None:
    """The same calls predicted for a CPU with AVX512-FP16 and for one without (an AMD EPYC of
    Zen 4): oneDNN's message there (as a Sapphire Rapids Xeon raised it, issue 34), the slow
    kernels' outcome here. The machine the suite runs on is one of them or another; where it is
    one, its prediction is its real kernel's outcome."""
    calls = {"bias": _conv(F16, F16, F32), "weight": _conv(F16, F32, F16)}
    machines = {
        "avx512_fp16": OneDnn(enabled=True, bf16=True, fp16=True),
        "zen4": OneDnn(enabled=True, bf16=True, fp16=False),
    }
    predicted = {}
    for machine, support in machines.items():
        with assumed(support):
            predicted[machine] = {k: _agree(c, aten.convolution)[1] for k, c in calls.items()}
    assert predicted["avx512_fp16"]["bias"] == _onednn_bias_error("Half")
    assert predicted["avx512_fp16"]["weight"].startswith(
        "error: Input type (torch.HalfTensor) and weight type (torch.FloatTensor) should be"
    )
    assert predicted["zen4"] == {
        "bias": "ok torch.float16", "weight": "error: expected scalar type Half but found Float"
    }  # fmt: skip
    here = next((m for m, s in machines.items() if s == onednn()), None)
    if here is not None:
        assert predicted[here] == {k: _agree(c, aten.convolution)[0] for k, c in calls.items()}


def test_a_wrong_machine_is_caught_by_the_real_kernel() -> None:
    """Predicting for the other kind of bf16 machine than this one disagrees with the real
    kernel here: the comparison can fail."""
    here = onednn()
    other = here._replace(bf16=not here.bf16)
    with assumed(other):
        real, predicted = _agree(_conv(BF16, BF16, F32), aten.convolution)
    assert predicted != real


def test_a_cpu_without_avx512_takes_the_slow_kernels_for_bf16() -> None:
    """In a child process whose oneDNN is held to AVX2, torch's own check says no bf16, the
    real bf16 convolutions take the slow kernels, and the predictions follow them."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    probe = "import torch; print(torch.ops.mkldnn._is_mkldnn_bf16_supported())"
    said = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if said.stdout.strip() != "False":
        pytest.skip("this torch's oneDNN does not honour ONEDNN_MAX_CPU_ISA")
    tests = [
        "tests/test_cpu_backend.py::test_the_real_kernel_takes_the_backend_the_probe_names",
        "tests/test_cpu_backend.py::test_each_machine_has_its_own_prediction",
        "tests/test_fake_kernels.py::test_cpu_convolution_bias_and_weight_follow_the_backend"
        "[bfloat16-bfloat16-float32-2]",
        "tests/test_fake_kernels.py::test_cpu_convolution_bias_and_weight_follow_the_backend"
        "[float32-bfloat16-float32-2]",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    assert "5 passed" in run.stdout, run.stdout[-1000:]


def test_a_cpu_report_says_which_backend_its_16bit_convolutions_assumed() -> None:
    """``capture.cpu_kernels`` where a 16-bit convolution is predicted for this CPU, and only
    there; a saved report reads it back."""
    conv, x = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), torch.randn(1, 3, 8, 8)
    half = analyze(conv, Setting.parse("amp-half", device_type="cpu"), args=(x,))
    assert half.capture["cpu_kernels"] == cpu_backend.describe()
    assert Report.from_json(half.to_json()).capture["cpu_kernels"] == cpu_backend.describe()
    fp32 = analyze(conv, Setting.parse("fp32", device_type="cpu"), args=(x,))
    assert "cpu_kernels" not in fp32.capture
