"""FP8 training recipes: which GEMMs torchao's ``convert_to_float8_training`` runs in FP8.

Past autocast, teams run their Linears' matrix multiplications in FP8 (torchao's float8
training, as torchtitan does) while the rest of the model stays in bf16 under autocast. The
pieces, one job each:

=========== ==================================================================================
recipes     ``torchao:rowwise`` and friends: parse, the module filter, which Linears convert and
            why the others stay in bf16, and each GEMM operand's FP8 format read from torchao's
            own ``Float8LinearConfig``
graph       the converted model's forward (and backward) traced with ``make_fx`` on fake tensors
            under bf16 autocast: torchao's own casts, amax, scales and ``_scaled_mm``, annotated
proof       the same model run for real on the CPU under autocast: every GEMM's operand dtypes
mx          torchao's MX inference workflow for dense Linears (its MXTensor weights in the trace)
moe         torchao's MXFP8 training (``MXFP8TrainingOpConfig``): a MoE's experts, or Linears
=========== ==================================================================================

Whether the values survive FP8 is :mod:`ampgraph.ranges.fp8`'s job. torchao is the optional
extra ``fp8`` (``pip install 'ampgraph[fp8]'``).
"""

from __future__ import annotations

from ampgraph.fp8.recipes import Fp8Recipe, LinearPlan, parse_fp8_recipe, plan_model

__all__ = ["Fp8Recipe", "LinearPlan", "parse_fp8_recipe", "plan_model"]
