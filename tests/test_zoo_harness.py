"""The zoo's choice of tester (scripts/zoo.py, issue 42): a type's own tester, else transformers'
causal LM tester, else the zoo's generic one, each taken where the one before fails, and the
record naming the tester really used, also where the job's process died or ran out of time.

Each test writes a transformers ``tests/`` folder of hand-written testers (real tiny Llama
configs: transformers builds them or refuses them) and runs the zoo on it in a process of its
own, as a zoo job does: the suite's own package is named ``tests`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, load_file

pytest.importorskip("transformers", reason="needs transformers")

ZOO = load_file(ROOT / "scripts" / "zoo.py")
TESTS_IMPORT = load_file(ROOT / "scripts" / "zoo_tests_import.py")

#: A tiny Llama config; ``{act}`` is its activation: a name transformers lacks makes a config
#: that is accepted and a model that does not build (``ACT2FN`` raises KeyError).
CONFIG = (
    "LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=1,"
    " num_attention_heads=4, num_key_value_heads=2, hidden_act={act!r})"
)
OWN = '''import torch
from transformers import LlamaConfig


class LlamaModelTester:
    made = []

    def __init__(self, parent):
        LlamaModelTester.made.append(self)

    def prepare_config_and_inputs_for_common(self):
        {body}
        return {config}, {{"input_ids": torch.randint(0, 99, (2, 7))}}
'''
CAUSAL = '''import torch


class CausalLMModelTester:
    config_class = base_model_class = causal_lm_class = None

    def __init__(self, parent):
        pass

    def prepare_config_and_inputs_for_common(self):
        {body}
        return {config}, {{"input_ids": torch.randint(0, 99, (2, 7))}}
'''
#: Runs ``run_one`` on llama with no combination (the tester and the build are what is tested)
#: and prints the record and how many own testers were made.
DRIVER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
import zoo
zoo.use_tests(Path({tests!r}))
rec = zoo.run_one("llama", Path({tests!r}), [])
own = sys.modules.get("tests.models.llama.test_modeling_llama")
rec["own_testers_made"] = len(own.LlamaModelTester.made) if own else 0
print(json.dumps(rec))
"""


def _tests_dir(tmp: Path, own_act: str, causal_act: str, body: str = "pass") -> Path:
    """A ``tests/`` folder with llama's own tester and the causal LM tester."""
    tests = tmp / "tests"
    (tests / "models" / "llama").mkdir(parents=True)
    for init in (tests, tests / "models", tests / "models" / "llama"):
        (init / "__init__.py").write_text("")
    own = OWN.format(body="pass", config=CONFIG.format(act=own_act))
    (tests / "models" / "llama" / "test_modeling_llama.py").write_text(own)
    config = "self.config_class" + CONFIG.removeprefix("LlamaConfig").format(act=causal_act)
    causal = CAUSAL.format(body=body, config=config)
    (tests / "causal_lm_tester.py").write_text(causal)
    return tests


def _run_one(tests: Path) -> dict[str, object]:
    driver = DRIVER.format(scripts=str(ROOT / "scripts"), tests=str(tests))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                          env=env, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_a_model_that_does_not_build_from_its_own_tester_falls_through(tmp_path: Path) -> None:
    """The own tester's config is accepted and its model does not build: the causal LM tester's
    model is the one run, the record says why the own one was left, and the own tester was made
    once (the one whose config was checked is the one used)."""
    rec = _run_one(_tests_dir(tmp_path, own_act="no_such_activation", causal_act="silu"))
    assert rec["builds"] is True and rec["model_class"] == "LlamaModel"
    assert rec["tester"] == (
        f"{ZOO.CAUSAL_LM_SOURCE}, its own tester's config failing: KeyError: 'no_such_activation'"
    )
    assert rec["own_testers_made"] == 1


def test_a_model_that_does_not_build_from_the_causal_lm_tester_falls_through(
    tmp_path: Path,
) -> None:
    """mamba2's case: the causal LM tester's model does not build either; the generic tester's
    does, and the record names it with both failures, not the causal LM tester."""
    tests = _tests_dir(tmp_path, own_act="no_such_activation", causal_act="no_such_activation")
    rec = _run_one(tests)
    assert rec["builds"] is True
    assert rec["tester"].startswith("generic tester"), rec["tester"]
    assert "its own tester's config failing: KeyError" in rec["tester"]
    assert "the causal LM tester's config failing: KeyError" in rec["tester"]


def test_a_crashed_job_names_the_tester_it_fell_through_to(tmp_path: Path) -> None:
    """The job's process is killed (as the OOM killer does) while the causal LM tester, taken
    after the own tester failed, prepares its config: the crashed record names the causal LM
    tester, where the type's first tester would be its own test file."""
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    tests = _tests_dir(tmp_path, own_act="no_such_activation", causal_act="silu", body=kill)
    assert ZOO.source_of("llama", tests).startswith("tests/models/llama/")
    rec = ZOO.job("llama", str(tests), ["amp-fp32 bf16"], timeout=300)
    assert rec["crashed"] is True and "process ended with -9" in rec["build_error"]
    assert rec["tester"].startswith(ZOO.CAUSAL_LM_SOURCE + ", its own tester's config failing")


def test_a_timed_out_job_names_the_tester_it_was_on(tmp_path: Path) -> None:
    """What a job reads of a process stopped by its timeout (``TimeoutExpired`` holds its
    output so far, as bytes) names the last tester the process said it took."""
    line = ZOO.TESTER_LINE + "generic tester, x"
    said = f"import sys, time; print({line!r}, file=sys.stderr, flush=True); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        subprocess.run([sys.executable, "-c", said], capture_output=True, text=True, timeout=3)
    assert isinstance(stopped.value.stderr, bytes)
    where = ZOO._where("llama", str(tmp_path / "tests"), stopped.value.stderr)
    assert where == {"tester": "generic tester, x"}
    assert ZOO._where("llama", str(tmp_path / "tests"), None)["tester"] == ZOO.CAUSAL_LM_SOURCE


def test_an_older_test_files_checkpoint_lists_are_given_back(tmp_path: Path) -> None:
    """A test file of transformers 4.x imports its model's checkpoint list beside the model
    (``BROS_PRETRAINED_MODEL_ARCHIVE_LIST``), which 5.x removed: the list is given back empty and
    the file loads; any other name it cannot import still fails."""
    import types

    owner = types.ModuleType("zoo_fake_modeling")
    sys.modules[owner.__name__] = owner
    (tmp_path / "zoo_old_test.py").write_text(
        "from zoo_fake_modeling import FAKE_PRETRAINED_MODEL_ARCHIVE_LIST as NAMES\n"
    )
    (tmp_path / "zoo_bad_test.py").write_text("from zoo_fake_modeling import FakeModel\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert TESTS_IMPORT.import_tests("zoo_old_test").NAMES == []
        with pytest.raises(ImportError, match="FakeModel"):
            TESTS_IMPORT.import_tests("zoo_bad_test")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("zoo_fake_modeling", "zoo_old_test", "zoo_bad_test"):
            sys.modules.pop(name, None)
