"""The zoo's page (docs/zoo.md) from its JSON lines, and the suite's slice data (issue 42).

``scripts/zoo.py --page`` and ``--export-slice`` call these; the results file is the record of
the run (one JSON object per model type, the last one for a type wins, so a rerun of some types
appended to the file replaces their lines).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import ROOT, classify, config_and_inputs, model_types, status  # noqa: E402
from zoo_repair import REPAIRS  # noqa: E402

def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every type's last record in ``results``, by type."""
    records: dict[str, dict[str, Any]] = {}
    for line in results.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            records[rec["type"]] = rec
    return records


def mechanism(rec: dict[str, Any]) -> str:
    """Why a type is not exact, as one phrase and the evidence's first line.

    >>> mechanism({"build_error": "KeyError: 'full_attention'", "builds": False})
    "KeyError: 'full_attention'"
    >>> mechanism({"build_error": "timed out after 300 s", "builds": False})
    'timed out: timed out after 300 s'
    """
    if not rec.get("builds"):
        text = rec.get("build_error", "")
        return text if classify(text) == "other" else f"{classify(text)}: {text}"
    for combo, cells in rec["cells"].items():
        for name, cell in cells.items():
            if cell.get("failure") and cell.get("plain_run"):
                left = rec.get("repair", {})
                tried = (f"; repaired ({left['what']}), it still raises: "
                         f"{left['plain_run_after']}" if left.get("plain_run_after") else "")
                return (f"the model raises in a plain fp32 run too (the tester's config): "
                        f"{cell['plain_run']}{tried}")
            if cell.get("failure"):
                return f"{classify(cell['failure'])} ({name}, {combo}): {cell['failure']}"
            if cell.get("raises") and not cell.get("agrees"):
                return (f"{classify(cell['raises'])}: the real run raises where the capture "
                        f"does not ({name}, {combo}): {cell['raises']}")  # fmt: skip
            if not cell.get("agrees", cell.get("ok")):
                why = cell.get("first_difference") or cell.get("first") or "no line compared"
                return f"{classify(why)} ({name}, {combo}): {why}"
    return "exact"


def _cell(text: str, limit: int = 300) -> str:
    """A table cell of ``text``: one line, at most ``limit`` characters, a path into the run's
    Python installation from its package on (the page is read on other machines).

    >>> _cell("in <module 'm' from '/home/u/.venv/lib/python3.11/site-packages/m/x.py'>")
    "in <module 'm' from 'm/x.py'>"
    """
    text = re.sub(r"/\S*?/(?:site|dist)-packages/", "", " ".join(text.split()))
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def _counts(records: dict[str, dict[str, Any]], testers: bool = True) -> list[str]:
    """The table of counts; ``testers``: split the builds that failed by tester (transformers'
    types), else one row (the libraries beyond, built by ``zoo_beyond``, have no testers)."""
    tried = [r for r in records.values() if not r.get("no_tester")]
    counts = Counter(status(r) for r in tried)
    generic = counts["does not build (generic tester)"]
    died = counts["does not build"] + generic + counts["timed out"] + counts["crashed"]
    by_tester = [
        f"| do not build from transformers' tester (own or causal LM) | "
        f"{counts['does not build']} |",
        f"| do not build from the generic tester | {generic} |",
        f"| raise in a plain fp32 run too (the tester's config, not a capture) | "
        f"{counts['raises in a plain run']} |",
        f"| build from a repaired tester (their plain run raised, the repair's passes) | "
        f"{sum(repaired(r) for r in tried)} |",
    ] if testers else [
        f"| do not build | {counts['does not build'] + generic} |",
        f"| raise in a plain fp32 run too (not a capture) | {counts['raises in a plain run']} |",
    ]  # fmt: skip
    return [
        "| | types |",
        "| --- | --- |",
        f"| run | {len(tried)} |",
        f"| build | {len(tried) - died} |",
        *by_tester,
        f"| analysable | {counts['exact'] + counts['not exact']} |",
        f"| exact | {counts['exact']} |",
        f"| timed out | {counts['timed out']} |",
        f"| the job's process died | {counts['crashed']} |",
    ]


def _misses(records: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| type | tester | status | mechanism |", "| --- | --- | --- | --- |"]
    for name, rec in sorted(records.items()):
        if rec.get("no_tester") or status(rec) == "exact":
            continue
        mech = mechanism(rec)
        # A row run with the capture fixes shows their cut: one node "not analysed", with why.
        cut = "not analysed:" in mech
        fix = " (the capture fix's cut: that node not analysed, the rest is)" if cut else ""
        rerun = rec.get("rerun")
        if rerun:  # True: the capture fixes' rerun; a string: that rerun's reason
            fix += f" (rerun: {rerun})" if isinstance(rerun, str) else (
                " (rerun after the capture fixes)")
        tester = "generic tester" if _source(rec) == "the generic tester" else rec.get("tester")
        if repaired(rec):  # the repair is the row's, not cut off with a long tester's name
            fix += f" (tester repaired: {rec['repair']['what']})"
            tester = (tester or "-").split(", repaired: ")[0]
        lines.append(f"| {name} | {_cell(tester or '-', 60)} | {status(rec)} | "
                     f"{_cell(mech)}{fix} |")  # fmt: skip
    exact = sorted(n for n, r in records.items() if not r.get("no_tester") and status(r) == "exact")
    if len(lines) == 2:  # every one exact: no table of misses, only its header
        lines = ["Every one is exact."]
    return [*lines, "", f"Exact ({len(exact)}): {', '.join(exact) or 'none'}.", ""]


def repaired(rec: dict[str, Any]) -> bool:
    """Whether ``rec``'s model was built from a repaired tester config or inputs (``zoo_repair``:
    its plain run raised, the repair made it pass).

    >>> repaired({"repair": {"what": "x", "plain_run_before": "E"}}), repaired({})
    (True, False)
    >>> repaired({"repair": {"what": "x", "plain_run_before": "E", "plain_run_after": "F"}})
    False
    """
    repair = rec.get("repair") or {}
    return bool(repair) and not repair.get("plain_run_after")


def _repairs(records: dict[str, dict[str, Any]]) -> list[str]:
    """The table of the types whose tester was repaired (or whose repair left the plain run
    raising): what the plain run raised, what was repaired, and the status after."""
    rows = [(n, r) for n, r in sorted(records.items()) if r.get("repair")]
    if not rows:
        return ["No tester was repaired.", ""]
    lines = ["| type | the plain run raised | repaired | status |", "| --- | --- | --- | --- |"]
    for name, rec in rows:
        repair = rec["repair"]
        after = repair.get("plain_run_after")
        what = repair["what"] + (f"; then still raises: {after}" if after else "")
        lines.append(f"| {name} | {_cell(repair['plain_run_before'], 120)} | {_cell(what)} | "
                     f"{status(rec)} |")  # fmt: skip
    return [*lines, ""]


def _source(rec: dict[str, Any]) -> str:
    """A record's tester, as one of the three sources."""
    tester = rec.get("tester", "")
    if not tester:  # a job that died before it said (last wave's records)
        return "an unrecorded tester"
    if tester.startswith("generic"):
        return "the generic tester"
    return "the causal LM tester" if "causal_lm_tester" in tester else "its own tester"


def _sources(sources: Counter[str]) -> str:
    return ", ".join(f"{n} from {s}" for s, n in sources.most_common()) or "none yet"


def _slice_names() -> list[str]:
    return sorted(json.loads((ROOT / "tests" / "data" / "zoo_slice.json").read_text()))


def page(records: dict[str, dict[str, Any]]) -> str:
    """docs/zoo.md's Markdown: the transformers zoo, then diffusers, peft and timm."""
    hf = {n: r for n, r in records.items() if "/" not in n}
    beyond = {n: r for n, r in records.items() if "/" in n}
    combos = sorted({c for r in records.values() for c in r.get("cells", {})})
    total = len(set(model_types()) | set(hf))
    reached = {n for n, r in hf.items() if not r.get("no_tester")}
    sources = Counter(_source(r) for r in hf.values() if not r.get("no_tester"))
    return "\n".join([
        "# The transformers zoo, as a number",
        "",
        "Every model type of the installed transformers that has a base model class, built from "
        "its own tests' tiny config and inputs (`scripts/zoo.py`, issue 42), analysed by ampgraph: "
        "`check` (the CUDA policy on the dispatcher, and the eager model's forward hooks on fake "
        "CUDA tensors running the real autocast kernels) and `verify --device cpu` (the CPU "
        "policy, "
        f"real CPU kernels), in {', '.join(f'`{c}`' for c in combos) or 'no combination yet'}.",
        "",
        f"**{total} model types** have a base model class; "
        + (f"{len(reached)} were run and {total - len(reached)} were not reached before the run "
           "was stopped." if len(reached) < total else "every one was run.")
        + f" Where each type's tiny config came from: {_sources(sources)} (see *How it was "
        "made*).",
        "",
        *_counts(hf),
        "",
        "A type is *analysable* when every cell was captured and verified (no failure), *exact* "
        "when every node agrees with the dispatcher, every hook line with the eager run's and "
        "every CPU node, module and cast with the real CPU run's.",
        "",
        "The other combinations, on a sample: the suite's slice (`tests/test_zoo_slice.py`, the "
        f"types of `tests/data/zoo_slice.json`: {', '.join(_slice_names())}) runs every one of "
        "the four settings x bf16/fp16 against the dispatcher and the eager hooks, and "
        "`verify --device cpu` in `amp-fp32 bf16`, and requires each to be exact; "
        "`scripts/zoo.py --all-combos` runs them all on the whole zoo. On a GPU, "
        "`scripts/gpu_survey.py --zoo` verifies the slice's types against the real CUDA kernels "
        "(`--zoo TYPE,...`: any model type, one beyond the slice from the generic tester).",
        "",
        "## Every type that is not exact, and why",
        "",
        "Each row is its run's finding, from the code that run ran (the runs are listed under "
        "*How it was made*); a rerun row says why it was rerun. The *tester* column says where "
        "the type's config came from: its own test file, transformers' causal LM tester, or the "
        "zoo's generic tester; a type the generic tester cannot build is *does not build (generic "
        "tester)*, with the error's class.",
        "",
        *_misses(hf),
        "## Testers repaired where the plain run raised",
        "",
        "A type whose model raises in a plain fp32 run (no autocast, no capture) with a "
        "mechanism `scripts/zoo_repair.py` knows has its tester's config or inputs repaired the "
        "way transformers' own tests would make them run, and is run again from them; the "
        "repair is kept only where the plain run then passes, and the row is the repaired "
        "model's (each repair, and why, in the module's docstring). The mechanisms it knows: "
        f"{'; '.join(m for _, m, _ in REPAIRS)}.",
        "",
        *_repairs(hf),
        "## Beyond transformers: diffusers, peft, timm, torch's attention corners",
        "",
        "The same rules (`scripts/zoo_beyond.py`, run by `scripts/zoo.py --beyond`): each model "
        "built small, random weights, both oracles in the same combinations. The `corners/` "
        "entries (`scripts/zoo_corners.py`) are small modules calling torch's attention and "
        "checkpoint entry points as models do: `scaled_dot_product_attention` with a float or "
        "boolean mask, `is_causal`, `enable_gqa`; `nn.MultiheadAttention`, "
        "`nn.TransformerEncoder`; `checkpoint(use_reentrant=False)` inside the forward.",
        "",
        *_counts(beyond, testers=False),
        "",
        *_misses(beyond),
    ])


def write_page(results: Path, out: Path, note: str = "") -> None:
    """Write ``out`` from ``results`` (``note``: what to say of this run's machine)."""
    records = load(results)
    hf = [r for r in records.values() if "/" not in r["type"] and "tester" in r]
    this_run = f"**This run.** Testers: {sources_of_testers(hf)}. {own_note(note)}".strip()
    out.write_text(page(records) + _footer(results) + "\n" + this_run + "\n")


#: A tester the zoo tried before the one a record names, and how it failed (zoo.config_and_inputs).
FELL_THROUGH = re.compile(
    r"(its own tester|the causal LM tester)'s config (being full size|failing: \w+)"
)


def sources_of_testers(hf: list[dict[str, Any]]) -> str:
    """How many records each source gave, and why types fell through to the generic tester.

    >>> sources_of_testers([{"tester": "tests/models/a/test_modeling_a.py"}, {"tester":
    ...     "generic tester (...), its own tester's config failing: ImportError: no name 'x'"}])
    "1 from its own tester; 1 from the generic tester (after its own tester's config failing: \
ImportError, 1)"
    """
    sources = Counter(_source(r) for r in hf)
    why = Counter(
        f"{who}'s config {how}" for r in hf for who, how in FELL_THROUGH.findall(r["tester"])
    )
    after = "; ".join(f"{w}, {n}" for w, n in why.most_common())
    return "; ".join(
        f"{n} from {s}" + (f" (after {after})" if s == "the generic tester" and after else "")
        for s, n in sources.most_common()
    ) or "none"


#: The sentence :func:`write_page` writes itself (backticked testers may hold dots).
TESTERS = re.compile(r"\*\*This run\.\*\* Testers: (?:[^`]|`[^`]*`)*?\.(?:\s+|$)")


def own_note(note: str) -> str:
    """``note`` without the testers sentence the page writes itself: a note carried over from
    the last page's paragraph repeated it.

    >>> own_note("**This run.** Testers: 2 from `a.py`; 1 from `b`. Run on one machine.")
    'Run on one machine.'
    >>> own_note("Run on one machine.")
    'Run on one machine.'
    """
    return TESTERS.sub("", note).strip()


def _footer(results: Path) -> str:
    return "\n".join([
        "",
        "## How it was made, and how to run it on more machines",
        "",
        "Each model type's tester is its own where it can be: the tester class of "
        "`tests/models/<module>/test_modeling_<module>.py` in a transformers checkout (the "
        "module as transformers names the model's package: `gemma3n_text` is tested in "
        "`gemma3n/`), the one named after the base model class, else the one whose config is "
        "the type's, given a dummy `unittest.TestCase` as its parent. Where the file is "
        "missing, or its tester fails or gives a config the installed model rejects (a test "
        "file of another release), a causal LM type gets transformers' generic "
        "`CausalLMModelTester` (`tests/causal_lm_tester.py`) with its config and base model "
        "classes, and any type the zoo's generic tester after that; each record names the "
        "tester it got and how the ones before failed. The suite's shared modules load "
        "tolerantly (a name one lacks is an empty class; `test_pipeline_mixin`, which reads a "
        "whole checkout's files, is an empty module), and the suite helpers older test files "
        "import and transformers 5 removed are given back (`cached_property`, "
        "`require_read_token`, `require_torch_sdpa`, `is_torch_sdpa_available`, "
        "`is_pt_tf_cross_test`, `is_torch_greater_or_equal_than_1_10`, the checkpoint lists "
        "`*_PRETRAINED_MODEL_ARCHIVE_LIST` as empty lists, and 4.x's composite-config factories "
        "`from_text_vision_configs` / `from_text_audio_configs`, which build the config from its "
        "parts' dicts); no model class or config is supplied. The base model "
        "(`AutoModel.from_config`, eager attention; a type with two base models, funnel, the "
        "first; the type's base class itself where `AutoModel` does not resolve the config) is "
        "called with the tester's `prepare_config_and_inputs_for_common()` inputs, "
        "labels dropped.",
        "",
        "Every other type gets the zoo's generic tester (`scripts/zoo_generic.py`): its config "
        "class with the defaults shrunk the way the testers shrink them (hidden size 32, 2 "
        "layers, 4 heads, intermediate 37, vocabulary 99, an image a few patches wide, few "
        "experts, stage widths and depths cut down; nested text, vision and audio sub-configs "
        "too, special token ids remapped below the vocabulary), its fields kept consistent "
        "(a width under another name, such as `codebook_dim` or `out_hidden_size`, follows "
        "the width it defaults to; as many key/value heads as heads stays so; per-layer lists "
        "and dicts follow the depth, one layer of each kind kept; a multimodal rotary section "
        "sums to the shrunk head's; an expert's width has 16-byte strides), and inputs from "
        "the base model's forward signature and `main_input_name` (`input_ids`, "
        "`pixel_values`, `input_values`, `input_features`; `attention_mask`, "
        "`decoder_input_ids` for encoder-decoders; the other modality beside it for a dual "
        "encoder; a packed-patch vision encoder's patches and `grid_thw`; a required mask of "
        "the main input, `bbox`, `query_embeds`; any other required argument from its name: "
        "a second text's ids, a padding of the main input, flat patches with their positions "
        "or grid shape; a float input of the model's own layout, such as `hidden_states` or "
        "`latents`, as its first linear or convolution reads it; a video of the config's "
        "frames; image placeholder tokens where a query-token config has none; sizes the "
        "defaults tie together kept tied, such as Mamba-2's heads x head size = width x "
        "expand; a base model of a sub-config, such as MusicGen's decoder, from it). "
        "A causal LM type whose "
        "`CausalLMModelTester` config is full size (the model's own width or depth, which a "
        "config naming them otherwise keeps) or does not build gets it too. One plain fp32 "
        "forward proves the pair; a type it cannot build is counted as *does not build (generic "
        "tester)* with the error, not dropped.",
        "",
        "```bash",
        "pip install 'ampgraph[zoo]'                 # ray and the libraries it builds",
        "git clone https://github.com/huggingface/transformers",
        "V=$(python -c 'import transformers; print(transformers.__version__)')",
        "git -C transformers checkout v$V",
        "T=transformers/tests",
        "python scripts/zoo.py --tests-dir $T --results zoo.jsonl                # one combination",
        "python scripts/zoo.py --tests-dir $T --all-combos --results zoo.jsonl   # all eight",
        "python scripts/zoo.py --tests-dir $T --beyond --results zoo.jsonl       # diffusers...",
        "python scripts/zoo.py --page --results zoo.jsonl --out docs/zoo.md",
        "```",
        "",
        "Every model type is one Ray task (`ray.remote`, one CPU each) that runs the type in its "
        "own process, bounded by `--timeout` seconds and by a heap of `--memory-gb` (default 6, "
        "also the memory the task reserves, so Ray places no more tasks than fit); a type that "
        "runs past the time is recorded as timed out. A local cluster gets `--workers` CPUs "
        "(default 1) and an 80 MB object store (the records are small). On more machines: "
        "`ray start --head` on one, `ray start --address=HEAD:6379` "
        "on each of the others (each with ampgraph, its extras and the transformers checkout at "
        "the same path), then pass `--address HEAD:6379`. Results are appended as JSON lines as "
        "each task lands; `--skip-done` resumes a stopped run, and the page is written from "
        f"whatever finished: this page from `{results.name}` beside it.",
        "",
    ])


def _tensor(value: Any) -> dict[str, Any]:
    """A tensor as JSON: integer values kept (ids and masks steer a forward), floating ones as
    their shape and dtype only (the suite draws them from seed 0: only the dtype flows)."""
    if not hasattr(value, "shape"):  # a plain keyword (the generic tester's use_cache=False)
        return {"value": value}
    out = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if not value.is_floating_point():
        out["values"] = value.flatten().tolist()
    return out


def export_slice(names: list[str], tests_dir: Path, out: Path) -> None:
    """Each of ``names``' tiny config and inputs as JSON (the suite's slice, no transformers
    checkout needed to rebuild them)."""
    data = {}
    for name in names:
        config, inputs, source = config_and_inputs(name, tests_dir)
        data[name] = {
            "tester": source,
            "config": config.to_diff_dict(),
            "inputs": {k: _tensor(v) for k, v in inputs.items()},
        }
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
