"""How diagrams look, as data: dtype colours, policy styles, themes.

Everything a reader decodes by colour is also written in words (edge labels, a policy line in each
box, the legend), so the diagrams survive greyscale printing and colour-blind readers. The dtype
colours come from the Okabe–Ito palette, which stays distinguishable under the common forms of
colour blindness; vermillion is kept for the one thing that must catch the eye, promotions.

>>> dtype_colour("bfloat16", "light")
'#E69F00'
>>> THEMES["dark"].background
'#0d1117'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A diagram that takes longer than this to lay out (with ``dot``) is unreadable anyway.
DOT_TIMEOUT_S: Final = 120

#: Value-range headroom bands: (upper bound in decades below the dtype's largest finite number,
#: name, border colour, fill colour), least headroom first (:mod:`ampgraph.render.range_overlay`).
HEADROOM_BANDS: Final = (
    (0.0, "overflow", "#CF222E", "#FFD8D3"),
    (1.0, "< 1 decade", "#BC4C00", "#FFE2C2"),
    (2.0, "< 2 decades", "#9A6700", "#FFF3B0"),
    (float("inf"), ">= 2 decades", "#1A7F37", "#D5F5DC"),
)

#: Okabe–Ito colours by name, for the tables below.
OKABE_ITO: Final[dict[str, str]] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

#: Dtype "families" a diagram distinguishes; every dtype name maps to one of them.
DTYPE_FAMILY: Final[dict[str, str]] = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float64": "fp64",
    "int64": "int",
    "int32": "int",
    "int16": "int",
    "int8": "int",
    "uint8": "int",
    "bool": "int",
}

#: Order in which the legend lists dtype families.
FAMILY_ORDER: Final = ("fp32", "bf16", "fp16", "fp64", "int", "other")

#: What the legend calls each family.
FAMILY_LABEL: Final[dict[str, str]] = {
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp64": "fp64",
    "int": "integer / bool",
    "other": "other / unknown",
}


@dataclass(frozen=True)
class EdgeStyle:
    """How an edge carrying one dtype family is drawn."""

    colour: str
    penwidth: float
    style: str  # Graphviz edge style: solid, dashed, dotted


@dataclass(frozen=True)
class NodeStyle:
    """How a box in one policy category is drawn."""

    fill: str
    border: str
    penwidth: float = 1.2
    style: str = "filled,rounded"


@dataclass(frozen=True)
class Theme:
    """Everything that changes between a light and a dark documentation page."""

    name: str
    background: str
    text: str
    muted: str  # secondary text: class names, cast lines, cluster labels
    edges: dict[str, EdgeStyle]
    policies: dict[str, NodeStyle]
    promotion: NodeStyle
    disagreement: NodeStyle
    io: NodeStyle  # model inputs and outputs
    region_fill: str
    region_border: str
    fold_fill: str
    fold_border: str


# Light pages: saturated Okabe–Ito lines on white, pale fills that keep black text readable.
_LIGHT_EDGES: Final = {
    "fp32": EdgeStyle(OKABE_ITO["blue"], 2.0, "solid"),
    "bf16": EdgeStyle(OKABE_ITO["orange"], 2.4, "solid"),
    "fp16": EdgeStyle(OKABE_ITO["reddish_purple"], 2.4, "solid"),
    "fp64": EdgeStyle(OKABE_ITO["bluish_green"], 2.0, "solid"),
    # Integer/bool values (token ids, masks) carry no precision story: thin, grey, dashed.
    "int": EdgeStyle("#7F7F7F", 1.2, "dashed"),
    "other": EdgeStyle("#7F7F7F", 1.2, "dotted"),
}

# Dark pages: the same hues, with blue lifted to sky blue so it stays visible on near-black.
_DARK_EDGES: Final = {
    "fp32": EdgeStyle(OKABE_ITO["sky_blue"], 2.0, "solid"),
    "bf16": EdgeStyle(OKABE_ITO["orange"], 2.4, "solid"),
    "fp16": EdgeStyle(OKABE_ITO["reddish_purple"], 2.4, "solid"),
    "fp64": EdgeStyle(OKABE_ITO["bluish_green"], 2.0, "solid"),
    "int": EdgeStyle("#9DA5AE", 1.2, "dashed"),
    "other": EdgeStyle("#9DA5AE", 1.2, "dotted"),
}

# Policy fills echo the dtype the policy produces (warm = 16-bit, cool = fp32) but stay pale, so
# the saturated edge colours remain the dtype signal.
_LIGHT_POLICIES: Final = {
    "lower_precision_fp": NodeStyle("#FCEBC5", "#B07A00"),
    "fp32": NodeStyle("#D6E8F5", "#0072B2"),
    "promote": NodeStyle("#D5EFE4", "#007A58"),
    "banned": NodeStyle("#EEEEEE", "#555555", style="filled,rounded,dashed"),
    "none": NodeStyle("#FFFFFF", "#8C8C8C"),
}
_DARK_POLICIES: Final = {
    "lower_precision_fp": NodeStyle("#4A3B12", "#E69F00"),
    "fp32": NodeStyle("#15344D", "#56B4E9"),
    "promote": NodeStyle("#123D30", "#33B88F"),
    "banned": NodeStyle("#2A2A2A", "#9DA5AE", style="filled,rounded,dashed"),
    "none": NodeStyle("#161B22", "#6E7681"),
}

#: Policy categories in the order the legend lists them (the four an author cares about).
POLICY_ORDER: Final = ("lower_precision_fp", "fp32", "promote", "none")

#: The five CastPolicy categories collapse to four styles: both fp32 variants look like fp32.
POLICY_STYLE_KEY: Final[dict[str | None, str]] = {
    "lower_precision_fp": "lower_precision_fp",
    "fp32": "fp32",
    "fp32_set_opt_dtype": "fp32",
    "fp32_append_dtype": "fp32",
    "promote": "promote",
    "banned": "banned",
    "fp16": "lower_precision_fp",
    "fp32_output_as_input": "fp32",
    # register_autocast casts to the dtype it was given, in practice a 16-bit one.
    "cast_inputs": "lower_precision_fp",
    # An unknown kernel is drawn as "none": the label says what is not known.
    "opaque": "none",
    None: "none",
}

THEMES: Final[dict[str, Theme]] = {
    "light": Theme(
        name="light",
        background="#FFFFFF",
        text="#1F2328",
        muted="#57606A",
        edges=_LIGHT_EDGES,
        policies=_LIGHT_POLICIES,
        promotion=NodeStyle("#FBD9C4", OKABE_ITO["vermillion"], 4.0, "filled,rounded,bold"),
        disagreement=NodeStyle("#FFFFFF", "#CF222E", 3.0, "filled,rounded,dashed"),
        io=NodeStyle("#F2F2F2", "#6E7781"),
        region_fill="#F3F0F7",
        region_border="#8250DF",
        fold_fill="#F6F8FA",
        fold_border="#8C959F",
    ),
    "dark": Theme(
        name="dark",
        background="#0d1117",
        text="#E6EDF3",
        muted="#9DA5AE",
        edges=_DARK_EDGES,
        policies=_DARK_POLICIES,
        promotion=NodeStyle("#5A2A10", "#FF7A33", 4.0, "filled,rounded,bold"),
        disagreement=NodeStyle("#161B22", "#FF7B72", 3.0, "filled,rounded,dashed"),
        io=NodeStyle("#21262D", "#8B949E"),
        region_fill="#1C1830",
        region_border="#A371F7",
        fold_fill="#11161D",
        fold_border="#6E7681",
    ),
}

#: One font stack for every label: what browsers use for SVG, and (via fontconfig's
#: metric-compatible substitutes) what Graphviz measures text with when it lays the graph out.
FONT: Final = "Helvetica,Arial,sans-serif"
FONT_SIZE: Final = 11
SMALL_FONT_SIZE: Final = 9
TITLE_FONT_SIZE: Final = 18

#: Graph-wide Graphviz attributes shared by every diagram.
GRAPH_ATTRS: Final[dict[str, str]] = {
    "rankdir": "TB",
    "newrank": "true",
    "nodesep": "0.3",
    "ranksep": "0.32",
    "outputorder": "edgesfirst",
    "labelloc": "t",
    "labeljust": "c",
    "pad": "0.2",
    "margin": "0",
}

PROMOTION_MARK: Final = "⚠"
DISAGREEMENT_MARK: Final = "✗"
FOLD_MARK: Final = "×"
DIFFERS_MARK: Final = "≠"


def dtype_family(dtype: str | None) -> str:
    """The family a dtype is drawn as: ``"bfloat16"`` -> ``"bf16"``, ``"int64"`` -> ``"int"``.

    >>> dtype_family("bool"), dtype_family(None)
    ('int', 'other')
    """
    if dtype is None:
        return "other"
    return DTYPE_FAMILY.get(dtype, "other")


def dtype_colour(dtype: str | None, theme: str = "light") -> str:
    """The edge colour of a dtype in a theme."""
    return THEMES[theme].edges[dtype_family(dtype)].colour


def is_floating(dtype: str | None) -> bool:
    """Whether a dtype name is a floating-point one (the values autocast acts on).

    >>> is_floating("bfloat16"), is_floating("int64")
    (True, False)
    """
    return dtype is not None and dtype_family(dtype) in ("fp32", "bf16", "fp16", "fp64")
