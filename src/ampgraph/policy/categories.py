"""The autocast categories ampgraph names: autocast_mode.h's CastPolicies and the rest.

Torch-free constants, read by the tables (:mod:`ampgraph.policy`), the dispatcher's kernel
queries (:mod:`ampgraph.policy.kernels`) and every legend.

>>> CATEGORY_LABEL[FP32_SET_OPT_DTYPE]
'fp32 (output dtype)'
"""

from __future__ import annotations

from typing import Final

LOWER_PRECISION_FP: Final = "lower_precision_fp"
FP32: Final = "fp32"
FP32_SET_OPT_DTYPE: Final = "fp32_set_opt_dtype"
FP32_APPEND_DTYPE: Final = "fp32_append_dtype"
PROMOTE: Final = "promote"
BANNED: Final = "banned"
#: Casts eligible arguments to fp16 whatever autocast's dtype: cuDNN RNNs' own wrapper
#: (``aten/src/ATen/cudnn/AutocastRNN.cpp`` hard-codes ``at::kHalf``), so an ``nn.LSTM`` under
#: bf16 autocast returns fp16 on a GPU.
FP16: Final = "fp16"
#: A library's autocast wrapper that runs the op in fp32 and casts its outputs back to the
#: dtype of its first input (torchvision's ``roi_align``, ``roi_pool``, ``deform_conv2d``, ...).
FP32_OUTPUT_AS_INPUT: Final = "fp32_output_as_input"
#: ``torch.library.register_autocast(op, device_type, cast_inputs)``: every eligible floating tensor
#: argument is cast to ``cast_inputs`` (a fixed dtype, whatever autocast's own), then the op runs
#: with autocast off. :func:`library_rule` reads ``cast_inputs`` back from the registration.
CAST_INPUTS: Final = "cast_inputs"
#: An autocast kernel is registered for the op, but ampgraph does not know what it does.
OPAQUE: Final = "opaque"
#: The five CastPolicy categories of autocast_mode.h, ops autocast refuses to run, the rule of
#: libraries' wrappers ampgraph knows, and kernels it does not know.
CATEGORIES: Final = (
    LOWER_PRECISION_FP,
    FP32,
    FP32_SET_OPT_DTYPE,
    FP32_APPEND_DTYPE,
    PROMOTE,
    BANNED,
    FP16,
    FP32_OUTPUT_AS_INPUT,
    CAST_INPUTS,
    OPAQUE,
)

#: How each category reads in tables, diagrams and legends.
CATEGORY_LABEL: Final[dict[str, str]] = {
    LOWER_PRECISION_FP: "lower precision",
    FP32: "fp32",
    FP32_SET_OPT_DTYPE: "fp32 (output dtype)",
    FP32_APPEND_DTYPE: "fp32 (appended dtype)",
    PROMOTE: "promote",
    BANNED: "banned",
    FP16: "fp16 (whatever autocast's dtype)",
    FP32_OUTPUT_AS_INPUT: "fp32 (output in input dtype)",
    CAST_INPUTS: "casts inputs (register_autocast)",
    OPAQUE: "opaque autocast kernel",
}
