"""Beyond transformers, by the zoo's rules (issue 42): diffusers, peft and timm families.

Each entry builds one model small, with random weights from seed 0, and one forward call's
inputs; ``scripts/zoo.py --beyond`` runs each as a Ray job exactly as it runs a transformers
model type (``check`` and ``verify --device cpu`` in the same combinations) and its page gives
them a section of docs/zoo.md. The configs are the libraries' own small ones where their tests
have them (diffusers' ``tests/models/*`` dummy configs use 2-4 heads of width 8, 32-64 channels),
no look at ampgraph's output beforehand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _t(*shape: int) -> Any:
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _mi(name: str, module: Any, *args: Any, **kwargs: Any) -> Any:
    from ampgraph.model.build import ModelInputs

    return ModelInputs(name, module.eval(), args, kwargs)


def unet() -> Any:
    from diffusers import UNet2DConditionModel

    m = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=32,
    )  # fmt: skip
    return _mi("unet2d-condition", m, _t(1, 4, 8, 8), _t(1).abs() * 10, _t(1, 4, 32))


def vae() -> Any:
    from diffusers import AutoencoderKL

    m = AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(32, 64), latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=32,
    )  # fmt: skip
    return _mi("autoencoder-kl", m, _t(1, 3, 16, 16))


def dit() -> Any:
    import torch
    from diffusers import DiTTransformer2DModel

    m = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=1,
        sample_size=8, patch_size=2, num_embeds_ada_norm=1000,
    )  # fmt: skip
    return _mi("dit", m, _t(1, 4, 8, 8), timestep=torch.tensor([3]), class_labels=torch.tensor([1]))


def pixart() -> Any:
    import torch
    from diffusers import PixArtTransformer2DModel

    m = PixArtTransformer2DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2,
        caption_channels=32, in_channels=4, cross_attention_dim=16, out_channels=8,
    )  # fmt: skip
    cond = {"resolution": None, "aspect_ratio": None}
    return _mi("pixart", m, _t(1, 4, 8, 8), encoder_hidden_states=_t(1, 4, 32),
               timestep=torch.tensor([3]), added_cond_kwargs=cond)  # fmt: skip


def sd3() -> Any:
    import torch
    from diffusers import SD3Transformer2DModel

    m = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16,
    )  # fmt: skip
    return _mi("sd3", m, _t(1, 4, 8, 8), encoder_hidden_states=_t(1, 4, 32),
               pooled_projections=_t(1, 16), timestep=torch.tensor([3]))  # fmt: skip


def flux() -> Any:
    import torch
    from diffusers import FluxTransformer2DModel

    m = FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(4, 4, 8),
    )  # fmt: skip
    return _mi("flux", m, _t(1, 16, 4), encoder_hidden_states=_t(1, 8, 32),
               pooled_projections=_t(1, 32), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3))  # fmt: skip


def controlnet() -> Any:
    from diffusers import ControlNetModel

    m = ControlNetModel(
        block_out_channels=(32, 64), layers_per_block=1, in_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), cross_attention_dim=32,
        conditioning_embedding_out_channels=(16, 32), attention_head_dim=8, norm_num_groups=32,
    )  # fmt: skip
    return _mi("controlnet", m, _t(1, 4, 8, 8), _t(1).abs() * 10, _t(1, 4, 32), _t(1, 3, 16, 16))


def _tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=37)  # fmt: skip
    return LlamaModel(config)


def _peft(name: str, **lora: Any) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], **lora)
    model = get_peft_model(_tiny_llama(), lora_config)
    ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    return _mi(name, model, input_ids=ids)


def _timm(name: str) -> Callable[[], Any]:
    def make() -> Any:
        import timm

        return _mi(f"timm/{name}", timm.create_model(name, pretrained=False, num_classes=10),
                   _t(1, 3, 64, 64))  # fmt: skip

    return make


#: name -> (library, family, factory)
MODELS: dict[str, tuple[str, str, Callable[[], Any]]] = {
    "diffusers/unet2d-condition": ("diffusers", "UNet (cross-attention)", unet),
    "diffusers/autoencoder-kl": ("diffusers", "VAE", vae),
    "diffusers/dit": ("diffusers", "DiT transformer", dit),
    "diffusers/pixart": ("diffusers", "PixArt transformer", pixart),
    "diffusers/sd3": ("diffusers", "SD3 MMDiT transformer", sd3),
    "diffusers/flux": ("diffusers", "Flux transformer", flux),
    "diffusers/controlnet": ("diffusers", "ControlNet", controlnet),
    "peft/lora": ("peft", "LoRA on a tiny Llama", lambda: _peft("peft/lora")),
    "peft/dora": ("peft", "DoRA on a tiny Llama", lambda: _peft("peft/dora", use_dora=True)),
    **{f"timm/{n}": ("timm", fam, _timm(n)) for n, fam in (
        ("mambaout_femto", "MambaOut"), ("starnet_s1", "StarNet"), ("hgnetv2_b0", "HGNetV2"),
        ("mobilenetv4_conv_small", "MobileNetV4"), ("rdnet_tiny", "RDNet"),
    )},
}  # fmt: skip


def build(name: str) -> Any:
    """``name``'s model and inputs, seeded.

    >>> build("timm/starnet_s1").args[0].shape
    torch.Size([1, 3, 64, 64])
    """
    import torch

    torch.manual_seed(0)
    return MODELS[name][2]()
