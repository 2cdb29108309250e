"""Seed 002's fp32 wrapper: an RoI pooling op kept out of autocast, and the fp32 island it makes.

A detection head pools box-shaped regions (RoIs, in pixel coordinates) out of a backbone's
features. Seed 002 asks how to wrap an RoIPool module it cannot change so that autocast never
casts its inputs (above all the box coordinates) to 16 bits. The answer given there:

    with autocast(enabled=False):
        out = super().forward(x.float(), rois)

This example builds such a head around a pure-torch stand-in for ``torchvision.ops.roi_pool``
(:func:`roi_pool`: bilinear sampling written as two matmuls, so autocast *would* run it in 16
bits, rounding the interpolation weights computed from the box coordinates), analyses it with
ampgraph in the ``amp-fp32`` setting on CUDA (no GPU needed), and prints

* the seed notebook's hook lines: the ``roi_pool`` module takes bf16 features and returns fp32;
* the ops of the fp32 island: autocast off, no casts, every output fp32;
* what the same head does without the wrapper: the RoI weights cast fp32 -> bf16 at each matmul;

then draws the dtype flow to ``examples/out/`` where Graphviz is installed.

    python examples/roipool_fp32_island.py                # table, island, and the diagram
    ampgraph table --module examples/roipool_fp32_island.py:build -s amp-fp32
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parent / "out"


def roi_pool(
    x: torch.Tensor, rois: torch.Tensor, output_size: int, spatial_scale: float
) -> torch.Tensor:
    """Pool each RoI of ``x`` (N, C, H, W) to (K, C, P, P) by bilinear sampling.

    ``rois`` is (K, 5): batch index, then x1, y1, x2, y2 in input pixels. The sampling weights are
    built from the box coordinates and applied as matmuls -- ops autocast runs in 16 bits, which is
    why seed 002 keeps this op in fp32.
    """
    _, _, height, width = x.shape
    steps = (torch.arange(output_size, dtype=rois.dtype, device=rois.device) + 0.5) / output_size
    boxes = rois[:, 1:] * spatial_scale
    ys = boxes[:, 1:2] + steps * (boxes[:, 3:4] - boxes[:, 1:2])  # (K, P) sample rows
    xs = boxes[:, 0:1] + steps * (boxes[:, 2:3] - boxes[:, 0:1])  # (K, P) sample columns
    grid_y = torch.arange(height, dtype=rois.dtype, device=rois.device)
    grid_x = torch.arange(width, dtype=rois.dtype, device=rois.device)
    # Triangle kernel: weight 1 - |distance| to each pixel centre, 0 beyond one pixel.
    weight_y = torch.relu(1 - (ys[:, :, None] - grid_y).abs())  # (K, P, H)
    weight_x = torch.relu(1 - (xs[:, :, None] - grid_x).abs())  # (K, P, W)
    feats = x.index_select(0, rois[:, 0].long())  # (K, C, H, W)
    rows = torch.matmul(weight_y[:, None], feats)  # (K, C, P, W)
    return torch.matmul(rows, weight_x[:, None].transpose(-1, -2))  # (K, C, P, P)


class RoIPool(nn.Module):
    """The module a detection library ships: it cannot be changed."""

    def __init__(self, output_size: int, spatial_scale: float) -> None:
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return roi_pool(x, rois, self.output_size, self.spatial_scale)


class Fp32RoIPool(RoIPool):
    """Seed 002's wrapper: autocast off inside, features made fp32, the RoIs never cast."""

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", enabled=False):
            out = super().forward(x.float(), rois)
        return out


class DetectionHead(nn.Module):
    """Backbone convs -> RoI pooling -> a two-layer box head with class and box outputs."""

    def __init__(self, fp32_wrapper: bool = True, num_classes: int = 5, pooled: int = 4) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        pool_class = Fp32RoIPool if fp32_wrapper else RoIPool
        self.roi_pool = pool_class(pooled, spatial_scale=0.5)  # the backbone halves the image
        self.fc6 = nn.Linear(32 * pooled * pooled, 64)
        self.cls_score = nn.Linear(64, num_classes)
        self.bbox_pred = nn.Linear(64, 4 * num_classes)

    def forward(self, images: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = self.backbone(images)
        pooled = self.roi_pool(features, rois)
        hidden = torch.relu(self.fc6(pooled.flatten(1)))
        return self.cls_score(hidden), self.bbox_pred(hidden)


def example_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """One 64x64 image and three boxes (batch index, x1, y1, x2, y2) in pixels."""
    images = torch.empty(1, 3, 64, 64, device="meta")
    rois = torch.tensor(
        [[0, 4.0, 4.0, 40.0, 36.0], [0, 10.5, 20.25, 60.0, 63.0], [0, 0, 0, 63, 63]]
    )
    return images, rois


def build() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Factory for ``ampgraph --module examples/roipool_fp32_island.py:build``."""
    with torch.device("meta"):
        model = DetectionHead(fp32_wrapper=True)
    return model.eval(), example_inputs()


def build_unwrapped() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The same head with the library's RoIPool as it is: autocast reaches inside."""
    with torch.device("meta"):
        model = DetectionHead(fp32_wrapper=False)
    return model.eval(), example_inputs()


def _short(dtype: str | None) -> str:
    from ampgraph.settings import short_dtype

    return short_dtype(dtype)


def main(argv: Sequence[str] | None = None) -> int:
    from ampgraph import Setting, analyze
    from ampgraph.formats.text import check_summary
    from ampgraph.report.printed import hook_lines

    parser = argparse.ArgumentParser(description="Seed 002's RoIPool fp32 island, analysed.")
    parser.add_argument("--out", type=Path, default=OUT, help="where the diagram goes")
    parser.add_argument("--no-render", action="store_true", help="skip the Graphviz diagram")
    opts = parser.parse_args(argv)

    setting = Setting.parse("amp-fp32")  # autocast cuda bf16, fp32 parameters
    model, inputs = build()
    report = analyze(model, setting, args=inputs)
    print(f"# DetectionHead with seed 002's fp32 RoIPool wrapper: {setting.title}")
    for line in hook_lines(report):
        print(line)

    (region,) = [n for n in report.nodes if n.kind == "region"]
    island = [n for n in report.nodes if n.region == region.name and n.kind == "op"]
    outputs = Counter(_short(d) for n in island for d in n.outputs if d is not None)
    print(f"\n# the fp32 island ({region.name}: {region.reason})")
    print(f"  {len(island)} ops, autocast on in {sum(n.autocast for n in island)}, "
          f"{sum(len(n.casts) for n in island)} casts; outputs: "
          + ", ".join(f"{d} x{k}" for d, k in sorted(outputs.items())))  # fmt: skip
    for rec in island:
        if rec.op == "aten.matmul.default":  # what autocast would run in 16 bits
            print(f"  {rec.name}: {rec.op} autocast=off casts=none out={_short(rec.out_dtype)}")

    unwrapped, unwrapped_inputs = build_unwrapped()
    bare = analyze(unwrapped, setting, args=unwrapped_inputs)
    print("\n# without the wrapper: autocast casts the RoI weights to 16 bits")
    for rec in bare.nodes:
        if rec.module == "roi_pool" and rec.casts:
            casts = ", ".join(
                f"{c.node} {_short(c.from_dtype)}->{_short(c.to_dtype)}" for c in rec.casts
            )
            print(f"  {rec.name}: {rec.op} casts {casts} out={_short(rec.out_dtype)}")
    print()
    print(check_summary(report))
    print(check_summary(bare))

    if not opts.no_render:
        try:
            from ampgraph.render import render_files

            paths = render_files([report], opts.out, formats=("svg",), view="modules")
        except ImportError:
            print("(ampgraph.render is not available: no diagram drawn)")
        except Exception as exc:  # noqa: BLE001 - no Graphviz: the table above is the result
            print(f"(no diagram: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
        else:
            for path in paths:
                print(f"diagram: {path}")
    failed = (report.check or {}).get("disagreements", 0) + (bare.check or {}).get(
        "disagreements", 0
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
