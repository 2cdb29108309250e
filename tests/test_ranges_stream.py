"""Ranges at full size: weights larger than memory run one weight at a time, with the same results.

A synthesized Llama checkpoint (safetensors shards written here, one tensor at a time) several
times larger than a memory limit the test sets on a child process (``RLIMIT_DATA``: the private
memory the kernel lets it map): ``ampgraph ranges`` there sees that the weights do not fit, reads
one at a time, and its JSON is the in-memory run's, node for node. The same run held in memory
under the same limit is refused by the kernel: the limit is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ampgraph.model.build import load_model
from ampgraph.ranges import value_ranges
from ampgraph.ranges.weights import real_state

from .factories import write_shards

ROOT = Path(__file__).resolve().parent.parent
#: About 97M parameters: 390 MB of fp32 weights, in 111 shards of one tensor.
CONFIG = {
    "model_type": "llama", "vocab_size": 8000, "hidden_size": 768, "intermediate_size": 2048,
    "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 12,
    "max_position_embeddings": 64, "architectures": ["LlamaForCausalLM"],
    "tie_word_embeddings": False,
}  # fmt: skip
#: The memory the child may take beyond what it holds after its imports and the model's
#: meta build: a quarter of the checkpoint.
LIMIT = 80 * 2**20
SETTINGS = ["amp-fp32", "half"]

#: The child: build on meta, set the limit on itself, run ranges (the default: stream where the
#: weights do not fit), print the JSON, or the error's type and first line.
CHILD = """
import json, resource, sys
from pathlib import Path
import torch
from ampgraph.model.build import load_model
from ampgraph.ranges import value_ranges

folder, limit, stream = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
model = load_model(str(folder), seq_len=8)
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
data, rss = status("VmData:"), status("VmRSS:")
resource.setrlimit(resource.RLIMIT_DATA, (data + limit, resource.RLIM_INFINITY))
try:
    result = value_ranges(model, {settings!r}, device_type="cpu", amp_dtype="fp16",
                          weights_dir=folder, stream=stream, force=stream is False)
except Exception as exc:
    print(json.dumps({{"error": type(exc).__name__, "message": str(exc).splitlines()[0]}}))
    sys.exit(0)
print(json.dumps({{"result": result.to_dict(), "peak_above_start": status("VmHWM:") - rss}}))
""".format(settings=SETTINGS)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder: config.json and one shard per tensor, written one tensor at a time."""
    folder = tmp_path_factory.mktemp("big")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    model = load_model(str(folder), seq_len=8)
    gen = torch.Generator().manual_seed(11)
    write_shards(folder, (
        (name, torch.randn(p.shape, generator=gen) * 0.05 if p.dim() > 1 else torch.ones(p.shape))
        for name, p in model.module.named_parameters()
    ))  # fmt: skip
    return folder


def child(folder: Path, stream: bool | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(LIMIT), json.dumps(stream)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_weights_larger_than_memory_run_one_at_a_time_with_the_same_results(
    checkpoint: Path,
) -> None:
    size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    assert size > 4 * LIMIT  # several times what the child may take
    streamed = child(checkpoint, None)
    assert "result" in streamed, streamed
    got = streamed["result"]
    assert streamed["peak_above_start"] < LIMIT < size / 4
    assert got["weights"].endswith("; read one weight at a time")
    model = load_model(str(checkpoint), seq_len=8)
    whole = value_ranges(model, SETTINGS, device_type="cpu", amp_dtype="fp16",
                         weights_dir=checkpoint, stream=False).to_dict()  # fmt: skip
    assert whole["weights"] == got["weights"].removesuffix("; read one weight at a time")
    for key in ("nodes", "settings", "reference_findings"):
        assert got[key] == whole[key], key
    assert len(got["nodes"]) > 500 and any(s["findings"] for s in got["settings"])


def test_the_limit_is_real_an_in_memory_run_under_it_fails(checkpoint: Path) -> None:
    held = child(checkpoint, False)
    assert held.get("error") in ("RuntimeError", "MemoryError"), held
    assert "alloc" in held["message"].lower(), held


def test_seeded_tensors_are_the_same_numbers_one_at_a_time(tmp_path: Path) -> None:
    """A checkpoint holding some of the tensors: the rest seeded, in both runs alike."""
    small = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2}
    config = {**CONFIG, **small}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path), seq_len=4)
    state, _ = real_state(model.module, seed=5)
    some = {k: v * 3 for i, (k, v) in enumerate(state.items()) if "rotary" not in k and i % 2}
    save_file(some, str(tmp_path / "model.safetensors"))
    runs = [
        value_ranges(model, SETTINGS, device_type="cpu", amp_dtype="fp16", seed=9,
                     weights_dir=tmp_path, stream=stream).to_dict()
        for stream in (False, True)
    ]  # fmt: skip
    assert "seeded (seed 9): " in runs[0]["weights"]
    for key in ("nodes", "settings", "reference_findings"):
        assert runs[0][key] == runs[1][key], key


def test_one_at_a_time_needs_a_folder_and_the_forward_pass(tmp_path: Path) -> None:
    from ampgraph.model.build import ModelInputs
    from ampgraph.ranges import RangesError

    lin = ModelInputs("lin", torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    with pytest.raises(RangesError, match="one weight at a time only from a model folder"):
        value_ranges(lin, ["fp32"], device_type="cpu", stream=True)
