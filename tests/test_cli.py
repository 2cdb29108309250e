"""The command line as a user meets it: output, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampgraph.cli import main
from ampgraph.compat import draft_export_names_branches
from ampgraph.report.records import SCHEMA, Report

from .conftest import seed_hook_blocks


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_table_prints_the_seed_lines() -> None:
    code, out = run("table", "-s", "amp-fp32", "--only", "Linear,LayerNorm,Embedding", "--no-check")
    assert code == 0
    seed = seed_hook_blocks()["amp-fp32"]
    assert out.splitlines()[: len(seed) - 1] == seed[:-1]


def test_table_with_several_settings_heads_each_block() -> None:
    code, out = run("table", "llama-tiny", "-s", "fp32", "-s", "amp-half", "--no-check")
    assert code == 0
    heads = [line for line in out.splitlines() if line.startswith("# ")]
    assert heads == [
        "# llama-tiny fp32: no autocast, parameters fp32; inference (torch.inference_mode)",
        "# llama-tiny amp-half: autocast cuda bf16, parameters bf16; "
        "inference (torch.inference_mode)",
    ]


def test_table_json_is_a_versioned_report() -> None:
    code, out = run("table", "llama-tiny", "-s", "amp-fp32", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == SCHEMA and data["version"] == 2
    assert data["setting"]["name"] == "amp-fp32"
    assert set(data["versions"]) >= {"ampgraph", "torch", "transformers", "policy_tables"}
    assert data["check"]["disagreements"] == 0
    report = Report.from_dict(data)
    linear = next(n for n in report.nodes if n.op == "aten.linear.default")
    assert linear.policy == "lower_precision_fp" and linear.casts
    assert linear.check["agree"] is True


def test_table_markdown() -> None:
    code, out = run(
        "table", "llama-tiny", "-s", "amp-fp32", "--format", "markdown", "--only", "Linear"
    )
    assert code == 0
    assert "| module | type | in | out | policy | autocast casts |" in out
    assert "| `model.layers.0.self_attn.q_proj` | Linear | fp32 | bf16 | lower precision |" in out
    assert "0 disagreements" in out


def test_check_passes_and_names_each_setting() -> None:
    code, out = run("check", "llama-tiny", "--device", "cpu", "--amp-dtype", "fp16")
    assert code == 0
    assert len(out.splitlines()) == 4
    assert all("0 disagreements" in line for line in out.splitlines())


def test_models_lists_the_default() -> None:
    code, out = run("models")
    assert code == 0 and "opt-125m" in out and "(default)" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["table", "no-such-model"], 1, "Error: unknown model 'no-such-model'"),
        (["table", "-s", "amp=maybe"], 2, "malformed setting"),
        (["table", "-s", "autocast=on,params=int8"], 2, "unknown dtype 'int8'"),
        (["table", "--device", "tpu"], 2, "Invalid value for '--device'"),
        (["table", "--seq-len", "0"], 2, "Invalid value for '--seq-len'"),
        (
            ["table", "missing/config.json"],
            1,
            "Error: config file 'missing/config.json' does not exist",
        ),
    ],
)
def test_bad_input_is_one_line_without_traceback(args: list[str], code: int, message: str) -> None:
    exit_code, out = run(*args)
    assert exit_code == code
    assert message in out
    assert "Traceback" not in out


def test_malformed_config_and_unknown_architecture(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, out = run("table", str(bad))
    assert code == 1 and out.startswith("Error: ") and "not valid JSON" in out
    unknown = tmp_path / "config.json"
    unknown.write_text(json.dumps({"model_type": "no-such-arch"}))
    code, out = run("table", str(unknown))
    assert code == 1 and "does not know model_type 'no-such-arch'" in out
    assert len(out.strip().splitlines()) == 1


def test_untraceable_model_is_one_line() -> None:
    code, out = run("table", "tests.factories:leaves_torch", "-s", "fp32")
    assert code == 1
    assert out.startswith("Error: make_fx could not trace")  # the default capture's tracer
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_a_forward_that_branches_on_data_is_analysed_along_one_path_and_says_so() -> None:
    code, out = run("check", "tests.factories:untraceable", "-s", "amp-fp32")
    assert code == 0, out
    warning, summary = out.strip().splitlines()
    assert warning.startswith("warning: the forward branches on data values")
    assert "not analysed" in warning
    # torch 2.10 to 2.12's draft export does not say where it decided (ampgraph.compat).
    assert ("`if x.sum() > 0:`" in warning) == draft_export_names_branches()
    counted = "1 branch" if draft_export_names_branches() else "0 branches"
    assert summary.endswith(f"through {counted} on data, whose other sides are not analysed")


def test_factory_that_raises_is_one_line() -> None:
    code, out = run("table", "tests.factories:raises")
    assert code == 1
    assert (
        out.strip() == "Error: factory 'tests.factories:raises' raised ValueError: no weights here"
    )


def test_help_teaches() -> None:
    code, out = run("table", "--help")
    assert code == 0
    assert "ampgraph table -s amp-fp32" in out and "--only" in out


def test_a_full_disk_is_one_line() -> None:
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "ampgraph", "models"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: cannot write the output: No space left on device"


def test_check_prints_json_and_markdown_too() -> None:
    """Every command that prints takes --format (issue 9): check's figures as data and a table."""
    code, out = run("check", "llama-tiny", "-s", "amp-fp32", "--device", "cpu", "--format", "json")
    assert code == 0
    (record,) = json.loads(out)
    assert record["setting"] == "amp-fp32" and record["disagreements"] == []
    assert record["check"]["compared"] > 0 and record["check"]["disagreements"] == 0
    code, out = run(
        "check", "llama-tiny", "-s", "amp-fp32", "--device", "cpu", "--format", "markdown"
    )
    assert code == 0 and out.splitlines()[0].startswith("| model | setting | nodes compared |")
    assert f"| `llama-tiny` | amp-fp32 | {record['check']['compared']} | 0 | 0 | 0 |" in out


def test_verify_prints_its_record_as_json() -> None:
    code, out = run("verify", "llama-tiny", "-s", "fp32", "--device", "cpu", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["schema"] == "ampgraph.verify" and data["ok"] is True
    assert data["results"][0]["agreement"]["nodes"]["agree"] > 0


def test_a_factory_file_without_the_name_says_what_it_defines(tmp_path: Path) -> None:
    """The file imported: a missing name is a typo, not a missing installation."""
    factory = tmp_path / "mine.py"
    factory.write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(2, 2), torch.randn(1, 2)\n"
    )
    result = CliRunner().invoke(main, ["table", "--module", f"{factory}:buidl", "-s", "fp32"])
    assert result.exit_code == 1
    expected = f"Error: {factory} has no 'buidl'; it defines build: use {factory}:NAME\n"
    assert result.output == expected
