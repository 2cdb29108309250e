#!/usr/bin/env python
"""The transformers zoo as a number: every model type of the installed transformers, built from
its own tests' tiny config and inputs, analysed by ampgraph (issue 42): docs/zoo.md.

Each model type's ``*ModelTester`` (``tests/models/<type>/test_modeling_<type>.py`` of a
transformers checkout at the installed release, given by ``--tests-dir``) gives its tiny config
and one forward call's inputs (``prepare_config_and_inputs_for_common()``, the tester given a
dummy ``parent`` test case). A causal LM type whose test file is not in ``--tests-dir`` gets
transformers' generic ``CausalLMModelTester`` (``tests/causal_lm_tester.py``, the tester most
decoder models' test files subclass) with its config and base model classes; any other type gets
the zoo's generic tester (``zoo_generic``: the config class's defaults shrunk as the testers
shrink them, inputs from the forward signature), and each record says which. Each type is then,
in each combination asked (``--combo "amp-fp32 bf16"``, repeatable; ``--all-combos`` for the
four settings x bf16/fp16): ``check`` (ampgraph's analysis against the CUDA policy on the
dispatcher, and the eager model's forward hooks, ``matrix_harness.compare``) and
``verify --device cpu`` (the CPU policy, real CPU kernels, ``matrix_harness.verify_cpu``).
Where a check fails and the model raises in a plain fp32 run too, with a mechanism
``zoo_repair`` knows (an expert width off grouped_mm's 16-byte strides, a hybrid with no
attention layer...), the tester's config or inputs are repaired and the cells run again on the
repaired model, kept only where its plain run passes; the record says what was repaired.

Each type is one independent job on Ray (``pip install 'ampgraph[zoo]'``): a local cluster by
default, any cluster by ``--address`` (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others, then ``--address HEAD:6379``). A job runs the type in its
own process, bounded by ``--timeout`` seconds (a type that runs past it is recorded as timed
out) and ``--memory-gb`` of heap. Results are appended as JSON lines to ``--results`` as each
type finishes, so a page can
be written from whatever finished:

    .venv/bin/python scripts/zoo.py --tests-dir /path/to/transformers/tests --results zoo.jsonl
    .venv/bin/python scripts/zoo.py --tests-dir T -t llama -t bert --results /tmp/z.jsonl
    .venv/bin/python scripts/zoo.py --page --results docs/zoo-results.jsonl --out docs/zoo.md
    .venv/bin/python scripts/zoo.py --tests-dir T --export-slice tests/data/zoo_slice.json

``--one TYPE`` (what each job runs) prints one type's JSON record.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness beside this file
from matrix_harness import AMP_DTYPES, SETTINGS, compare, one_line, verify_cpu  # noqa: E402
from zoo_tests_import import import_tests, on_disk, use_tests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMBOS = ("amp-fp32 bf16",)
CAUSAL_LM_SOURCE = "tests/causal_lm_tester.py (CausalLMModelTester)"
#: Input keys a tester returns that are targets, not a forward call's inputs of the base model.
LABEL_KEYS = ("labels", "start_positions", "end_positions", "next_sentence_label", "mc_labels")


class _Parent(unittest.TestCase):
    """The dummy test case a tester is given as its ``parent``."""

    def runTest(self) -> None:  # noqa: N802 - unittest's name
        pass


def model_types() -> list[str]:
    """Every model type of the installed transformers that has a base model class."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(MODEL_MAPPING_NAMES)


def source_of(model_type: str, tests_dir: Path) -> str:
    """Where ``model_type``'s tiny config comes from: its own test file, transformers' generic
    causal LM tester, or the zoo's generic tester (``zoo_generic``).

    >>> source_of("albert", Path("/nonexistent"))
    'generic tester (config defaults shrunk, inputs from the forward signature)'
    >>> source_of("llama", Path("/nonexistent"))
    'tests/causal_lm_tester.py (CausalLMModelTester)'
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if on_disk(tests_dir, module_of_tests(model_type)):
        return module_of_tests(model_type).replace(".", "/") + ".py"
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return CAUSAL_LM_SOURCE
    return importlib.import_module("zoo_generic").SOURCE


def module_of_tests(model_type: str) -> str:
    """The module of ``model_type``'s tests in a transformers checkout: named, as transformers
    names its model package, by the module (``gemma3n_text`` is tested beside ``gemma3n``).

    >>> module_of_tests("gemma3n_text"), module_of_tests("blip-2")
    ('tests.models.gemma3n.test_modeling_gemma3n', 'tests.models.blip_2.test_modeling_blip_2')
    """
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    return f"tests.models.{module}.test_modeling_{module}"


def _tester_of(model_type: str, testers: list[type]) -> Any:
    """The tester of ``model_type``'s base model among a test file's testers (a composite model's
    file has one per part: ``AlignVisionModelTester``, ``AlignTextModelTester``,
    ``AlignModelTester``): the one named after the base class, else the first whose config is
    the type's; None where none is (a sub-model such as ``aria_text`` tested only inside its
    parent: the parent's tester would build the parent)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    for tester in testers:
        # transformers' causal LM tester takes its config class from the base model where a test
        # file names only the model classes (newer test files do).
        base_class = getattr(tester, "base_model_class", None)
        if getattr(tester, "config_class", False) is None and base_class is not None:
            tester.config_class = getattr(base_class, "config_class", None) or CONFIG_MAPPING[
                model_type
            ]
    names = {f"{b}Tester" for b in _names(MODEL_MAPPING_NAMES[model_type])}
    named = [t for t in testers if t.__name__ in names]
    for tester in named or testers:
        try:
            instance = tester(_Parent())
            config = instance.prepare_config_and_inputs_for_common()[0]
        except Exception:  # noqa: BLE001 - a part's tester that needs another's output
            if named:
                return tester(_Parent())  # its failure is the record's, in config_and_inputs
            continue
        if getattr(config, "model_type", None) == model_type:
            return instance  # the one checked: a second would build and prepare it all again
    return None


def _names(base: str | tuple[str, ...]) -> tuple[str, ...]:
    return (base,) if isinstance(base, str) else tuple(base)


def model_tester(model_type: str, tests_dir: Path, source: str) -> Any:
    """``model_type``'s tester from ``source``: its own test file (``tests/models/...``), or
    transformers' generic causal LM tester given its config and model classes; LookupError where
    the file has no tester of the type's own config."""
    import transformers
    from transformers.models.auto import modeling_auto as auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if source != CAUSAL_LM_SOURCE:
        module_name = module_of_tests(model_type)
        module = import_tests(module_name)
        # Most are ``...ModelTester``; some files name theirs otherwise (``MusicgenTester``,
        # ``PeVideoEncoderTester``, ``Qwen3OmniMoeThinkerForConditionalGenerationTester``).
        testers = [
            v for k, v in vars(module).items()
            if k.endswith("Tester") and isinstance(v, type) and v.__module__ == module_name
            and hasattr(v, "prepare_config_and_inputs_for_common")
        ]  # fmt: skip
        tester = _tester_of(model_type, testers)
        if tester is None:
            raise LookupError(f"{module_name} has no tester of {model_type}'s own config")
        return tester
    base = importlib.import_module("tests.causal_lm_tester").CausalLMModelTester
    attrs = {
        "config_class": CONFIG_MAPPING[model_type],
        "base_model_class": getattr(transformers, auto.MODEL_MAPPING_NAMES[model_type]),
        "causal_lm_class": getattr(
            transformers, auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
        ),
    }
    return type(f"{model_type}Tester", (base,), attrs)(_Parent())


def config_and_inputs(model_type: str, tests_dir: Path) -> tuple[Any, dict[str, Any], str]:
    """The tiny config, the base model's forward inputs and the tester's source
    (:func:`model_from_testers`'s, without the model)."""
    return model_from_testers(model_type, tests_dir)[:3]


def model_from_testers(model_type: str, tests_dir: Path) -> tuple[Any, dict[str, Any], str, Any]:
    """The tiny config, the base model's forward inputs, the tester's source and the model built
    from copies of them: the type's own tester, else transformers' causal LM one, else the zoo's
    generic tester, each taken where the one before fails (a test file of another transformers
    release, a config the causal LM tester leaves full size, a model that does not build from
    it), and the source says which failed and how. The model returned is the one whose build
    chose the tester, so no later build of the run can fail where this one did not."""
    import torch
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    generic = importlib.import_module("zoo_generic")
    tried = []
    if on_disk(tests_dir, module_of_tests(model_type)):
        tried.append(("its own tester", module_of_tests(model_type).replace(".", "/") + ".py"))
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        tried.append(("the causal LM tester", CAUSAL_LM_SOURCE))
    failed = []
    for name, source in tried:
        say_tester(", ".join([source, *failed]))
        try:
            tester = model_tester(model_type, tests_dir, source)
            seed_testers()
            config, inputs = tester.prepare_config_and_inputs_for_common()
            inputs = {k: v for k, v in inputs.items() if k not in LABEL_KEYS and v is not None}
            # transformers' causal LM tester knows none of the type's own fields: a config it
            # leaves full size would not fit, one it leaves inconsistent does not build; a test
            # file of another release may give a config the installed model rejects.
            if source == CAUSAL_LM_SOURCE and generic.full_size(config):
                failed.append(f"{name}'s config being full size")
                continue
            model = build(model_type, *copies(config, inputs))
            unfit = unfit_inputs(model, inputs)
            if unfit is not None:
                failed.append(f"{name}'s inputs {unfit}")
                continue
            return config, inputs, ", ".join([source, *failed]), model
        except Exception as exc:  # noqa: BLE001 - the next tester is tried; the record says why
            failed.append(f"{name}'s config failing: {type(exc).__name__}: {one_line(exc)[:80]}")
    source = ", ".join([generic.SOURCE, *failed])
    say_tester(source)
    try:
        config, inputs = generic.generic(model_type)
        return config, inputs, source, build(model_type, *copies(config, inputs))
    except Exception as exc:
        exc.zoo_source = source  # type: ignore[attr-defined] - the record names its tester
        raise


def unfit_inputs(model: Any, inputs: dict[str, Any]) -> str | None:
    """How a tester's inputs do not fit the installed model's forward, or None: a test file of
    another release names an argument the forward no longer takes, or leaves out one it now
    requires (vibevoice_acoustic_tokenizer's tester gives ``audio``, 5.24's forward requires
    ``input_values``). The next tester is tried, as for a config the model rejects.

    >>> from torch import nn
    >>> from ampgraph.model.build import ModelInputs
    >>> unfit_inputs(ModelInputs("lin", nn.Linear(2, 2), ()), {"audio": 1})
    "not fitting the installed forward: missing a required argument: 'input'"
    >>> unfit_inputs(ModelInputs("lin", nn.Linear(2, 2), ()), {"input": 1}) is None
    True
    """
    import inspect

    try:
        inspect.signature(model.module.forward).bind(*model.args, **inputs)
    except TypeError as exc:
        return f"not fitting the installed forward: {exc}"
    return None


def seed_testers(seed: int = 0) -> None:
    """Seed every random stream the testers draw from: torch's, Python's, numpy's and the
    ``global_rng`` of transformers' test modules (``ids_tensor``, ``floats_tensor``,
    ``random_attention_mask`` draw from it). Each build of a type is then the same model with
    the same inputs: the check's eager run, its capture and ``verify`` see one set of values,
    and sizes a real run computes from them (a padding mask's lengths) are the same in each."""
    import random

    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    if (np := sys.modules.get("numpy")) is not None:  # transformers imports it
        np.random.seed(seed)
    for name, module in list(sys.modules.items()):
        rng = getattr(module, "global_rng", None) if name.startswith("tests") else None
        if isinstance(rng, random.Random):
            rng.seed(seed)


#: What a job's process writes on stderr as it takes each tester, so that the record of a job
#: that crashed or timed out names the tester it was on (:func:`last_tester_said`).
TESTER_LINE = "zoo: tester: "


def say_tester(source: str) -> None:
    """Say on stderr that ``source`` is the tester being tried now."""
    print(TESTER_LINE + source, file=sys.stderr, flush=True)


def last_tester_said(stderr: str | bytes | None) -> str | None:
    """The last tester a job's process said it took (:func:`say_tester`), or None.

    >>> last_tester_said("zoo: tester: a.py\\nwarning\\nzoo: tester: generic tester, a.py's ...\\n")
    "generic tester, a.py's ..."
    >>> last_tester_said(b"no tester yet") is None
    True
    """
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    lines = (stderr or "").splitlines()
    said = [ln.removeprefix(TESTER_LINE) for ln in lines if ln.startswith(TESTER_LINE)]
    return said[-1] if said else None


def copies(config: Any, inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Deep copies of a tester's config and inputs: a build or a forward may change either, and
    every model of a run is built from the same ones (the tests' id tensors are drawn from an
    unseeded generator, so a tester asked again would give other inputs)."""
    import copy

    return copy.deepcopy(config), copy.deepcopy(inputs)


def build(model_type: str, config: Any, inputs: dict[str, Any]) -> Any:
    """The base model of ``model_type`` from ``config``, in eval mode, as a ``ModelInputs``."""
    import torch
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from ampgraph.model.build import ModelInputs

    torch.manual_seed(0)
    if not getattr(config, "architectures", None):
        # A type with two base models (funnel: FunnelModel, FunnelBaseModel) is told apart by
        # the config's architectures, which a tester's config leaves unset: the first, as
        # transformers' own mapping lists it.
        names = MODEL_MAPPING_NAMES.get(model_type)
        if isinstance(names, tuple):
            config.architectures = [names[0]]
    model = importlib.import_module("zoo_args").base_model(model_type, config).eval()
    return ModelInputs(model_type, model, (), dict(inputs))


def classify(text: str) -> str:
    """The mechanism behind a failure's one line (the classes issue 42 names, else ``other``).

    >>> classify("_apply(): Couldn't swap Linear.weight")
    'swapped modules'
    >>> classify("timed out after 600 s")
    'timed out'
    >>> classify("Expected mat_a stride along 0 dim to be multiple of 16 bytes, got 12.")
    'compile-only branch (grouped_mm)'
    >>> classify("NotImplementedError: argument of type: <class 'transformers.DummyLayer'>")
    'an output fx cannot represent (a returned cache object)'
    >>> classify("module e.dropout (Dropout): predicted [e.dropout] in=torch.float32 ...")
    'value-dependent branch (an all-ones attention mask)'
    """
    low = text.lower()
    rules = (
        ("timed out", "timed out"),
        ("running low on memory", "killed by Ray's memory monitor (a shared machine)"),
        # transformers' grouped_mm takes its fallback op when torch.compiler.is_compiling(), which
        # the make_fx capture reports as True; the real CUDA run calls F.grouped_mm, whose
        # 16-byte stride check the tests' tiny expert widths fail.
        ("stride along", "compile-only branch (grouped_mm)"),
        # peft's DoraLinearLayer calls the lora_A/lora_B modules it is given: its hook fires after
        # theirs, the capture lists its line first.
        ("lora_magnitude_vector", "call order of a module that calls modules it is given"),
        ("couldn't swap", "swapped modules"),
        # verify's line of the Dropout after an attention softmax, every node and cast agreeing:
        # the real run drops an all-ones attention mask (transformers' mask code reads its
        # values), so the scores stay bf16, where the capture added the fp32 mask. convbert and
        # blip are exact with one zero in the mask.
        ("(dropout): predicted", "value-dependent branch (an all-ones attention mask)"),
        (".item()", ".item()"),
        ("data-dependent", "value-dependent shapes"),
        ("unbacked", "value-dependent shapes"),
        ("size 0", "value-dependent shapes"),
        ("zero-length", "value-dependent shapes"),
        # make_fx turns the forward's return value into the graph's output node: an object in it
        # fx cannot represent (nemotron_h's hybrid cache, whose attention-free layers are
        # transformers' DummyLayer) fails the trace at its end, where a real run returns it.
        ("argument of type", "an output fx cannot represent (a returned cache object)"),
        ("is_grad_enabled", "grad mode"),
        ("inference_mode", "grad mode"),
        ("out of memory", "out of memory"),
        # The job's heap bound (--memory-gb): codegen's causal LM tester config keeps its full
        # size (n_embd 4096, 28 layers: CodeGenConfig does not take the tester's hidden_size).
        ("can't allocate memory", "the job's heap bound (--memory-gb)"),
        ("not implemented for", "kernel missing on the CPU"),
    )
    return next((m for key, m in rules if key in low), "other")


def plain_run(model: Any) -> str | None:
    """The error of one plain forward of ``model`` (fp32, CPU, no autocast), or None: tells a
    capture that fails from a model (or a tester's config) that fails in any run."""
    import torch

    try:
        with torch.inference_mode():
            model.module(*model.args, **model.kwargs)
    except Exception as exc:  # noqa: BLE001 - what the model itself raises is the finding
        return f"{type(exc).__name__}: {one_line(exc)}"
    return None


def _check(model: Any, setting: str, amp: str, fresh: Any = None) -> dict[str, Any]:
    # The eager hooks run on a fresh model (``fresh``), as the capture ran on one: a forward may
    # rebuild modules (BigBird's first forward on a short sequence switches block-sparse attention
    # to full, building a new attention whose Dropout no hook registered before the call sees);
    # run after the capture, the eager pass took the second forward's path and hooked it.
    cell = compare(model, setting, amp, fresh)
    return {
        "agrees": cell.agrees, "nodes": cell.nodes, "compared": cell.compared,
        "disagreements": cell.disagreements, "hooks": [cell.hooks_agree, cell.hooks],
        "failure": cell.failure, "first_difference": cell.first_difference, "raises": cell.raises,
    }  # fmt: skip


def _verify(model: Any, setting: str, amp: str) -> dict[str, Any]:
    v = verify_cpu(model, setting, amp)
    return {
        "ok": v.ok, "nodes": list(v.nodes), "casts": list(v.casts),
        "disagreements": v.disagreements, "failure": v.failure, "first": v.first,
    }  # fmt: skip


def maker(name: str, tests_dir: Path) -> tuple[Any, Any, dict[str, Any], Any]:
    """A builder of ``name`` afresh (a transformers model type, or an entry of
    ``zoo_beyond.MODELS``), its first model, what the record says of where it came from, and the
    tester's config and inputs (None for a model beyond transformers: it has no tester)."""
    if "/" in name:
        beyond = importlib.import_module("zoo_beyond")
        library, family = beyond.MODELS[name][:2]
        where = {"tester": f"{library}: {family}", "library": library}
        return (lambda: beyond.build(name)), beyond.build(name), where, None
    config, inputs, source, model = model_from_testers(name, tests_dir)
    return _builder(name, config, inputs), model, {"tester": source, "library": "transformers"}, (
        config, inputs)


def _builder(name: str, config: Any, inputs: dict[str, Any]) -> Any:
    def make() -> Any:  # afresh from the tester: a forward may change its model or inputs
        return build(name, *copies(config, inputs))

    return make


def run_one(name: str, tests_dir: Path, combos: list[str]) -> dict[str, Any]:
    """One model type in ``combos`` (``"amp-fp32 bf16"``...): its JSON record."""
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    rec: dict[str, Any] = {"type": name, "builds": False, "cells": {}}
    try:
        make, model, where, tester = maker(name, tests_dir)
        rec.update(where)
    except Exception as exc:  # noqa: BLE001 - a type that does not build is a line on the page
        if "/" not in name:
            rec["tester"] = getattr(exc, "zoo_source", None) or source_of(name, tests_dir)
        rec["build_error"] = f"{type(exc).__name__}: {one_line(exc)}"
        rec["seconds"] = round(time.perf_counter() - start, 1)
        return rec
    rec["builds"] = True
    rec["model_class"] = type(model.module).__name__
    rec["params"] = sum(p.numel() for p in model.module.parameters())
    rec["cells"] = run_combos(make, combos)
    raised = next((c["check"]["plain_run"] for c in rec["cells"].values()
                   if c["check"].get("plain_run")), None)  # fmt: skip
    if raised is not None and tester is not None:
        repair, make = repaired_builder(name, *tester, raised, model)
        if repair is not None:
            rec["repair"] = repair  # tried and kept, or tried and left (plain_run_after)
        if make is not None:
            rec["tester"] += f", repaired: {repair['what']}"
            rec["cells"] = run_combos(make, combos)
    rec["seconds"] = round(time.perf_counter() - start, 1)
    return rec


def run_combos(make: Any, combos: list[str]) -> dict[str, Any]:
    """The cells of each combination in ``combos``, every model from ``make()``."""
    out = {}
    for combo in combos:
        setting, amp = combo.split()
        cells = {}
        for cell, fn in (("check", lambda *a: _check(*a, make())), ("verify", _verify)):
            try:
                cells[cell] = fn(make(), setting, amp)
            except Exception as exc:  # noqa: BLE001 - the harness's own failure, recorded
                cells[cell] = {"failure": f"{type(exc).__name__}: {one_line(exc)}"}
        if cells["check"].get("failure"):  # on a fresh model: the capture may have moved it
            cells["check"]["plain_run"] = plain_run(make())
        out[combo] = cells
    return out


def repaired_builder(
    name: str, config: Any, inputs: dict[str, Any], raised: str, model: Any
) -> tuple[dict[str, Any] | None, Any]:
    """Where the tester's model raises in a plain run (``raised``) with a mechanism
    ``zoo_repair`` knows: what was repaired, and a builder of the repaired model where its plain
    run passes (None where it still raises: the record keeps the unrepaired cells and says what
    the repairs left, ``plain_run_after``). ``(None, None)`` where no repair applies. A repair
    may uncover another mechanism (jamba's attention layer, then its experts' widths): each is
    repaired in turn, each mechanism once."""
    repair = importlib.import_module("zoo_repair").repair
    done: list[str] = []
    still: str | None = raised
    while still is not None and len(done) < 4:
        fixed = repair(config, inputs, still, model)
        if fixed is None or fixed[2] in done:
            break
        config, inputs, what = fixed
        done.append(what)
        try:
            model = build(name, *copies(config, inputs))
            still = plain_run(model)
        except Exception as exc:  # noqa: BLE001 - a repaired config the model rejects at build
            still = f"{type(exc).__name__}: {one_line(exc)}"
    if not done:
        return None, None
    record = {"what": "; ".join(done), "plain_run_before": raised}
    if still is not None:
        return {**record, "plain_run_after": still}, None
    return record, _builder(name, config, inputs)


def _bound(memory_gb: float) -> Any:
    """What a job's process runs before its command: its heap bounded to ``memory_gb`` (a type
    that needs more raises MemoryError in its own process, instead of a shared machine's memory
    monitor or OOM killer taking the worker, or another user's process, with it)."""
    import resource

    limit = int(memory_gb * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _where(name: str, tests_dir: str, stderr: str | bytes | None) -> dict[str, str]:
    """The tester a record of a job that did not finish names (none for a beyond model): the
    last its process said it took (the one it fell through to), else the first it would try."""
    if "/" in name:
        return {}
    return {"tester": last_tester_said(stderr) or source_of(name, Path(tests_dir))}


def job(model_type: str, tests_dir: str, combos: list[str], timeout: float,
        memory_gb: float = 6.0) -> dict[str, Any]:  # fmt: skip
    """One type in its own process, bounded by ``timeout`` seconds and ``memory_gb`` of heap
    (what a Ray task runs)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", model_type,
           "--tests-dir", tests_dir, *[a for c in combos for a in ("--combo", c)]]  # fmt: skip
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=_bound(memory_gb))  # fmt: skip
    except subprocess.TimeoutExpired as exc:  # its output so far is on it, as bytes
        return {"type": model_type, "timed_out": True, "seconds": round(timeout, 1),
                "build_error": f"timed out after {timeout:.0f} s",
                **_where(model_type, tests_dir, exc.stderr)}  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        seconds = round(time.perf_counter() - start, 1)
        return {"type": model_type, "crashed": True, "seconds": seconds,
                "build_error": f"process ended with {done.returncode}: {tail}",
                **_where(model_type, tests_dir, done.stderr)}  # fmt: skip
    return json.loads(lines[-1])


def run_ray(names: list[str], args: argparse.Namespace) -> None:
    """Every type in ``names`` a Ray task; each record appended to ``args.results`` as it lands."""
    try:
        import ray
    except ImportError:
        sys.exit("Error: the zoo runs on Ray: pip install 'ampgraph[zoo]' (or pip install ray)")
    local = {} if args.address else {"num_cpus": args.workers, "object_store_memory": 80 * 2**20}
    # The records are small JSON: a local object store of 80 MB (Ray's floor is 75) leaves the
    # memory to the jobs; each job reserves its heap bound so Ray places no more than fit.
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False, **local)
    remote = ray.remote(num_cpus=1, max_retries=0, memory=int(args.memory_gb * 2**30))(job)
    pending = {remote.remote(n, str(args.tests_dir), args.combo, args.timeout, args.memory_gb): n
               for n in names}  # fmt: skip
    with open(args.results, "a") as out:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            name = pending.pop(ready[0])
            try:
                rec = ray.get(ready[0])
            except Exception as exc:  # noqa: BLE001 - a lost task is a line on the page
                rec = {"type": name, "crashed": True, "build_error": one_line(exc)}
            if args.rerun:  # the page says why the row replaces the type's earlier one
                rec["rerun"] = args.rerun
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"zoo: {name}: {status(rec)} ({len(pending)} left)", file=sys.stderr, flush=True)


def status(rec: dict[str, Any]) -> str:
    """A record's verdict: ``exact``, ``not exact``, ``not analysable``, ``does not build``,
    ``timed out``.

    >>> status({"builds": True, "cells": {"amp-fp32 bf16": {"check": {"agrees": True},
    ...                                                     "verify": {"ok": True}}}})
    'exact'
    """
    if rec.get("timed_out"):
        return "timed out"
    if rec.get("crashed"):
        return "crashed"
    if not rec.get("builds"):
        generic = rec.get("tester", "").startswith("generic tester")
        return "does not build (generic tester)" if generic else "does not build"
    cells = [c for combo in rec["cells"].values() for c in combo.values()]
    if any(c.get("plain_run") for c in cells):
        return "raises in a plain run"
    if any(c.get("failure") for c in cells):
        return "not analysable"
    if all(c.get("agrees", c.get("ok")) for c in cells):
        return "exact"
    return "not exact"


def main(argv: list[str] | None = None) -> int:
    # Every model is built from a tiny config: a tester that reaches for the hub (edgetam's timm
    # backbone) fails at once, not after the hub client's retries.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests-dir", type=Path, help="a transformers checkout's tests/")
    parser.add_argument("-t", "--type", action="append", help="model type (repeatable)")
    parser.add_argument("--combo", action="append", help='"SETTING DTYPE" (default amp-fp32 bf16)')
    parser.add_argument("--all-combos", action="store_true", help="the four settings x bf16/fp16")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "zoo-results.jsonl")
    parser.add_argument("--address", help="a Ray cluster's address (default: a local one)")
    parser.add_argument("--workers", type=int, default=1, help="local Ray workers")
    parser.add_argument("--memory-gb", type=float, default=6.0, help="heap bound of each job")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per type")
    parser.add_argument("--skip-done", action="store_true", help="skip types already in --results")
    parser.add_argument("--beyond", action="store_true",
                        help="diffusers, peft and timm families (scripts/zoo_beyond.py) instead")
    parser.add_argument("--rerun", help="mark each record a rerun, saying why (the page shows it)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--page", action="store_true", help="write the page from --results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "zoo.md")
    parser.add_argument("--note", default="", help="what the page says of this run's machine")
    parser.add_argument("--export-slice", type=Path, help="write the suite's slice data here")
    args = parser.parse_args(argv)
    if args.page:
        from zoo_page import write_page

        write_page(args.results, args.out, args.note)
        return 0
    if args.tests_dir is None and args.beyond:
        args.tests_dir = Path(tempfile.mkdtemp(prefix="zoo-beyond-"))  # no tester read: empty
    if args.tests_dir is None:
        parser.error("--tests-dir is required (a transformers checkout's tests/)")
    use_tests(args.tests_dir)
    args.combo = (
        [f"{s} {a}" for a in AMP_DTYPES for s in SETTINGS] if args.all_combos
        else args.combo or list(DEFAULT_COMBOS)
    )  # fmt: skip
    if args.one:
        print(json.dumps(run_one(args.one, args.tests_dir, args.combo)))
        return 0
    if args.export_slice:
        from zoo_page import export_slice

        export_slice(args.type or [], args.tests_dir, args.export_slice)
        return 0
    names = args.type or (list(importlib.import_module("zoo_beyond").MODELS) if args.beyond
                          else model_types())
    if args.skip_done and args.results.exists():
        lines = [json.loads(ln) for ln in args.results.read_text().splitlines() if ln.strip()]
        # A type recorded without a tester then has the generic one now: run it.
        done = {r["type"] for r in lines if not r.get("no_tester")}
        names = [n for n in names if n not in done]
    run_ray(names, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
