"""llama-tiny with ``torch.nn.RMSNorm``: the policy drift of torch 2.12, seen through ampgraph diff.

transformers' ``LlamaRMSNorm`` computes its norm by hand in fp32 (``pow``, ``mean``, ``rsqrt``),
so Hugging Face's Llama never calls ``aten.rms_norm`` and autocast's lists cannot change it.
A Llama built with PyTorch's own ``nn.RMSNorm`` (as torchtitan builds it) calls
``aten.rms_norm``, which torch 2.12 put on CUDA autocast's fp32 list. This factory is llama-tiny
with its norms swapped for ``nn.RMSNorm`` of the same size and eps, for
``ampgraph diff --module examples/llama_torch_rmsnorm.py:build --tables 2.11 --tables 2.14``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ampgraph.model.build import load_model


def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """llama-tiny (on meta, as ampgraph builds it) with ``nn.RMSNorm`` norms, and its inputs."""
    model = load_model("llama-tiny")
    for name, module in list(model.module.named_modules()):
        if type(module).__name__ == "LlamaRMSNorm":
            parent, _, attr = name.rpartition(".")
            norm = nn.RMSNorm(module.weight.shape, eps=module.variance_epsilon, device="meta")
            setattr(model.module.get_submodule(parent), attr, norm)
    return model.module, model.args, model.kwargs
