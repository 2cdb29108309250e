"""Issue 34: the supported range said in one line, and each version difference of
``ampgraph.compat`` working on the installed torch (the floor job runs this file on the floor
release too).

The lines a user sees are checked by running the command and the import in a child process whose
package metadata says another release: a ``torch-X.dist-info`` placed first on ``PYTHONPATH`` is
what ``importlib.metadata`` reads, and nothing here imports torch before the check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.fx.experimental import symbolic_shapes

from ampgraph import compat

AMPGRAPH = Path(sys.executable).with_name("ampgraph")


def _with_torch_metadata(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment in which ``importlib.metadata.version("torch")`` is ``version``."""
    info = tmp_path / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def test_versions_are_read_as_release_numbers() -> None:
    assert compat.version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert compat.version_tuple("2.10.1") > compat.version_tuple("2.10")
    assert compat.version_tuple("2.10.0") > compat.version_tuple("2.9.1")  # not string order
    assert compat.version_tuple("not a version") == ()


@pytest.mark.parametrize(
    "version,expected",
    [
        ("2.6.0", "refuse"),
        ("2.8.0", "refuse"),
        ("2.9.1", None),
        ("2.10.0", None),
        (compat.TORCH_RANGE.tested, None),
        (compat.TORCH_RANGE.tested + "+cu130", None),
        ("2.15.0", "warn"),
        (None, "refuse"),
    ],
)
def test_the_torch_range(version: str | None, expected: str | None) -> None:
    line = compat.support_message("torch", version)
    if expected is None:
        assert line is None
    else:
        assert line is not None and "\n" not in line
        assert "2.9" in line and "2.14.1" in line
        assert ("pip install 'torch>=2.9,<=2.14.1'" in line) == (expected == "refuse")


def test_the_installed_releases_are_in_range() -> None:
    """This suite runs on supported releases only (the main venv, the floor venv)."""
    assert compat.unsupported() == []
    assert compat.version_tuple(compat.installed_version("torch") or "") == compat.version_tuple(
        torch.__version__
    )


def test_the_command_refuses_a_torch_below_the_floor_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(AMPGRAPH), "models"], env=_with_torch_metadata(tmp_path, "2.6.0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr == (
        "Error: ampgraph supports torch 2.9 to 2.14.1; this is torch 2.6.0: "
        "pip install 'torch>=2.9,<=2.14.1'\n"
    )


def test_python_m_ampgraph_says_it_once(tmp_path: Path) -> None:
    """``python -m ampgraph`` is the command too: its line, not the import's warning as well."""
    out = subprocess.run(
        [sys.executable, "-m", "ampgraph", "models"], env=_with_torch_metadata(tmp_path, "2.6.0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "Error: ampgraph supports torch 2.9 to 2.14.1; this is torch 2.6.0: "
        "pip install 'torch>=2.9,<=2.14.1'"
    ]


def test_the_command_warns_of_a_newer_torch_and_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(AMPGRAPH), "models"], env=_with_torch_metadata(tmp_path, "2.15.0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "Warning: ampgraph was tried with torch 2.9 to 2.14.1; this is torch 2.15.0, newer: "
        "its results are unproven"
    ]
    assert "opt-125m" in out.stdout


def test_import_says_it_in_one_warning_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import ampgraph"], env=_with_torch_metadata(tmp_path, "2.6.0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0
    [line] = out.stderr.splitlines()
    assert line.endswith(
        "UnsupportedVersionWarning: ampgraph supports torch 2.9 to 2.14.1; this is torch 2.6.0: "
        "pip install 'torch>=2.9,<=2.14.1'"
    )


def test_the_hf_fx_overlay_is_not_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"torch": "2.14.1", "transformers": "4.45.2"}
    monkeypatch.setattr(compat, "installed_version", versions.get)
    assert compat.unsupported() == []
    versions["transformers"] = "4.57.1"
    [(refuse, line)] = compat.unsupported()
    assert not refuse and "transformers>=5.17,<6" in line


def _unbacked() -> torch.SymInt:
    return symbolic_shapes.ShapeEnv().create_unbacked_symint()


@pytest.mark.parametrize("torch_has_it", [True, False])
def test_guard_or_true(monkeypatch: pytest.MonkeyPatch, torch_has_it: bool) -> None:
    """Where torch has ``guard_or_true`` it is used; where it does not (torch 2.6, 2.7), the
    fallback answers alike: a known size is evaluated, a data-dependent one is True."""
    if not torch_has_it:
        monkeypatch.delattr(symbolic_shapes, "guard_or_true", raising=False)
    u = _unbacked()
    assert compat.guard_or_true(u > 5) is True
    assert compat.guard_or_true(u == 3) is True
    assert (compat.guard_or_true(2 > 1), compat.guard_or_true(1 > 2)) == (True, False)


@pytest.mark.parametrize("keep", [True, False])
def test_stack_traces_are_switched_where_torch_has_the_switch(keep: bool) -> None:
    import torch.fx.config as fx_config

    before = getattr(fx_config, "do_not_emit_stack_traces", None)
    with compat.fx_stack_traces(keep):
        inside = getattr(fx_config, "do_not_emit_stack_traces", None)
    assert getattr(fx_config, "do_not_emit_stack_traces", None) == before
    assert inside == (None if before is None else not keep)


def test_a_kernel_torch_registered_from_python_is_replaced() -> None:
    """The case torch 2.11 refused: a Meta kernel a Python ``Library`` already registered."""
    lib = torch.library.Library("ampgraph_compat_test", "DEF")  # noqa: TOR901
    lib.define("f(Tensor x) -> Tensor")
    lib.impl("f", lambda x: x.new_empty(x.shape), "Meta")
    other = torch.library.Library("ampgraph_compat_test", "IMPL")  # noqa: TOR901
    compat.replace_kernel(
        other, "f", lambda x: x.new_empty(x.shape, dtype=torch.float16), "Meta"
    )
    out = torch.ops.ampgraph_compat_test.f(torch.empty(3, device="meta"))
    assert out.dtype == torch.float16


def test_make_fx_below_autograd_keeps_an_op_that_has_its_own_kernel() -> None:
    """``silu_backward`` has a CPU and a Meta kernel beside its composite: autograd runs the
    kernel, and so the trace records it (2.10 on by itself; 2.9 decomposed it)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.silu_backward(g, x)

    with compat.make_fx_keeps_fused_kernels():
        gm = make_fx(step)(torch.ones(3, device="meta"), torch.ones(3, device="meta"))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == ["aten.silu_backward.default"]
