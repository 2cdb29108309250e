#!/usr/bin/env python
"""Families nobody here tuned for, each tried once as a new user would: docs/families-further.md.

Diffusion (diffusers' UNet2DConditionModel, UNet2DModel, AutoencoderKL), graph networks
(torch_geometric's GCN and GAT), quantisation-aware training (``torch.ao`` ``prepare_qat``), a
detection head (torchvision's RetinaNetHead on two feature maps) and transformers families the
other matrices leave out (ModernBERT, RWKV, SegFormer, CLIP with its loss, PatchTST, Gemma 3,
ViT-MAE, Jamba), each built small from a config with random weights. Every model is analysed in
the four settings with bf16 and fp16 autocast on CUDA (``fp32`` once: it has no 16-bit dtype) and
compared with the dispatcher (``ampgraph check``) and with its own forward hooks on fake CUDA
tensors running the real autocast kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`),
line by line.

diffusers and torch_geometric are not ampgraph's dependencies: ``pip install diffusers
torch_geometric`` first; a model whose library is missing is listed as skipped.

    .venv/bin/python scripts/families_further.py                 # -> docs/families-further.md
    .venv/bin/python scripts/families_further.py -m jamba --out /tmp/f.md

Exit status 1 if any node or hook line disagrees.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import (  # noqa: E402
    AGREEMENT,
    AMP_DTYPES,
    SETTINGS,
    Row,
    all_agree,
    compare,
    escape_cell,
    produced_by,
    run_all,
    totals_line,
)

ROOT = Path(__file__).resolve().parent.parent
#: What a builder returns: the module and its example inputs (positional, or keyword as a dict).
Built = tuple[nn.Module, Any]
#: fp32 once (no 16-bit dtype in it), the other settings with each 16-bit dtype.
CELLS = [("fp32", "bf16")] + [(s, d) for d in AMP_DTYPES for s in SETTINGS if s != "fp32"]


def unet() -> Built:
    from diffusers import UNet2DConditionModel

    m = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return m, (torch.randn(1, 4, 8, 8), torch.tensor([10]), torch.randn(1, 4, 32))


def unet2d() -> Built:
    from diffusers import UNet2DModel

    m = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    return m, (torch.randn(1, 3, 8, 8), torch.tensor([10]))


def vae() -> Built:
    from diffusers import AutoencoderKL

    m = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    return m, (torch.randn(1, 3, 16, 16),)


def gcn() -> Built:
    from torch_geometric.nn import GCNConv, global_mean_pool

    class GCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = GCNConv(8, 16)
            self.c2 = GCNConv(16, 16)
            self.head = nn.Linear(16, 3)

        def forward(
            self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor
        ) -> torch.Tensor:
            x = self.c1(x, edge_index).relu()
            x = self.c2(x, edge_index)
            return self.head(global_mean_pool(x, batch))

    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    return GCN(), (torch.randn(4, 8), ei, torch.zeros(4, dtype=torch.long))


def gat() -> Built:
    from torch_geometric.nn import GATConv

    class GAT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = GATConv(8, 8, heads=2)
            self.c2 = GATConv(16, 4, heads=1)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    return GAT(), (torch.randn(4, 8), ei)


def qat() -> Built:
    import torch.ao.quantization as q

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = q.QuantStub()
            self.fc1 = nn.Linear(8, 16)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(16, 4)
            self.dequant = q.DeQuantStub()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))

    m = Net().train()
    m.qconfig = q.get_default_qat_qconfig("x86")
    q.prepare_qat(m, inplace=True)
    return m, (torch.randn(2, 8),)


def retinanet_head() -> Built:
    from torchvision.models.detection.retinanet import RetinaNetHead

    h = RetinaNetHead(in_channels=16, num_anchors=3, num_classes=5)
    return h, ([torch.randn(1, 16, 8, 8), torch.randn(1, 16, 4, 4)],)


def _ids(n: int = 8, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n))


def jamba() -> Built:
    from transformers import JambaConfig, JambaForCausalLM

    c = JambaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        use_mamba_kernels=False,
    )
    return JambaForCausalLM(c).eval(), {"input_ids": _ids()}


def rwkv() -> Built:
    from transformers import RwkvConfig, RwkvForCausalLM

    c = RwkvConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        context_length=16,
    )
    return RwkvForCausalLM(c).eval(), {"input_ids": _ids()}


def modernbert() -> Built:
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    c = ModernBertConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        global_attn_every_n_layers=2,
        local_attention=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )
    return ModernBertForMaskedLM(c).eval(), {"input_ids": _ids()}


def segformer() -> Built:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    c = SegformerConfig(
        num_channels=3,
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=3,
        patch_sizes=[7, 3],
        strides=[4, 2],
    )
    return SegformerForSemanticSegmentation(c).eval(), {"pixel_values": torch.randn(1, 3, 32, 32)}


def clip_loss() -> Built:
    from transformers import CLIPConfig, CLIPModel

    c = CLIPConfig(
        text_config={
            "vocab_size": 128,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 16,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 16,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    return CLIPModel(c).eval(), {
        "input_ids": _ids(8).repeat(2, 1),
        "pixel_values": torch.randn(2, 3, 16, 16),
        "return_loss": True,
    }


def patchtst() -> Built:
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    c = PatchTSTConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=64,
    )
    return PatchTSTForPrediction(c).eval(), {"past_values": torch.randn(1, 32, 3)}


def gemma3() -> Built:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    c = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
    )
    return Gemma3ForCausalLM(c).eval(), {"input_ids": _ids()}


def vitmae() -> Built:
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    c = ViTMAEConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
        decoder_hidden_size=32,
        decoder_intermediate_size=64,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=4,
    )
    return ViTMAEForPreTraining(c).eval(), {"pixel_values": torch.randn(1, 3, 16, 16)}


#: name -> (family, library, builder).
MODELS = {
    "unet2d-condition": ("diffusion", "diffusers", unet),
    "unet2d": ("diffusion", "diffusers", unet2d),
    "autoencoder-kl": ("diffusion", "diffusers", vae),
    "gcn": ("graph network", "torch_geometric", gcn),
    "gat": ("graph network", "torch_geometric", gat),
    "qat-mlp": ("quantisation-aware training", "torch.ao", qat),
    "retinanet-head": ("detection head", "torchvision", retinanet_head),
    "modernbert": ("encoder", "transformers", modernbert),
    "rwkv": ("recurrent LM", "transformers", rwkv),
    "segformer": ("segmentation", "transformers", segformer),
    "clip-with-loss": ("contrastive, with loss", "transformers", clip_loss),
    "patchtst": ("time series", "transformers", patchtst),
    "gemma3": ("decoder, sliding window", "transformers", gemma3),
    "vit-mae": ("masked autoencoder", "transformers", vitmae),
    "jamba": ("hybrid Mamba + MoE", "transformers", jamba),
}


def _inputs(name: str, built: Built) -> Any:
    from ampgraph.model.build import ModelInputs

    module, inputs = built
    if isinstance(inputs, dict):
        return ModelInputs(name, module, kwargs=inputs)
    return ModelInputs(
        name, module, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    )


def run(name: str) -> Row:
    """``name`` in its seven cells, each analysed and run eagerly on a model built afresh."""
    family, library, build = MODELS[name]
    row = Row(name, family, library)
    start = time.perf_counter()
    for setting_name, dtype in CELLS:
        try:
            torch.manual_seed(0)
            model = _inputs(name, build())
            torch.manual_seed(0)
            eager = _inputs(name, build())
        except ImportError as exc:
            row.note = f"skipped: {exc.name or exc} is not installed"
            break
        row.cells[(dtype, setting_name)] = compare(model, setting_name, dtype, eager_model=eager)
    row.seconds = time.perf_counter() - start
    first = next((c for c in row.cells.values() if not c.agrees), None)
    if first is not None and not row.note:
        (dtype, setting_name), cell = next((k, c) for k, c in row.cells.items() if c is first)
        why = cell.failure or cell.first_difference or f"{cell.disagreements} nodes disagree"
        row.note = f"{setting_name} {dtype}: {why[:200]}"
    return row


def page(rows: list[Row], seconds: float) -> str:
    """The page: how it was made, a line per model, then what the first run found."""
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    for lib in ("diffusers", "torch_geometric"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    out = [
        "# Further families, each tried once",
        "",
        (
            produced_by("scripts/families_further.py", versions, seconds) + " Each model was "
            "built small from a config, with random weights, and run with no look at ampgraph's "
            "output beforehand, as a new user would: the four settings with bf16 and fp16 CUDA "
            "autocast (`fp32` once), each against the dispatcher and against the model's own "
            "forward hooks on fake CUDA tensors running the real autocast kernels. "
            f"**{totals_line(rows)}** " + AGREEMENT
        ),
        "",
        "| model | family | library | cells agreeing | hook lines agreeing | dispatcher disagreements | s | note |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in rows:
        out.append(f"| {r.name} | {r.family} | {r.library} | {r.agreeing}/{len(r.cells)} | "
                   f"{r.count('hooks_agree')}/{r.count('hooks')} | {r.count('disagreements')} | "
                   f"{r.seconds:.0f} | {escape_cell(r.note)} |")  # fmt: skip
    out += ["", NOTES]
    return "\n".join(out) + "\n"


NOTES = """## What the first run found, and what changed

The first run found two things, both fixed before this page was made (`tests/test_meta_kernels.py`):

* **Jamba** (transformers' MoE experts) picks `F.grouped_mm` by
  `torch.cuda.get_device_capability()`, which asked the absent driver: its bf16 settings fell back
  to a graph traced with fp32 parameters, with an error a real run does not raise, and the eager
  oracle stopped at "Found no NVIDIA driver". Fake CUDA tensors now stand for an sm_90 GPU when
  model code asks what the device is (`ampgraph.torchutil.simulated_cuda_amp`).
* Then `_grouped_mm`'s meta kernel in torch 2.14 refused fp32 (and fp16 without cuBLASLt 13.3),
  which the real CUDA and CPU kernels take (`GroupedMMUtils.h`): the eager oracle raised where a
  GPU does not. ampgraph replaces that meta kernel with one typed as the real kernels
  (`ampgraph.capture.meta_kernels`), proved against the real CPU kernel for every dtype pair.

Jamba went from 20 of 43 hook lines in six of its cells to all of them.

**A graph network's pooling is sized by data.** torch_geometric's `global_mean_pool` sizes its
output by `batch.max() + 1`, a value fake tensors do not know: ampgraph traces along the path
seeded random values take (`capture.data_dependent`), and the eager run is given the same sizes
(`capture.unbacked_values`, as the vision matrix gives its detectors'); every dtype is still the
eager kernels' own.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", choices=list(MODELS),
                        help="only this model (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "families-further.md")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    rows = run_all(args.model or list(MODELS), run, args.jobs, "families-further")
    args.out.write_text(page(rows, time.perf_counter() - start))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all_agree([r for r in rows if not r.note.startswith("skipped")]) else 1


if __name__ == "__main__":
    sys.exit(main())
