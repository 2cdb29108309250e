#!/usr/bin/env python
"""Model families nobody here tuned for, against two oracles, and write docs/families.md.

Each model is a small Hugging Face config built on the CPU (random weights, no download), or a
custom autograd Function with ``torch.amp.custom_fwd(cast_inputs=...)``, fed the inputs its family
takes (labels and the cache where the family has them). It is analysed in the seed's four settings
x {bf16, fp16} autocast on CUDA, and every analysis is compared with

* the dispatcher: ``ampgraph check``, node by node (the real CUDA autocast kernels on fake
  tensors), and
* the eager model: its own forward hooks on every leaf module, run on fake CUDA tensors with the
  real autocast kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`), line by line against
  ``ampgraph table``'s hook lines. A setting that raises is a cell like any other: the line of
  the call that raises is compared too.

    .venv/bin/python scripts/families_matrix.py                  # -> docs/families.md
    .venv/bin/python scripts/families_matrix.py -m t5 -m mamba --out /tmp/f.md -j 1

Progress goes to stderr, a line per model. Exit status 1 if any node or hook line disagrees.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import (  # noqa: E402
    AGREEMENT,
    AMP_DTYPES,
    SETTINGS,
    Cell,
    Row,
    all_agree,
    cell_notes,
    compare,
    produced_by,
    run_all,
    totals_line,
)

if TYPE_CHECKING:
    from ampgraph.model.build import ModelInputs

ROOT = Path(__file__).resolve().parent.parent


def _ids(*shape: int, high: int = 60) -> Any:
    """Token ids, seeded so every run feeds the same ones (only their shape and dtype matter)."""
    import torch

    return torch.randint(1, high, shape, generator=torch.Generator().manual_seed(0))


def _model(name: str, module: Any, args: tuple[Any, ...] = (), **kwargs: Any) -> ModelInputs:
    from ampgraph.model.build import ModelInputs

    return ModelInputs(name, module.eval(), args, kwargs)


# -- the families: each builder returns the model and one forward call's inputs ---------------
# Configs are as small as keeps each family's own code paths (two layers where a layer's input is
# another layer's output, two experts chosen of four); the transformers classes are the ones a
# user instantiates.


def bert() -> ModelInputs:
    """Encoder-only, with token types and a padding mask."""
    import torch
    import transformers

    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32,
    )  # fmt: skip
    ids = _ids(1, 8)
    return _model(
        "bert", transformers.BertForSequenceClassification(config),
        input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
    )  # fmt: skip


def deberta_v2() -> ModelInputs:
    """Encoder-only with disentangled relative-position attention."""
    import transformers

    config = transformers.DebertaV2Config(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, relative_attention=True,
        position_buckets=8, pos_att_type=["p2c", "c2p"], max_relative_positions=16,
    )  # fmt: skip
    return _model("deberta-v2", transformers.DebertaV2ForMaskedLM(config), input_ids=_ids(1, 8))


def electra() -> ModelInputs:
    """Encoder-only with an embedding projection (embedding size != hidden size)."""
    import transformers

    config = transformers.ElectraConfig(
        vocab_size=64, embedding_size=8, hidden_size=16, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
    )  # fmt: skip
    return _model("electra", transformers.ElectraForPreTraining(config), input_ids=_ids(1, 8))


def t5() -> ModelInputs:
    """Encoder-decoder called with labels and its cache on (the loss and the cache objects)."""
    import transformers

    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
        num_heads=2, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return _model(
        "t5", transformers.T5ForConditionalGeneration(config),
        input_ids=_ids(1, 6), labels=_ids(1, 4), use_cache=True,
    )  # fmt: skip


def bart() -> ModelInputs:
    """Encoder-decoder with its cache on, so without labels (BART turns the cache off when
    given labels); its encoder's fp16-only clamp branch reads values (``isfinite(x).all()``)."""
    import transformers

    config = transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    return _model(
        "bart", transformers.BartForConditionalGeneration(config),
        input_ids=_ids(1, 6), decoder_input_ids=_ids(1, 4), use_cache=True,
    )  # fmt: skip


def marian() -> ModelInputs:
    """Encoder-decoder with sinusoidal positions, called with labels (the loss, the decoder's
    inputs shifted from them) and ``use_cache=True``, which Marian turns off given labels."""
    import transformers

    config = transformers.MarianConfig(
        vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=63,
        decoder_start_token_id=63,
    )  # fmt: skip
    return _model(
        "marian", transformers.MarianMTModel(config),
        input_ids=_ids(1, 6), labels=_ids(1, 4), use_cache=True,
    )  # fmt: skip


def whisper() -> ModelInputs:
    """Speech encoder-decoder: log-mel features through two convolutions, labels, the cache."""
    import torch
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=64, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_source_positions=8, max_target_positions=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    # The encoder wants exactly 2 x max_source_positions frames (its second conv has stride 2).
    return _model(
        "whisper", transformers.WhisperForConditionalGeneration(config),
        input_features=torch.randn(1, 8, 16), labels=_ids(1, 4), use_cache=True,
    )  # fmt: skip


def wav2vec2() -> ModelInputs:
    """Speech encoder on the raw waveform: a stack of 1-d convolutions with group norm, then a
    convolutional position embedding with weight norm."""
    import torch
    import transformers

    config = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, do_stable_layer_norm=False,
    )  # fmt: skip
    return _model("wav2vec2", transformers.Wav2Vec2ForCTC(config), (torch.randn(1, 400),))


def mixtral() -> ModelInputs:
    """Mixture of experts: top-2 routing over 4 experts, the router logits returned."""
    import transformers

    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=32,
    )  # fmt: skip
    return _model(
        "mixtral", transformers.MixtralForCausalLM(config),
        input_ids=_ids(1, 6), output_router_logits=True,
    )  # fmt: skip


def qwen2_moe() -> ModelInputs:
    """Mixture of experts with a shared expert and its sigmoid gate."""
    import transformers

    config = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
    )  # fmt: skip
    return _model("qwen2-moe", transformers.Qwen2MoeForCausalLM(config), input_ids=_ids(1, 6))


def mamba() -> ModelInputs:
    """State-space model (Mamba's selective scan, the slow path: no mamba-ssm kernels)."""
    import transformers

    config = transformers.MambaConfig(
        vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4,
    )  # fmt: skip
    return _model("mamba", transformers.MambaForCausalLM(config), input_ids=_ids(1, 6))


def mamba2() -> ModelInputs:
    """State-space model, Mamba-2's chunked scan (torch path), its gated RMS norm."""
    import transformers

    config = transformers.Mamba2Config(
        vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
        conv_kernel=4, head_dim=8, num_heads=4, n_groups=1, chunk_size=4,
    )  # fmt: skip
    return _model("mamba2", transformers.Mamba2ForCausalLM(config), input_ids=_ids(1, 6))


def custom_fwd() -> ModelInputs:
    """A custom autograd Function under ``custom_fwd(cast_inputs=torch.float32)``: the module
    of tests/test_families.py, whose fp32 output meets a 16-bit LayerNorm in ``amp-half``."""
    import torch

    sys.path.insert(0, str(ROOT))  # tests/ is a package: its modules import each other
    from tests.test_families import CustomFwd

    return _model("custom-fwd", CustomFwd(), (torch.randn(2, 8),))


#: name -> (family, builder), in the page's order.
MODELS: dict[str, tuple[str, Callable[[], ModelInputs]]] = {
    "bert": ("encoder", bert),
    "deberta-v2": ("encoder", deberta_v2),
    "electra": ("encoder", electra),
    "t5": ("encoder-decoder", t5),
    "bart": ("encoder-decoder", bart),
    "marian": ("encoder-decoder", marian),
    "whisper": ("speech", whisper),
    "wav2vec2": ("speech", wav2vec2),
    "mixtral": ("MoE", mixtral),
    "qwen2-moe": ("MoE", qwen2_moe),
    "mamba": ("state-space", mamba),
    "mamba2": ("state-space", mamba2),
    "custom-fwd": ("custom autograd Function", custom_fwd),
}


#: Why a model's cells differ, where that is known: printed on the page only while one does.
WHY: dict[str, str] = {
    "bart": (
        "In `half` fp16 BART's encoder branches on its values (`if dtype == float16 and not "
        "isfinite(x).all()`, the clamp): make-fx cannot guard on that, and the capture falls back "
        "to torch.export's draft export, which cannot return the `EncoderDecoderCache` the "
        "cache-on call gives back (make-fx's own path returns cache outputs as tensors). Marian "
        "has the same branch and agrees: called with labels, its cache is off (issue 25, "
        "mechanism 4, with the cache on)."
    ),
}


def build(name: str) -> ModelInputs:
    """The model ``name`` with one forward call's inputs, built on the CPU in eval mode.

    >>> build("bert").module.config.num_hidden_layers
    2
    """
    import torch

    torch.manual_seed(0)
    return MODELS[name][1]()


def run_model(name: str) -> Row:
    """Build ``name`` and compare it in the four settings x two 16-bit dtypes (8 cells)."""
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    model = build(name)
    row = Row(name, MODELS[name][0])
    row.params = f"{sum(p.numel() for p in model.module.parameters()) / 1e3:.1f}k"
    for amp in AMP_DTYPES:
        for setting_name in SETTINGS:
            row.cells[(amp, setting_name)] = compare(model, setting_name, amp)
    row.seconds = time.perf_counter() - start
    return row


def _cell_text(cell: Cell) -> str:
    if cell.failure:
        return "failed"
    mark = "✓" if cell.agrees else "✗"
    text = f"{mark} {cell.hooks_agree}/{cell.hooks}"
    return text + " raises" if cell.raises else text


def markdown(rows: list[Row], seconds: float, versions: dict[str, str]) -> str:
    """The page: how it was made, a line per model, its 8 cells, then each cell that differs."""
    columns = [(amp, s) for amp in AMP_DTYPES for s in SETTINGS]
    lines = [
        "# Model families against the dispatcher and the eager model's hooks",
        "",
        (
            "One or more small models of each family nobody here tuned ampgraph for (issue 25): "
            "encoder-only; encoder-decoder (T5 called with labels and its cache on, BART with its "
            "cache on, Marian with labels, given which it turns its cache off); speech; mixture "
            "of experts; state-space; and a custom autograd Function under "
            "`torch.amp.custom_fwd(cast_inputs=torch.float32)`. Each is a small Hugging Face "
            "config built on the CPU with random weights (no download; the builders are in the "
            "script), analysed in the seed's four settings (fp32, half, amp-half, amp-fp32) with "
            "bf16 and with fp16 CUDA autocast: 8 cells per model. *nodes* is the largest graph, "
            "*compared* the node checks against the dispatcher summed over the 8, "
            "*disagreements* those that differ. A setting that raises is a cell too: the eager "
            "run stops at the call that raises, and ampgraph must name the same call with the "
            "same error. " + AGREEMENT
        ),
        "",
        produced_by("scripts/families_matrix.py", versions, seconds) + " " + totals_line(rows),
        "",
        (
            "| family | model | params | nodes | compared | disagreements | hook lines "
            "| cells agreeing | time |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if not row.cells:
            lines.append(f"| {row.family} | `{row.name}` | {row.params} | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| {row.family} | `{row.name}` | {row.params} "
            f"| {max(c.nodes for c in row.cells.values()):,} "
            f"| {row.count('compared'):,} | {row.count('disagreements')} "
            f"| {row.count('hooks_agree'):,}/{row.count('hooks'):,} "
            f"| {row.agreeing}/{len(row.cells)} | {row.seconds:.0f} s |"
        )
    lines += [
        "",
        (
            "Each cell: ✓ when it agrees, agreeing hook lines / lines, *raises* when the eager "
            "run raises in that setting (and ampgraph says so at the same call)."
        ),
        "",
        "| model | " + " | ".join(f"{s} {amp}" for amp, s in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for row in rows:
        if len(row.cells) == len(columns):
            texts = [_cell_text(row.cells[key]) for key in columns]
            lines.append(f"| `{row.name}` | " + " | ".join(texts) + " |")
    raising = [
        f"* `{row.name}` {setting} {amp}: `{cell.raises}`"
        for row in rows
        for (amp, setting), cell in row.cells.items()
        if cell.raises and cell.agrees
    ]
    if raising:
        lines += ["", "Where the eager run raises, as ampgraph says too:", "", *raising]
    notes = cell_notes(rows)
    if notes:
        lines += ["", "Cells that differ (the first differing hook line):", "", *notes]
        why = [
            f"* `{r.name}`: {WHY[r.name]}"
            for r in rows
            if r.name in WHY and r.agreeing < len(r.cells)
        ]
        if why:
            lines += ["", "Why:", "", *why]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", choices=list(MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "families.md")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    import transformers  # imported before forking, and its version recorded

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    start = time.perf_counter()
    rows = run_all(args.model or list(MODELS), run_model, args.jobs, "families")
    for row in rows:  # a model that failed whole still names its family
        row.family = row.family or MODELS[row.name][0]
    text = markdown(rows, time.perf_counter() - start, versions)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0 if all_agree(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
