"""The fake-kernel survey's page (docs/fake-kernels.md): the ops where the fake kernels part from
the real ones, raw and as ampgraph replays them, and how ampgraph covers them.

>>> _cell("a `b`")
"a 'b'"
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fake_kernel_variants import OpRow

#: What ampgraph does about each op the survey finds, and on which device (written by hand:
#: where each check lives in PyTorch's source, which the survey cannot see).
COVERAGE = """## How ampgraph covers them

The checks are `ampgraph.annotate.strict.STRICT_CHECKS` (raised with the real kernel's message
before the fake kernel runs), the output dtypes `ampgraph.annotate.kernel_dtypes` (CPU kernels)
and `ampgraph.capture.meta_kernels` (meta kernels replaced on every device). A check is given to
CUDA only where the code that makes it runs on both devices (a structured kernel's meta function,
a device-generic native function); otherwise it is the CPU's alone, as said below.

* **Matmul family** (`addmm`, `mm`, `bmm`, `baddbmm`, `addmv`, `mv`, `dot`; `matmul`, `linear`,
  `__rmatmul__`, `multi_head_attention_forward` reach them), **normalisations** (the CPU's
  mixed-type rules, now for every batch-norm entry point: `_batch_norm_with_update`,
  `_batch_norm_no_update`, `_native_batch_norm_legit_functional` too), `index_put`, `index_add`,
  `index_copy`, `lerp`, `binary_cross_entropy`, `nll_loss`, `grid_sampler`, `linalg.cross`,
  `embedding_bag`: as before this survey, which confirms them.
* **`complex`, `polar`**: `complex_check_floating` then `complex_check_dtype`
  (`TensorFactories.cpp`, every device): bf16 is refused, and the two parts must share a dtype.
* **`heaviside`**: its structured meta function (every device) refuses two dtypes.
* **`index_reduce`**: `index_func_meta_impl`, `index_add`'s structured meta (every device).
* **`put`** (`put_`, device-generic) and **`_unsafe_masked_index_put_accumulate`** (an
  `index_put_` of its values, device-generic): source and destination must share a dtype.
* **`_softmax_backward_data`, `_log_softmax_backward_data`** (CPU only): the CPU kernel returns
  the gradient's dtype whatever `input_dtype` says (the decomposition fake tensors run casts to
  it; its own comment says the CPU kernel does not respect it), reads `output` as the gradient's
  type, and refuses an fp32 gradient with `input_dtype=torch.half`. CUDA's kernel is not
  visible from here: left to the fake kernel.
* **`_scaled_dot_product_flash_attention_for_cpu`** (a CPU op): key and value are read as the
  query's type; `attn_mask` must be the query's dtype or fp32, checked first.
* **`convolution`** (CPU): `aten.convolution` makes no bias check of its own on the CPU (the one
  with `dtype().name()` is `at::conv1d/2d/3d`'s, composite functions that run on fake tensors
  too); its backend does. ampgraph now picks the backend as `ConvParams::use_mkldnn` does: oneDNN
  for a 16-bit input where the CPU has the instructions for its dtype, for an fp32 one by shape,
  groups, strides, dilations and thread count, which refuses a weight or a bias of another dtype;
  the slow kernels read the weight (and the 3-D transposed one the bias) as the input's type and
  take any other bias. Before, every bias of another dtype was refused, which
  `conv_transpose1d/2d` and `conv3d(padding="same")` accept. Which 16-bit dtypes oneDNN takes
  is the machine's: torch's own device checks say (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`,
  `_is_mkldnn_fp16_supported()`; `ampgraph.annotate.cpu_backend`): bf16 with AVX-512, fp16 with
  AVX512-FP16 (a Sapphire Rapids Xeon, not this AMD EPYC, where fp16 takes the slow kernels).
  CUDA keeps its checks (the bias compared first, then cuDNN's).
* **Python scalars** (not a mixed-dtype variant, so not in the figures above): kernels convert a
  Python number with `Scalar::to<scalar_t>()`, which raises `value cannot be converted to type
  c10::BFloat16 without overflow` for a finite value outside the type's range; fake kernels never
  convert it. `F.pad(x_bf16, (1, 1), value=torch.finfo(torch.float32).min)` is the common case
  (fp32's lowest is below bf16's). `ampgraph.annotate.scalars` raises it for `constant_pad_nd`,
  `fill`, `full`, `full_like`, `new_full` and `masked_fill` on every device, and on the CPU for
  `clamp`, `threshold`, `hardtanh`, `index_fill`, `scatter`, `pow`, `alpha=`, `value=`,
  `linspace` and the ops that convert to fp32 first (`leaky_relu`, `softplus`, `elu`, `celu`);
  `tests/test_scalar_overflow.py` proves each against the real CPU kernel.
* **`addr`**, **`huber_loss`**, **`soft_margin_loss`** (meta kernels, every device): the
  references these fake kernels ran promote their arguments; the real kernels do not.
  `build_addr_iter` expands `self` to the outer product's shape first, so a 0-dim fp32 `self`
  with bf16 vectors gives fp32; `huber_loss` writes into `at::empty_like(input)` and
  `soft_margin_loss` into a tensor of `input`'s options, so the input's dtype wins.
* **Backward kernels** (not in `op_db`; the survey probes 14 that a training step's joint trace
  replays, one fp32 sample each). CPU only, where the kernels are the CPU's:
  `glu_backward` and `log_sigmoid_backward` (a `TensorIterator` that wants `self`'s dtype),
  `nll_loss_backward`/`nll_loss2d_backward` (weight, total weight and gradient read as `self`'s
  type), and the normalisations' backwards (`native_layer_norm_backward`,
  `native_group_norm_backward`, `native_batch_norm_backward`: the forward's mixed-type rules,
  with the statistics in fp32 for a 16-bit input with fp32 parameters). Every device, as meta
  kernels: `threshold_backward` (ReLU's) promotes its gradient with `self`, as its structured
  meta function's binary `TensorIterator` does, and `mse_loss_backward` writes into
  `zeros_like(input)`; the decompositions fake tensors ran typed both otherwise.
* **`linear_cross_entropy` with `options`** (`torch_nn::_linear_cross_entropy_batch_chunked`
  and `..._no_reduction`, custom ops of this torch): their fake kernels check nothing, and the
  real Python kernel's dtype handling depends on the device and an accumulation policy (on the
  CPU a 16-bit input with an fp32 weight runs and the reverse raises `mm`'s error; on CUDA `mm`
  is given an `out_dtype`). Not modelled: the survey lists it above where it still parts.

## Rules of one device

A rule of one device is no evidence for another: a CPU kernel and a CUDA kernel of one op can
lack different dtypes, check different mixes and word their errors differently. These rules are
`ampgraph.annotate.device_kernels.DEVICE_CHECKS`, keyed by `(device type, op)` and consulted by
`StrictDtypeMode` after `STRICT_CHECKS`, for the device the setting names (issue 33).

### Which dtypes a kernel has on each device

`torch.pdist` of a bf16 tensor raises `"pdist_cuda" not implemented for 'BFloat16'` on CUDA (an
H200, torch 2.11, issue 33) and `"pdist" not implemented for 'BFloat16'` on the CPU; fake tensors
typed it bf16 on both. The source that knows which dtypes each kernel has is PyTorch's OpInfo
database (`op.supported_dtypes("cuda")`, `"cpu"`), weighed before use:

* An OpInfo is a Python-level op (`nn.functional.pdist`), the strict mode sees ATen overloads
  (`aten._pdist_forward.default`). `scripts/kernel_coverage.py` runs each OpInfo's first fp32
  samples on fake tensors of the device and records the overloads they reach. An overload is
  marked as lacking a 16-bit dtype on a device only where an OpInfo reaching it lacks the dtype
  and no OpInfo reaching it has it (`view`, `mul`, reached by everything, are never blamed).
* On the CPU each entry is proven: the overload is called for real with the recorded arguments,
  in fp32 (it runs) and in the 16-bit dtype (it raises); the table keeps the real kernel's
  message and the call, and `tests/test_device_kernels.py` reruns every entry against the real
  kernel. OpInfo claims the real kernels contradict are dropped and listed in the table
  (`histogram`, `quantile`'s `ceil_`, `masked_fill_`, ...: reached by an OpInfo that lacks bf16,
  but not where its kernel lacks it).
* OpInfo's CUDA lists depend on the GPU (`SM53OrLater`, `SM80OrLater`, read from a GPU this
  machine does not have); the script reads them as on an sm_90 GPU, the H200's. A CUDA entry is
  kept where the overload is the OpInfo's own op (`histc`, `igamma`) or the one the CPU proved
  lacks the dtype (so the mapping holds); `ceil_`, `lerp_`, `masked_fill_` (reached by
  `quantile`) and `_use_cudnn_ctc_loss` were dropped by that rule. Its message is the wording a
  GPU showed where one did (`pdist_cuda`), else one that names OpInfo as its source: CUDA's own
  wording of those errors is not known here.
* The table (`ampgraph/policy/kernel_coverage.json`) is keyed by torch version (major.minor),
  since OpInfo and the kernels change between releases: torch 2.11's CUDA FFTs refused bf16
  (`Unsupported dtype BFloat16` on the H200), 2.14's take it (cuFFT's `CUDA_C_16BF`, upcast to
  complex64, as `torch/_refs/fft.py` and the meta kernel of `_fft_r2c` say), and fake tensors
  type both as the installed release does, through `promote_type_fft` in `SpectralOps.cpp`. On the
  CPU the FFTs raise `Unsupported dtype BFloat16` in that composite code before any kernel, on
  fake tensors too. A torch older than every table gets no coverage rules; the suite fails on a
  torch without its own table until the script is run. Every supported release has its own
  table, each made with that release's OpInfo and its CPU entries proven on its real CPU kernels
  (overloads per device; about a minute each on this machine):

  | torch | CPU | CUDA | differs from 2.14 |
  |---|---|---|---|
  | 2.10 | 66 | 63 | CPU `trace` lacks bf16/fp16 (2.10 to 2.12), `polar` fp16 (2.10 to 2.13); CUDA `_fft_r2c` bf16, `angle`, `cholesky` (2.10 to 2.13) |
  | 2.11 | 66 | 63 | as 2.10 |
  | 2.12 | 66 | 63 | as 2.10 |
  | 2.13 | 65 | 63 | as 2.10 but `trace` |
  | 2.14 | 67 | 62 | `linalg_matrix_sqrth`, `linalg_polar` (ops new in 2.14's OpInfo) |

  On 2.10 to 2.12 the real `linalg_ldl_solve` with the survey's random pivots aborts the process
  (`double free or corruption`; 2.13 raises first), so each real call of the proof runs in a
  forked child and a call that kills it is dropped and listed, not taken as the kernel's word.
* A kernel switches on its first floating input's dtype (`AT_DISPATCH(x1.scalar_type(), ...)`)
  or computes in its inputs' common dtype; the script calls each CPU entry with a 16-bit first
  input beside fp32 ones and records which (`dispatch`), and the check fires on the first input
  or, for the others, only where every floating input is of the lacking dtype (a mixed call meets
  a mixing check or computes in fp32; the suite runs every entry both ways on the real kernel).
  `_cdist_forward` with p=2 past 25 rows takes matrix products (`cdist_impl`, `Distance.cpp`)
  and reaches no such kernel: no error there, on the real CPU kernel too. CUDA's `cdist` wording
  is its source's (`"cdist_cuda"`, `cuda/DistanceKernel.cu`, the file of `pdist_cuda`).
  torch 2.14: 67 CPU overloads, 62 CUDA ones,
  mostly linear algebra and special functions, and `cdist`, `pdist`, `histc`, `igamma`,
  `complex`, `polar`, `view_as_complex`, `avg_pool3d` (CPU fp16), `_upsample_bilinear2d_aa`,
  `multi_margin_loss`, `rrelu_with_noise`, `_ctc_loss`.

### CUDA's normalisation kernels

Read from ATen's CUDA sources; the H200 showed the first and the layer norm's message.

* **`native_batch_norm`** and its variants (`_native_batch_norm_legit`, `.no_stats`,
  `_no_training`, `_functional`; `instance_norm` is one underneath): `batch_norm_cuda_out` in
  `cuda/Normalization.cu` computes the statistics with `TensorIterator`s that cast, then
  `batch_norm_elementwise`. Its *contiguous* kernel (`batch_norm_elemt_cuda_template`,
  `cuda/Normalization.cuh`) calls the parameters "mixed" when the first one given differs from
  the input (`is_mixed_type`) and reads both as `acc_type` (fp32), otherwise as the input's type,
  through `packed_accessor_or_dummy`: an fp32 input with bf16 weights raises `Expected weight to
  have type Float but got BFloat16`; a 16-bit input with fp32 weights runs; a bf16 weight with an
  fp32 bias raises `Expected bias to have type BFloat16 but got Float`. An input whose channels
  have stride 1 (a 2-D `BatchNorm1d` input, channels last) takes
  `batch_norm_elemt_channels_last_cuda_template`, the same choice read with `const_data_ptr`
  (`expected scalar type Float but found BFloat16`); a non-contiguous one or one past 32-bit
  indexing the *general* kernel, a `TensorIterator` that casts (no error).
* **`cudnn_batch_norm`** (`cudnn/BatchNorm.cpp`): `_batch_norm_impl_index` sends fp16/fp32 mixes
  with weight and bias, 3-D or more, eps at least 1e-5, to cuDNN (never bf16), which wants fp32
  weights beside an fp16 input (`checkScalarType`) and the input's type otherwise
  (`checkAllSameType`: `Expected tensor for argument #1 'input' to have the same type as tensor
  for argument #2 'weight'; but type torch.cuda.FloatTensor does not equal torch.cuda.HalfTensor
  (while checking arguments for cudnn_batch_norm)`), then one type for weight, bias and running
  statistics. `_batch_norm_with_update` picks between the two as `_select_batch_norm_backend`.
* **`native_group_norm`**: `group_norm.cpp` (every device) makes the CPU's mixed check
  (`mixed dtype (CPU): expect parameter to have scalar type of Float`, "(CPU)" on CUDA too) and
  gives a mixed call fp32 statistics; CUDA's `GroupNormKernelImplInternal<T>`
  (`cuda/group_norm_kernel.cu`) then reads the statistics as the input's type, so a 16-bit input
  with fp32 parameters, which the CPU runs, raises `expected scalar type BFloat16 but found
  Float` on CUDA (from the source; no GPU has shown it yet). Unmixed, gamma and beta are read
  as the input's type (`const_data_ptr`; a `TensorIterator` of one dtype where H*W is 1:
  `Found dtype Float but expected BFloat16`).
* **`native_layer_norm`**: `LayerNormKernelImplInternal<T>` (`cuda/layer_norm_kernel.cu`) reads
  gamma and beta as the input's type T unless there are no rows: `expected scalar type Float but
  found BFloat16` (the H200's). torch 2.14's reference checks the same
  (`_check_native_layer_norm_cuda_param_dtype`); the rule covers releases whose fake kernels did
  not.

`tests/test_device_kernels.py` tests each rule on fake CUDA tensors, a GroupNorm then BatchNorm
under CUDA `amp-half` (the BatchNorm raises the H200's error), and the CPU counterpart against
the real CPU kernels.

### Library autocast kernels

torchvision 0.29's wrappers (`torchvision/_autograd_registrations.py`) cast every floating, not
fp64, argument to fp32 and return every output in the input's dtype: `roi_align` (CUDA, CPU,
XPU), `roi_pool`, `ps_roi_align`, `ps_roi_pool` (whose index outputs, `argmax` and
`channel_mapping`, come back in the input's 16-bit dtype too) and `deform_conv2d` (CUDA);
`nms` returns its own int64 indices. ampgraph's rule (`fp32_output_as_input` in
`ampgraph.policy.kernels.LIBRARY_KERNELS`) is that; the H200 showed it for the first three, and
the suite runs each wrapper's own code on CPU tensors beside ampgraph's prediction under CUDA
autocast. No change was needed to the rule's data.

### Checked, no rule needed

* SDPA: q, k and v of different dtypes raise in `validate_sdpa_input` (device-generic, on fake
  tensors too). Fake CUDA tensors take the math backend (which upcasts 16-bit inputs inside) where
  a GPU takes flash or efficient attention; both return the query's dtype. Flash attention's own
  refusal of fp32 only moves the choice to another backend.
* Reductions (`sum`, `mean`, `cumsum`, `norm`) of 16-bit tensors accumulate in fp32 inside the
  CUDA kernels (`acc_type`), but their output dtype is set by structured meta functions every
  device shares: nothing for a dtype rule to add.
* Not modelled yet: the CUDA normalisations' backward kernels (`batch_norm_backward_cuda`'s own
  mixed rule, read from the same file) and `_batch_norm_no_update`, which the forward graphs
  ampgraph records do not reach.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def render(rows: list[OpRow], wall: float) -> str:
    """The page: header, the ops where raw fake and real part, and what ampgraph covers."""
    surveyed = [r for r in rows if r.variants]
    samples = sum(r.samples for r in surveyed)
    variants = sum(len(r.variants) for r in surveyed)
    parting = [r for r in surveyed if r.kinds("raw")]
    left = [r for r in surveyed if r.kinds("ampgraph")]
    cores = os.cpu_count()
    lines = [
        "# Fake kernels against the real ones",
        "",
        (
            "ampgraph predicts dtypes on fake tensors, whose kernels compute output dtypes but do not "
            "always make the dtype checks the real kernels make. This survey runs torch's own OpInfo "
            "database (`op_db`, each op's `sample_inputs`) in mixed dtypes: for every sample with two "
            "or more floating tensors, one of them bf16 or fp16 while the others are fp32, the "
            "reverse, and all bf16 or all fp16. Each call runs on the real CPU kernel (the oracle), "
            "on fake CPU tensors as the fake kernels alone type it (*raw*), and on fake CPU tensors "
            "as ampgraph replays it (its replaced meta kernels, `StrictDtypeMode` and "
            "`RealCpuDtypes`; fake CUDA tensors under `StrictDtypeMode('cuda')` are recorded "
            "too, with no real kernel to compare). A variant *agrees* when both raise or neither does with the same output dtypes; "
            "*lenient*: the real kernel raises and the fake one does not (a check the fake kernel "
            "lacks); *strict*: the fake kernel raises and the real one does not; *dtype*: both run "
            "and the output dtypes part."
        ),
        "",
        (
            f"Produced by `scripts/fake_kernel_survey.py` with torch {torch.__version__}, Python "
            f"{platform.python_version()}, on {cores} CPU cores ({platform.machine()}, "
            f"{torch.backends.cpu.get_cpu_capability()}, one thread) and no GPU, in {wall:.0f} s wall: "
            f"{len(rows)} OpInfos and backward kernels visited, {len(surveyed)} with two or more "
            "floating tensors "
            f"surveyed ({samples} samples, {variants} mixed-dtype variants). The raw fake kernels "
            f"part from the real ones on {len(parting)} ops; as ampgraph replays them, on "
            f"{len(left)}."
        ),
        "",
        "## Where the raw fake kernels part",
        "",
        "| op | raw fake | example call | real CPU kernel | ampgraph now | fake CUDA (ampgraph) |",
        "|---|---|---|---|---|---|",
    ]
    for r in parting:
        v = r.example("raw")
        assert v is not None
        now = ", ".join(r.kinds("ampgraph")) or "agrees"
        lines.append(
            f"| `{r.name}` | {', '.join(r.kinds('raw'))} | `{_cell(v.call)}` | "
            f"{_cell(v.real.describe())} | {now} | {_cell(v.cuda.describe())} |"
        )
    lines += ["", "## Where ampgraph still parts", ""]
    if not left:
        lines.append("Nowhere: every variant of every surveyed op agrees with the real CPU kernel.")
    else:
        lines += [
            "| op | class | example call | real CPU kernel | ampgraph |",
            "|---|---|---|---|---|",
        ]
        for r in left:
            v = r.example("ampgraph")
            assert v is not None
            lines.append(
                f"| `{r.name}` | {', '.join(r.kinds('ampgraph'))} | `{_cell(v.call)}` | "
                f"{_cell(v.real.describe())} | {_cell(v.ampgraph.describe())} |"
            )
    return "\n".join([*lines, "", COVERAGE]) + "\n"
