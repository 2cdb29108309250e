"""Beyond transformers, by the zoo's rules (issue 42): diffusers, peft and timm families, and
torch's attention and checkpoint corners (``zoo_corners``).

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

import zoo_corners


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


def unet2d() -> Any:
    import torch
    from diffusers import UNet2DModel

    m = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=8, norm_num_groups=32,
    )  # fmt: skip
    return _mi("unet2d", m, _t(1, 3, 16, 16), torch.tensor([10]))


def unet3d() -> Any:
    import torch
    from diffusers import UNet3DConditionModel

    m = UNet3DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=32,
    )  # fmt: skip
    return _mi("unet3d-condition", m, _t(1, 4, 2, 8, 8), torch.tensor([10]), _t(1, 4, 32))


def unet_svd() -> Any:
    import torch
    from diffusers import UNetSpatioTemporalConditionModel

    m = UNetSpatioTemporalConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=32, num_attention_heads=(4, 8), addition_time_embed_dim=32,
        projection_class_embeddings_input_dim=96, num_frames=2,
    )  # fmt: skip
    return _mi("unet-spatio-temporal", m, _t(1, 2, 4, 8, 8), torch.tensor([10]), _t(1, 1, 32),
               torch.tensor([[6.0, 127.0, 0.02]]))  # fmt: skip


def vae_tiny() -> Any:
    from diffusers import AutoencoderTiny

    m = AutoencoderTiny(encoder_block_out_channels=(32, 32), decoder_block_out_channels=(32, 32),
                        num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1))  # fmt: skip
    return _mi("autoencoder-tiny", m, _t(1, 3, 16, 16))


def vq() -> Any:
    from diffusers import VQModel

    m = VQModel(
        block_out_channels=(32, 64), norm_num_groups=32, latent_channels=3, num_vq_embeddings=16,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
    )  # fmt: skip
    return _mi("vq", m, _t(1, 3, 16, 16))


def vae_video() -> Any:
    from diffusers import AutoencoderKLCogVideoX

    m = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 8, 8), latent_channels=4, norm_num_groups=2,
        temporal_compression_ratio=4, layers_per_block=1,
    )  # fmt: skip
    return _mi("autoencoder-kl-cogvideox", m, _t(1, 3, 5, 16, 16))


def cogvideox() -> Any:
    import torch
    from diffusers import CogVideoXTransformer3DModel

    m = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        time_embed_dim=2, text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8,
        sample_frames=8, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=8,
    )  # fmt: skip
    return _mi("cogvideox", m, _t(1, 2, 4, 8, 8), encoder_hidden_states=_t(1, 8, 8),
               timestep=torch.tensor([3]))  # fmt: skip


def ltx_video() -> Any:
    import torch
    from diffusers import LTXVideoTransformer3DModel

    m = LTXVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, caption_channels=16,
    )  # fmt: skip
    return _mi("ltx-video", m, _t(1, 32, 4), encoder_hidden_states=_t(1, 8, 16),
               timestep=torch.tensor([3]), encoder_attention_mask=torch.ones(1, 8),
               num_frames=2, height=4, width=4)  # fmt: skip


def wan() -> Any:
    import torch
    from diffusers import WanTransformer3DModel

    m = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
    )  # fmt: skip
    return _mi("wan", m, _t(1, 4, 2, 8, 8), encoder_hidden_states=_t(1, 12, 16),
               timestep=torch.tensor([3]))  # fmt: skip


def hunyuan_video() -> Any:
    import torch
    from diffusers import HunyuanVideoTransformer3DModel

    m = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4),
    )  # fmt: skip
    return _mi("hunyuan-video", m, _t(1, 4, 1, 8, 8), timestep=torch.tensor([3]),
               encoder_hidden_states=_t(1, 12, 16), pooled_projections=_t(1, 8),
               encoder_attention_mask=torch.ones(1, 12), guidance=torch.tensor([1.0]))  # fmt: skip


def mochi() -> Any:
    import torch
    from diffusers import MochiTransformer3DModel

    m = MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=4,
        max_sequence_length=16,
    )  # fmt: skip
    return _mi("mochi", m, _t(1, 4, 2, 8, 8), encoder_hidden_states=_t(1, 16, 16),
               timestep=torch.tensor([3]), encoder_attention_mask=torch.ones(1, 16))  # fmt: skip


def sana() -> Any:
    import torch
    from diffusers import SanaTransformer2DModel

    m = SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
        caption_channels=16, sample_size=8,
    )  # fmt: skip
    return _mi("sana", m, _t(1, 4, 8, 8), encoder_hidden_states=_t(1, 4, 16),
               timestep=torch.tensor([3]))  # fmt: skip


def lumina2() -> Any:
    import torch
    from diffusers import Lumina2Transformer2DModel

    m = Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=1,
        num_refiner_layers=1, num_attention_heads=3, num_kv_heads=1, multiple_of=2,
        axes_dim_rope=(4, 2, 2), axes_lens=(64, 16, 16), cap_feat_dim=8,
    )  # fmt: skip
    return _mi("lumina2", m, _t(1, 4, 8, 8), timestep=torch.tensor([0.5]),
               encoder_hidden_states=_t(1, 6, 8),
               encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool))  # fmt: skip


def auraflow() -> Any:
    import torch
    from diffusers import AuraFlowTransformer2DModel

    m = AuraFlowTransformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16,
        joint_attention_dim=32, out_channels=4, pos_embed_max_size=64,
    )  # fmt: skip
    return _mi("auraflow", m, _t(1, 4, 8, 8), encoder_hidden_states=_t(1, 8, 32),
               timestep=torch.tensor([3]))  # fmt: skip


def hunyuan_dit() -> Any:
    import torch
    from diffusers import HunyuanDiT2DModel

    m = HunyuanDiT2DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2,
        in_channels=4, cross_attention_dim=32, cross_attention_dim_t5=32, hidden_size=16,
        pooled_projection_dim=16, text_len=8, text_len_t5=8,
    )  # fmt: skip
    rope = (torch.ones(16, 8), torch.zeros(16, 8))
    return _mi("hunyuan-dit", m, _t(1, 4, 8, 8), timestep=torch.tensor([3.0]),
               encoder_hidden_states=_t(1, 8, 32), text_embedding_mask=torch.ones(1, 8),
               encoder_hidden_states_t5=_t(1, 8, 32), text_embedding_mask_t5=torch.ones(1, 8),
               image_meta_size=torch.tensor([[8.0, 8, 8, 8, 0, 0]]), style=torch.tensor([0]),
               image_rotary_emb=rope)  # fmt: skip


def sd3_controlnet() -> Any:
    import torch
    from diffusers import SD3ControlNetModel

    m = SD3ControlNetModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16,
    )  # fmt: skip
    return _mi("sd3-controlnet", m, _t(1, 4, 8, 8), controlnet_cond=_t(1, 4, 8, 8),
               encoder_hidden_states=_t(1, 4, 32), pooled_projections=_t(1, 16),
               timestep=torch.tensor([3]))  # fmt: skip


def flux_controlnet() -> Any:
    import torch
    from diffusers import FluxControlNetModel

    m = FluxControlNetModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(4, 4, 8),
    )  # fmt: skip
    return _mi("flux-controlnet", m, _t(1, 16, 4), controlnet_cond=_t(1, 16, 4),
               encoder_hidden_states=_t(1, 8, 32), pooled_projections=_t(1, 32),
               timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
               txt_ids=torch.zeros(8, 3))  # fmt: skip


def _tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=37)  # fmt: skip
    return LlamaModel(config)


def _peft(name: str, kind: str = "LoraConfig", **options: Any) -> Any:
    import torch
    import peft

    options.setdefault("target_modules", ["q_proj", "v_proj"])
    model = peft.get_peft_model(_tiny_llama(), getattr(peft, kind)(**options))
    ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    return _mi(name, model, input_ids=ids)


def lora_conv() -> Any:
    """LoRA as diffusers loads it into a UNet: peft's adapter layers on its convolutions and
    attention projections, injected in place (``inject_adapter_in_model``)."""
    from peft import LoraConfig, inject_adapter_in_model

    unet = unet2d()
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                        target_modules=["conv1", "conv2", "to_q", "to_v", "conv_shortcut"])
    inject_adapter_in_model(config, unet.module)
    return _mi("peft/lora-conv", unet.module, *unet.args, **unet.kwargs)


def _timm(name: str, **options: Any) -> Callable[[], Any]:
    def make() -> Any:
        import timm

        size = options.get("img_size", 64)
        model = timm.create_model(name, pretrained=False, num_classes=10, **options)
        return _mi(f"timm/{name}", model, _t(1, 3, size, size))

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
    "diffusers/unet2d": ("diffusers", "UNet (unconditional)", unet2d),
    "diffusers/unet3d-condition": ("diffusers", "UNet 3D (video)", unet3d),
    "diffusers/unet-spatio-temporal": ("diffusers", "UNet spatio-temporal (SVD)", unet_svd),
    "diffusers/autoencoder-tiny": ("diffusers", "VAE (tiny)", vae_tiny),
    "diffusers/vq": ("diffusers", "VQ-VAE", vq),
    "diffusers/autoencoder-kl-cogvideox": ("diffusers", "video VAE (CogVideoX)", vae_video),
    "diffusers/cogvideox": ("diffusers", "video transformer (CogVideoX)", cogvideox),
    "diffusers/ltx-video": ("diffusers", "video transformer (LTX-Video)", ltx_video),
    "diffusers/wan": ("diffusers", "video transformer (Wan)", wan),
    "diffusers/hunyuan-video": ("diffusers", "video transformer (HunyuanVideo)", hunyuan_video),
    "diffusers/mochi": ("diffusers", "video transformer (Mochi)", mochi),
    "diffusers/sana": ("diffusers", "Sana transformer (linear attention)", sana),
    "diffusers/lumina2": ("diffusers", "Lumina2 transformer (grouped-query)", lumina2),
    "diffusers/auraflow": ("diffusers", "AuraFlow transformer", auraflow),
    "diffusers/hunyuan-dit": ("diffusers", "HunyuanDiT transformer", hunyuan_dit),
    "diffusers/sd3-controlnet": ("diffusers", "SD3 ControlNet", sd3_controlnet),
    "diffusers/flux-controlnet": ("diffusers", "Flux ControlNet", flux_controlnet),
    "peft/lora": ("peft", "LoRA on a tiny Llama", lambda: _peft("peft/lora", r=4)),
    "peft/dora": ("peft", "DoRA on a tiny Llama",
                  lambda: _peft("peft/dora", r=4, use_dora=True)),
    "peft/lora-conv": ("peft", "LoRA on a UNet's convolutions and attention", lora_conv),
    "peft/ia3": ("peft", "IA3 on a tiny Llama", lambda: _peft(
        "peft/ia3", "IA3Config", target_modules=["k_proj", "v_proj", "down_proj"],
        feedforward_modules=["down_proj"])),
    "peft/loha": ("peft", "LoHa on a tiny Llama",
                  lambda: _peft("peft/loha", "LoHaConfig", r=4, init_weights=False)),
    "peft/lokr": ("peft", "LoKr on a tiny Llama",
                  lambda: _peft("peft/lokr", "LoKrConfig", r=4, init_weights=False)),
    "peft/adalora": ("peft", "AdaLoRA on a tiny Llama",
                     lambda: _peft("peft/adalora", "AdaLoraConfig", r=4, total_step=10)),
    **{f"timm/{n}": ("timm", fam, _timm(n)) for n, fam in (
        ("mambaout_femto", "MambaOut"), ("starnet_s1", "StarNet"), ("hgnetv2_b0", "HGNetV2"),
        ("mobilenetv4_conv_small", "MobileNetV4"), ("rdnet_tiny", "RDNet"),
        ("fastvit_t8", "FastViT"), ("efficientvit_b0", "EfficientViT (MIT)"),
        ("efficientvit_m0", "EfficientViT (MSRA)"),
    )},
    "timm/eva02_tiny_patch14_224": ("timm", "EVA-02", _timm("eva02_tiny_patch14_224", img_size=56)),
    "timm/vitamin_small_224": ("timm", "ViTamin", _timm("vitamin_small_224", img_size=64)),
    **{f"corners/{n}": ("torch", fam, make) for n, (fam, make) in zoo_corners.CORNERS.items()},
}  # fmt: skip


def build(name: str) -> Any:
    """``name``'s model and inputs, seeded.

    >>> build("timm/starnet_s1").args[0].shape
    torch.Size([1, 3, 64, 64])
    """
    import torch

    torch.manual_seed(0)
    return MODELS[name][2]()
