"""The proof on the real thing: compile a captured graph with Inductor's C++ backend for real, read
the code it generated, and hold a plan (:mod:`ampgraph.compiled.inductor`) against it.

Reading the code is independent of the plan's reading of Inductor's objects: it looks only at
the generated module's text, where the wrapper allocates each buffer with its dtype
(``empty_strided_cpu(..., torch.bfloat16)``), where extern kernels write (``out=buf3``), and where
each C++ kernel converts fp32 to 16 bits (``at::vec::convert<at::BFloat16,...>``,
``c10::convert<at::BFloat16>``, ``static_cast<at::BFloat16>``) and which 16-bit pointers it writes.

>>> read_code("buf1 = empty_strided_cpu((2, ), (1, ), torch.bfloat16)").buffers16
{'buf1'}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ampgraph.capture.trace import Capture
from ampgraph.compiled.flow import LOW_PRECISION, CompiledFlow
from ampgraph.compiled.inductor import inductor_setting

_ALLOC = re.compile(r"(buf\d+) = empty_strided_cpu\(.*torch\.(bfloat16|float16)\)")
#: An op's returned tensor, or one element of what it returned (``buf8 = buf7[0]``).
_RETURNED = re.compile(
    r"^\s*(buf\d+) = (?:(?!empty_strided|reinterpret_tensor|buf\d)[\w.]+\(|buf\d+\[)", re.M
)
#: A buffer that takes over another's memory, as it is or through a view of it
#: (``buf27 = reinterpret_tensor(buf5, (8, 768), (768, 1), 0); del buf5  # reuse``).
_REUSE = re.compile(r"(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)\b[^;\n]*; del \2  # reuse")
_KERNEL = re.compile(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(\[(.*?)\], r'''(.*?)'''\)",
                     re.S)  # fmt: skip
_TO_16 = re.compile(
    r"convert<at::(?:BFloat16|Half)\b|c10::convert<(?:at::)?(?:BFloat16|Half|bfloat16|half)>"
    r"|static_cast<(?:at::|c10::)?(?:BFloat16|Half)>|cvt_fp32_to_(?:bf|fp)16"
)


@dataclass
class GeneratedKernel:
    """One C++ kernel Inductor generated: the 16-bit buffers it writes (over all its calls), its
    fp32->16-bit casts, and how many of those a computation reads (not only a store)."""

    name: str
    writes16: list[str]
    conversions: int
    read_inside: int = 0

    @property
    def rounds_inside(self) -> bool:
        """Whether it rounds a value to 16 bits and computes on the rounded value."""
        return self.read_inside > 0


def _read_inside(body: str) -> int:
    """How many 16-bit conversions in a kernel's body are computed on and never stored: roundings
    in registers (a stored one, read again in the kernel, is rounded as eager rounds it)."""
    count = 0
    lines = body.splitlines()
    for m in re.finditer(r"auto (tmp\d+) = [^;]*?(?:" + _TO_16.pattern + ")", body):
        var = m.group(1)
        store = re.compile(rf"\b{var}\.store\(|(?:in_)?out_ptr\d+\[[^=]*\] = {var};")
        uses = [ln for ln in lines if re.search(rf"\b{var}\b", ln) and f"auto {var} =" not in ln]
        if uses and not any(store.search(ln) for ln in uses):
            count += 1
    return count


@dataclass
class GeneratedCode:
    """What the generated module says about 16-bit values."""

    buffers16: set[str] = field(default_factory=set)
    kernels: list[GeneratedKernel] = field(default_factory=list)
    #: Buffers an op call returns (``buf4 = torch.ops.aten.foo(...)``): the text does not say
    #: their dtype unless a C++ kernel takes them, so they are left out of the comparison.
    untyped: set[str] = field(default_factory=set)


def read_code(code: str) -> GeneratedCode:
    r"""Read a generated Inductor module (the wrapper and its C++ kernels).

    >>> sorted(read_code("buf5 = empty_strided_cpu((8, ), (1, ), torch.bfloat16)\n"
    ...                  "buf27 = reinterpret_tensor(buf5, (8, ), (1, ), 0); del buf5  # reuse"
    ...                  ).buffers16)
    ['buf27', 'buf5']
    """
    out = GeneratedCode({m.group(1) for m in _ALLOC.finditer(code)})
    out.untyped = {m.group(1) for m in _RETURNED.finditer(code)}
    for m in _REUSE.finditer(code):  # in order: a reuse of a reuse follows its source
        for known in (out.buffers16, out.untyped):
            if m.group(2) in known:
                known.add(m.group(1))
    for m in _KERNEL.finditer(code):
        name, types = m.group(1), [t.strip(" '") for t in m.group(2).split(",")]
        writes: list[str] = []
        for call in re.finditer(rf"^\s*{name}\((.*)\)\s*$", code, re.M):  # each call site
            args = [a.strip() for a in call.group(1).split(",")]
            writes += [a for a, t in zip(args, types) if t in ("at::BFloat16*", "at::Half*")]
            # a buffer a kernel reads or writes as 16-bit is 16-bit, however it was allocated
            out.buffers16 |= {a for a, t in zip(args, types)
                              if t.removeprefix("const ") in ("at::BFloat16*", "at::Half*")
                              and a.startswith("buf")}  # fmt: skip
        body = m.group(3)
        out.kernels.append(
            GeneratedKernel(name, writes, len(_TO_16.findall(body)), _read_inside(body))
        )
    out.untyped -= out.buffers16
    return out


def real_inputs(
    capture: Capture, module: torch.nn.Module, args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> list[Any]:  # fmt: skip
    """The graph's placeholders filled with the module's real tensors and the real ``args``
    (then ``kwargs`` by name, for the inputs export names after them)."""
    named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    dtype = getattr(torch, capture.setting.param_dtype)
    given = iter(args)
    kwargs = kwargs or {}
    out = []
    for n in capture.graph_module.graph.nodes:
        if n.op != "placeholder":
            continue
        kind, target = capture.input_kinds[n.name]
        if kind in ("parameter", "buffer"):
            t = named[target].detach()
            out.append(t.to(dtype) if t.is_floating_point() else t)
        elif target in kwargs:
            out.append(kwargs[target])
        else:
            out.append(next(given))
    return out


def compile_for_real(
    capture: Capture, inputs: list[Any], *, emulate_precision_casts: bool = False
) -> tuple[Any, str]:
    """Compile the captured graph with Inductor (C++ compiler included) and run it once: its
    outputs and the source of the module Inductor generated."""
    from torch._inductor import compile_fx
    from torch._inductor.utils import run_and_get_code

    with inductor_setting(capture, emulate_precision_casts):
        out, codes = run_and_get_code(
            lambda: compile_fx.compile_fx(capture.graph_module, inputs)(*inputs)
        )
    return out, "\n".join(codes)


def disagreements(flow: CompiledFlow, code: GeneratedCode) -> list[str]:
    """Where the plan and the generated code differ, one line each (empty: they agree)."""
    found = []
    planned = {b for k in flow.kernels for b, d in k.stores if d in LOW_PRECISION}
    for b in sorted((planned ^ code.buffers16) - code.untyped):
        side = "plan" if b in planned else "generated code"
        found.append(f"16-bit buffer {b} only in the {side}")
    rounding = {n.kernel for n in flow.nodes if n.fate == "emulated"}
    for k in code.kernels:
        mine = [p for p in flow.kernels if {b for b, _ in p.stores} & set(k.writes16)]
        expects = any(p.name in rounding for p in mine)
        if mine and expects != k.rounds_inside:
            found.append(f"{k.name}: the plan says {'a' if expects else 'no'} rounding inside, "
                         f"the code computes on {k.read_inside} of its {k.conversions} casts "
                         "to 16 bits")  # fmt: skip
    return found
