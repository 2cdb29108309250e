#!/usr/bin/env python
"""Vision models nobody here wrote, against two oracles, and write docs/vision-models.md.

Each model (torchvision and timm, built with ``weights=None`` on the meta device: no download)
is analysed in the seed's four settings x {bf16, fp16} autocast on CUDA, and every analysis is
compared with

* the dispatcher: ``ampgraph check``, node by node (the real CUDA autocast kernels on fake
  tensors), and
* the eager model: its own forward hooks on every leaf module, run on fake CUDA tensors with the
  real autocast kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`), line by line against
  ``ampgraph table``'s hook lines.

A node ampgraph cannot analyse here (a cuDNN kernel that needs a driver) is counted as such; a
model that cannot be captured at all is listed with its one-line reason.

    .venv/bin/python scripts/vision_matrix.py                       # -> docs/vision-models.md
    .venv/bin/python scripts/vision_matrix.py -m resnet18 --out /tmp/v.md
    .venv/bin/python scripts/vision_matrix.py --further        # -> docs/vision-models-further.md

Exit status 1 if any node or hook line disagrees.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import (  # noqa: E402
    AGREEMENT,
    AMP_DTYPES,
    SETTINGS,
    Row,
    all_agree,
    cell_notes,
    compare,
    produced_by,
    run_all,
)

ROOT = Path(__file__).resolve().parent.parent

#: name -> (library, constructor name, input shape). Images are 224 x 224 unless a model wants
#: otherwise; the batch is 1.
MODELS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "resnet50": ("torchvision", "resnet50", (1, 3, 224, 224)),
    "mobilenet_v3_small": ("torchvision", "mobilenet_v3_small", (1, 3, 224, 224)),
    "convnext_tiny": ("torchvision", "convnext_tiny", (1, 3, 224, 224)),
    "efficientnet_b0": ("torchvision", "efficientnet_b0", (1, 3, 224, 224)),
    "vit_b_16": ("torchvision", "vit_b_16", (1, 3, 224, 224)),
    "swin_t": ("torchvision", "swin_t", (1, 3, 224, 224)),
    "deeplabv3_mobilenet_v3_large": (
        "torchvision.segmentation", "deeplabv3_mobilenet_v3_large", (1, 3, 224, 224),
    ),
    "r3d_18": ("torchvision.video", "r3d_18", (1, 3, 8, 112, 112)),
    # Two frames in; its correlation lookup is cuDNN's grid sampler on CUDA.
    "raft_small": ("torchvision.optical_flow", "raft_small", (1, 3, 128, 128)),
    # A list of images in; batched NMS has outputs whose size depends on the data, and the
    # forward branches on it: traced along the path seeded random values take.
    "fasterrcnn_mobilenet_v3_large_320_fpn": (
        "torchvision.detection", "fasterrcnn_mobilenet_v3_large_320_fpn", (3, 320, 320),
    ),
    "fasterrcnn_resnet50_fpn": ("torchvision.detection", "fasterrcnn_resnet50_fpn", (3, 320, 320)),
    "timm/vit_small_patch16_224": ("timm", "vit_small_patch16_224", (1, 3, 224, 224)),
    "timm/convnext_atto": ("timm", "convnext_atto", (1, 3, 224, 224)),
    "timm/efficientnet_b0": ("timm", "efficientnet_b0", (1, 3, 224, 224)),
    "timm/resnet18d": ("timm", "resnet18d", (1, 3, 224, 224)),
}  # fmt: skip

#: Models tried once, as a new user would, after the fixes the matrix above drove: none was
#: looked at before its first run (``--further`` -> docs/vision-models-further.md).
FURTHER: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "googlenet": ("torchvision", "googlenet", (1, 3, 224, 224)),
    "inception_v3": ("torchvision", "inception_v3", (1, 3, 299, 299)),
    "densenet121": ("torchvision", "densenet121", (1, 3, 224, 224)),
    "squeezenet1_1": ("torchvision", "squeezenet1_1", (1, 3, 224, 224)),
    "shufflenet_v2_x1_0": ("torchvision", "shufflenet_v2_x1_0", (1, 3, 224, 224)),
    "mnasnet0_5": ("torchvision", "mnasnet0_5", (1, 3, 224, 224)),
    "regnet_y_400mf": ("torchvision", "regnet_y_400mf", (1, 3, 224, 224)),
    "maxvit_t": ("torchvision", "maxvit_t", (1, 3, 224, 224)),
    "swin_v2_t": ("torchvision", "swin_v2_t", (1, 3, 256, 256)),
    "lraspp_mobilenet_v3_large": (
        "torchvision.segmentation", "lraspp_mobilenet_v3_large", (1, 3, 224, 224),
    ),
    "fcn_resnet50": ("torchvision.segmentation", "fcn_resnet50", (1, 3, 224, 224)),
    "s3d": ("torchvision.video", "s3d", (1, 3, 16, 224, 224)),
    "timm/deit_tiny_patch16_224": ("timm", "deit_tiny_patch16_224", (1, 3, 224, 224)),
    "timm/mixer_s16_224": ("timm", "mixer_s16_224", (1, 3, 224, 224)),
    "timm/levit_128s": ("timm", "levit_128s", (1, 3, 224, 224)),
    "timm/poolformer_s12": ("timm", "poolformer_s12", (1, 3, 224, 224)),
    "timm/mobilevit_xxs": ("timm", "mobilevit_xxs", (1, 3, 256, 256)),
    "timm/regnety_002": ("timm", "regnety_002", (1, 3, 224, 224)),
    "timm/efficientformer_l1": ("timm", "efficientformer_l1", (1, 3, 224, 224)),
    "timm/eva02_tiny_patch14_224": ("timm", "eva02_tiny_patch14_224", (1, 3, 224, 224)),
    "timm/cait_xxs24_224": ("timm", "cait_xxs24_224", (1, 3, 224, 224)),
    "timm/xcit_nano_12_p16_224": ("timm", "xcit_nano_12_p16_224", (1, 3, 224, 224)),
    "timm/ghostnet_100": ("timm", "ghostnet_100", (1, 3, 224, 224)),
    "timm/dla34": ("timm", "dla34", (1, 3, 224, 224)),
    "timm/nfnet_l0": ("timm", "nfnet_l0", (1, 3, 224, 224)),
    "timm/fastvit_t8": ("timm", "fastvit_t8", (1, 3, 256, 256)),
    "timm/mobileone_s0": ("timm", "mobileone_s0", (1, 3, 224, 224)),
    "timm/edgenext_xx_small": ("timm", "edgenext_xx_small", (1, 3, 256, 256)),
    "timm/pvt_v2_b0": ("timm", "pvt_v2_b0", (1, 3, 224, 224)),
    "timm/hiera_tiny_224": ("timm", "hiera_tiny_224", (1, 3, 224, 224)),
    "timm/efficientvit_b0": ("timm", "efficientvit_b0", (1, 3, 224, 224)),
    "timm/lambda_resnet26t": ("timm", "lambda_resnet26t", (1, 3, 256, 256)),
}  # fmt: skip
#: Built on the CPU (small, random weights): their constructors copy data, which meta tensors
#: cannot (torchvision's RegNet), so ``torch.device("meta")`` fails before ampgraph is called.
BUILT_ON_CPU = {"regnet_y_400mf"}
ALL_MODELS = {**MODELS, **FURTHER}


def build(name: str) -> tuple[object, tuple[int, ...]]:
    """The model on the meta device, in eval mode, and its input shape."""
    import torch

    library, constructor, shape = ALL_MODELS[name]
    with torch.device("cpu" if name in BUILT_ON_CPU else "meta"):
        if library == "timm":
            import timm

            model = timm.create_model(constructor, pretrained=False)
        else:
            import importlib

            module = importlib.import_module(library.replace("torchvision", "torchvision.models"))
            wants_backbone = library in ("torchvision.segmentation", "torchvision.detection")
            extra = {"weights_backbone": None} if wants_backbone else {}
            model = getattr(module, constructor)(weights=None, **extra)
    return model.eval(), shape


def run_model(name: str) -> Row:
    """Build ``name`` on the meta device and compare it in the four settings x two dtypes."""
    import torch

    from ampgraph.model.build import ModelInputs

    torch.set_num_threads(1)
    start = time.perf_counter()
    model, shape = build(name)
    row = Row(name, params=f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M")
    image = torch.randn(shape, device="meta")
    library = ALL_MODELS[name][0]
    args = {
        "torchvision.optical_flow": (image, image.clone()),
        "torchvision.detection": ([image],),
    }.get(library, (image,))
    inputs = ModelInputs(name, model, args)
    for amp in AMP_DTYPES:
        for setting_name in SETTINGS:
            # A detector's eager run takes the path its capture took on data (sizes only).
            row.cells[(amp, setting_name)] = compare(inputs, setting_name, amp)
    row.seconds = time.perf_counter() - start
    return row


def markdown(
    rows: list[Row], seconds: float, versions: dict[str, str], further: bool = False
) -> str:
    title = (
        "# Further vision models, each tried once"
        if further
        else "# Vision models against the dispatcher and the eager model's hooks"
    )
    lines = [
        title,
        "",
        *(
            [
                (
                    "The same comparison as [the vision matrix](vision-models.md), on 32 more "
                    "torchvision and timm models, none of which was looked at before its first run "
                    "here: what a new user meets. `regnet_y_400mf` is built on the CPU (its "
                    "constructor copies data, which the meta device cannot)."
                ),
                "",
            ]
            if further
            else []
        ),
        (
            "Models nobody here wrote (torchvision and timm, `weights=None`, built on the meta "
            "device), each analysed in the seed's four settings (fp32, half, amp-half, amp-fp32) "
            "with bf16 and with fp16 CUDA autocast: 8 analyses per model. *nodes* is the largest "
            "graph, *compared* the node checks against the dispatcher summed over the 8, "
            "*disagreements* those that differ. *not analysed* counts nodes that need a GPU "
            "driver even on fake tensors. " + AGREEMENT
            + (
                ""
                if further
                else " The detectors branch on sizes that depend on data (after NMS): each is "
                "traced along the path seeded random values take (`capture.data_dependent` lists "
                "the branches; their other sides are not analysed), and the eager run is given "
                "the same sizes so that it takes that path too."
            )
        ),
        "",
        produced_by("scripts/vision_matrix.py", versions, seconds),
        "",
        "| model | params | nodes | compared | disagreements | hook lines | not analysed | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = list(row.cells.values())
        if all(c.failure for c in cells):  # not captured in any setting: the notes say why
            lines.append(f"| `{row.name}` | {row.params} | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| `{row.name}` | {row.params} | {max(c.nodes for c in cells):,} "
            f"| {row.count('compared'):,} | {row.count('disagreements')} "
            f"| {row.count('hooks_agree'):,}/{row.count('hooks'):,} "
            f"| {row.count('not_analysed')} | {row.seconds:.0f} s |"
        )
    notes = cell_notes(rows)
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", choices=sorted(ALL_MODELS))
    parser.add_argument(
        "--further",
        action="store_true",
        help="the models tried once (docs/vision-models-further.md)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    names = args.model or list(FURTHER if args.further else MODELS)
    page = "vision-models-further.md" if args.further else "vision-models.md"
    out = args.out or ROOT / "docs" / page

    import timm  # noqa: F401 - imported before forking, and its version recorded
    import torch
    import torchvision

    versions = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": sys.modules["timm"].__version__,
    }
    start = time.perf_counter()
    rows = run_all(names, run_model, args.jobs, "vision")
    seconds = time.perf_counter() - start
    text = markdown(rows, seconds, versions, further=args.further)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0 if all_agree(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
