"""The proof on the real thing: compile a captured graph with Inductor for real (its C++ backend on
the CPU, its Triton backend on a GPU), read the code it generated, and hold a plan
(:mod:`ampgraph.compiled.inductor`) against it.

Reading the code is independent of the plan's reading of Inductor's objects: it looks only at
the generated module's text, where the wrapper allocates each buffer with its dtype
(``empty_strided_cpu(..., torch.bfloat16)``), where extern kernels write (``out=buf3``), and where
each C++ kernel converts fp32 to 16 bits (``at::vec::convert<at::BFloat16,...>``,
``c10::convert<at::BFloat16>``, ``static_cast<at::BFloat16>``; in Triton ``.to(tl.bfloat16)``)
and which 16-bit pointers it writes (C++ parameter types, Triton's ``'signature'``).

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

_ALLOC = re.compile(r"(buf\d+) = empty_strided_(?:cpu|cuda)\(.*torch\.(bfloat16|float16)\)")
#: An op's returned tensor, or one element of what it returned (``buf8 = buf7[0]``).
_RETURNED = re.compile(
    r"^\s*(buf\d+) = (?:(?!empty_strided|reinterpret_tensor|buf\d)[\w.]+\(|buf\d+\[)", re.M
)
#: A buffer that is another's storage under a new name, so of its dtype: a reuse (``buf9 = buf3;
#: del buf3  # reuse``, or through ``reinterpret_tensor``, which Inductor allows only between
#: buffers of one dtype) or the slice of a concatenation's output that one piece is computed
#: straight into (``buf4 = reinterpret_tensor(buf6, ...)  # alias``).
_SAME_STORAGE = re.compile(
    r"^\s*(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)\b.*#\s*(?:reuse|alias)\s*$", re.M
)
_KERNEL = re.compile(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(\[(.*?)\], r'''(.*?)'''\)",
                     re.S)  # fmt: skip
_TRITON = re.compile(r"(triton_\w+) = async_compile\.triton\('\w+', '''(.*?)'''", re.S)
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
    #: Every buffer it writes, of any dtype (a C++ kernel may hold several planned kernels).
    writes: list[str] = field(default_factory=list)

    @property
    def rounds_inside(self) -> bool:
        """Whether it rounds a value to 16 bits and computes on the rounded value."""
        return self.read_inside > 0


def _already16(body: str) -> set[str]:
    """The kernel's variables that hold a value loaded from a 16-bit pointer (or a copy of one):
    converting one to 16 bits again, as emulation does to each 16-bit input, rounds nothing."""
    pointers = set(re.findall(r"at::(?:BFloat16|Half)\* (\w+)", body))
    held: set[str] = set()
    for var, source in re.findall(r"auto (tmp\d+) = (?:[\w:<>,]+::loadu\()?(\w+)", body):
        if source in pointers or source in held:
            held.add(var)
    return held


def _conversions(body: str) -> tuple[int, int]:
    """How many fp32-to-16-bit roundings a kernel's body performs, and how many of them are
    computed on and never stored: roundings in registers (a stored one, read again in the
    kernel, is rounded as eager rounds it)."""
    count = inside = 0
    lines = body.splitlines()
    already = _already16(body)
    for m in re.finditer(r"auto (tmp\d+) = [^;]*?(?:" + _TO_16.pattern + r")[^(;]*\((\w+)(\)?)", body):
        var = m.group(1)
        if m.group(3) and m.group(2) in already:  # exactly a 16-bit value: a no-op
            continue
        count += 1
        store = re.compile(rf"\b{var}\.store\(|(?:in_)?out_ptr\d+\[[^=]*\] = {var};")
        uses = [ln for ln in lines if re.search(rf"\b{var}\b", ln) and f"auto {var} =" not in ln]
        if uses and not any(store.search(ln) for ln in uses):
            inside += 1
    return count, inside


@dataclass
class GeneratedCode:
    """What the generated module says about 16-bit values."""

    buffers16: set[str] = field(default_factory=set)
    kernels: list[GeneratedKernel] = field(default_factory=list)
    #: Buffers an op call returns (``buf4 = torch.ops.aten.foo(...)``): the text does not say
    #: their dtype unless a C++ kernel takes them, so they are left out of the comparison.
    untyped: set[str] = field(default_factory=set)


def read_code(code: str) -> GeneratedCode:
    r"""Read a generated Inductor module (the wrapper and its C++ or Triton kernels).

    >>> sorted(read_code("buf5 = empty_strided_cpu((8, ), (1, ), torch.bfloat16)\n"
    ...                  "buf27 = reinterpret_tensor(buf5, (8, ), (1, ), 0); del buf5  # reuse"
    ...                  ).buffers16)
    ['buf27', 'buf5']
    """
    out = GeneratedCode({m.group(1) for m in _ALLOC.finditer(code)})
    out.untyped = {m.group(1) for m in _RETURNED.finditer(code)}
    for name, params, body, conversions in [*_cpp_kernels(code), *_triton_kernels(code)]:
        writes: list[str] = []
        written: list[str] = []
        call = re.compile(rf"^\s*{name}(?:\.run)?\((.*)\)\s*$", re.M)
        for m in call.finditer(code):  # each call site: its arguments, in the parameters' order
            args = [a.strip() for a in _split_args(m.group(1)) if "=" not in a]
            for arg, (is16, writes_it) in zip(args, params):
                if is16 and arg.startswith("buf"):
                    # a buffer a kernel reads or writes as 16-bit is 16-bit, however allocated
                    out.buffers16.add(arg)
                writes += [arg] if is16 and writes_it else []
                written += [arg] if writes_it else []
        out.kernels.append(GeneratedKernel(name, writes, *conversions(body), written))
    _share_dtypes(out, [(m.group(1), m.group(2)) for m in _SAME_STORAGE.finditer(code)])
    out.untyped -= out.buffers16
    return out


#: A kernel's name, its parameters as (16-bit, written), its body and how to count its roundings.
_Found = tuple[str, list[tuple[bool, bool]], str, Any]


def _cpp_kernels(code: str) -> list[_Found]:
    """The C++ backend's kernels: parameter types from ``cpp_pybinding``'s list."""
    found = []
    for m in _KERNEL.finditer(code):
        types = [t.strip(" '") for t in m.group(2).split(",")]
        params = [(t.removeprefix("const ") in ("at::BFloat16*", "at::Half*"),
                   t.endswith("*") and "const" not in t) for t in types]  # fmt: skip
        found.append((m.group(1), params, m.group(3), _conversions))
    return found


def _triton_kernels(code: str) -> list[_Found]:
    """The Triton backend's kernels: parameter types from ``triton_meta``'s signature
    (``'in_ptr0': '*bf16'``), written parameters by their names (``out_ptr``, ``in_out_ptr``)."""
    found = []
    for m in _TRITON.finditer(code):
        signature = re.search(r"'signature': \{(.*?)\}", m.group(2))
        pairs = re.findall(r"'(\w+)': '([^']*)'", signature.group(1) if signature else "")
        params = [(t in ("*bf16", "*fp16"), n.startswith(("out_ptr", "in_out_ptr")))
                  for n, t in pairs if t != "constexpr"]  # fmt: skip
        found.append((m.group(1), params, m.group(2), _triton_conversions))
    return found


def _split_args(text: str) -> list[str]:
    """A call's arguments, split at the commas outside brackets."""
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    return [*args, text[start:]]


def _triton_conversions(body: str) -> tuple[int, int]:
    """As :func:`_conversions`, for a Triton kernel: ``.to(tl.bfloat16)`` rounds, unless the value
    was loaded from a 16-bit pointer and not converted since (emulation's no-op on an input)."""
    pointers = set(re.findall(r"'(\w+)': '\*(?:bf16|fp16)'", body))
    held = {v for v, p, rest in re.findall(r"(tmp\d+) = tl\.load\((\w+)[^\n]*?\)(.*)$", body, re.M)
            if p in pointers and ".to(" not in rest}  # fmt: skip
    count = inside = 0
    for m in re.finditer(r"^\s*(tmp\d+) = (\w+)?(.*)\.to\(tl\.(?:bfloat16|float16)\)", body, re.M):
        var = m.group(1)
        if m.group(2) in held and not m.group(3):  # exactly a 16-bit input: a no-op
            continue
        count += 1
        uses = [ln for ln in body.splitlines() if re.search(rf"\b{var}\b", ln)
                and not re.match(rf"\s*{var} =", ln)]  # fmt: skip
        if uses and not any(re.search(rf"tl\.store\([^,]+,\s*{var}\b", ln) for ln in uses):
            inside += 1
    return count, inside


def _share_dtypes(code: GeneratedCode, same: list[tuple[str, str]]) -> None:
    """Give each name of one storage the dtype any of its names is known by (either way round:
    a cat's output may be typed by the kernel that writes one of its pieces), until none is new."""
    changed = True
    while changed:
        changed = False
        for a, b in same:
            for known in (code.buffers16, code.untyped):
                if (a in known) != (b in known):
                    known.update((a, b))
                    changed = True


def real_inputs(
    capture: Capture, module: torch.nn.Module, args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> list[Any]:  # fmt: skip
    """The graph's placeholders filled with the module's real tensors and the real ``args``
    (then ``kwargs`` by name, for the inputs export names after them)."""
    # every name of a shared (tied) weight: export may name it after any of its modules
    named = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))}  # fmt: skip
    dtype = getattr(torch, capture.setting.param_dtype)
    given = iter(args)
    kwargs = kwargs or {}
    out = []
    for n in capture.graph_module.graph.nodes:
        if n.op != "placeholder":
            continue
        kind, target = capture.input_kinds[n.name]
        if kind in ("parameter", "buffer"):
            t = named[target].detach().to(capture.setting.device_type)  # the setting's device
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
    # An emulated value is recomputed, and rounded, in every kernel it is inlined into: each
    # planned kernel that computes it (a C++ kernel is the code of one or more planned kernels,
    # shared by identical layers) must round inside, and no other.
    rounding = {n.name for n in flow.nodes if n.rounds_in_kernel}
    for k in code.kernels:
        mine = [p for p in flow.kernels if {b for b, _ in p.stores} & set(k.writes)]
        expects = any(rounding.intersection(p.nodes) for p in mine)
        if mine and expects != k.rounds_inside:
            found.append(f"{k.name}: the plan says {'a' if expects else 'no'} rounding inside, "
                         f"the code computes on {k.read_inside} of its {k.conversions} casts "
                         "to 16 bits")  # fmt: skip
    return found
