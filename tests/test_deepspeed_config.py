"""DeepSpeed configs read as DeepSpeed reads them (issue 35, item 5).

DeepSpeed validates its precision sections with pydantic: the boolean rule is checked here
against pydantic itself (installed with the test extras' Lightning), on every value Hypothesis
makes, and each refusal is one line through the CLI, on files the tests write.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampgraph.cli import main
from ampgraph.deepspeed_config import lax_bool, precision
from ampgraph.errors import SettingError
from ampgraph.recipes import parse_recipe

pydantic = pytest.importorskip("pydantic")


class _BF16(pydantic.BaseModel):  # the field as DeepSpeedBF16Config declares it
    enabled: bool = False


def _pydantic_bool(value: Any) -> bool | None:
    try:
        return _BF16(enabled=value).enabled
    except pydantic.ValidationError:
        return None


_WORDS = ["0", "1", "on", "off", "t", "f", "y", "n", "yes", "no", "true", "false", "auto", "2"]
BOOL_VALUES = (
    st.sampled_from(_WORDS).flatmap(
        lambda w: st.sampled_from([w, w.upper(), w.title(), f" {w}", f"{w} "])
    )
    | st.text(max_size=6)
    | st.integers(-3, 3)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, 1.0, 0.5, None, True, False, [], {}, [True], {"a": 1}])
)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    return f"deepspeed:{path}"


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=BOOL_VALUES)
def test_the_boolean_rule_is_pydantics(value: Any) -> None:
    assert lax_bool(value) == _pydantic_bool(value)
    config = {"bf16": {"enabled": value}}
    if value == "auto":
        with pytest.raises(SettingError, match="hf:bf16"):
            precision(config, "ds.json")  # the HF Trainer fills it in: say what to write
        return
    expected = _pydantic_bool(value)
    if expected is None:
        with pytest.raises(SettingError, match="bf16.enabled") as info:
            precision(config, "ds.json")
        assert "\n" not in str(info.value) and len(str(info.value)) < 300
    else:
        assert precision(config, "ds.json").bf16 is expected


@settings(max_examples=200, deadline=None)
@given(
    config=st.dictionaries(
        st.sampled_from(["bf16", "bfloat16", "fp16", "data_types", "communication_data_type",
                         "torch_autocast", "zero_optimization"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
            lambda inner: st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(["enabled", "auto_cast", "grad_accum_dtype",
                                               "buffer_dtype", "param_dtype", "x"]), inner,
                              max_size=3),
            max_leaves=6,
        ),
        max_size=4,
    )
)  # fmt: skip
def test_any_config_is_a_recipe_or_one_line(config: dict[str, Any]) -> None:
    try:
        facts = precision(config, "ds.json")
    except SettingError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("ds.json: ")
        return
    assert not (facts.bf16 and facts.fp16)


@pytest.mark.parametrize(
    ("enabled", "bf16"),
    [('"false"', False), ('"off"', False), ('"0"', False), ("0", False), ('"no"', False),
     ('"true"', True), ('"on"', True), ('"1"', True), ("1", True), ("1.0", True)],
)  # fmt: skip
def test_booleans_as_deepspeed_reads_them(tmp_path: Path, enabled: str, bf16: bool) -> None:
    recipe = parse_recipe(write(tmp_path, f'{{"bf16": {{"enabled": {enabled}}}}}'))
    assert recipe.setting.param_dtype == ("bfloat16" if bf16 else "float32")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"bf16": {"enabled": NaN}}', "NaN"),
        ('{"bf16": {"enabled": {}}}', "bf16.enabled is {}"),
        ('{"bf16": {"enabled": null}}', "bf16.enabled is None"),
        ('{"bf16": {"enabled": 2}}', "boolean"),
        ('{"bf16": {"enabled": true}, "bf16": {"enabled": false}}', "'bf16' twice"),
        ('{"fp16": null}', "fp16 is None, not an object"),
        ('{"bf16": [1]}', "bf16 is [1], not an object"),
        ('{"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": 16}}', "is 16, not a"),
        ('{"fp16": {"enabled": true}, "communication_data_type": 16}', "is 16, not a dtype"),
        ('{"bf16": {"enabled": true}, "data_types": {"param_dtype": "fp16"}}', "conflicts"),
        ('{"data_types": null}', "data_types is None"),
        ('{"bf16": {"enabled": true}} // a comment', "Hjson"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
        ("null", "not a JSON object"),
        ('{"bf16": {"enabled": true}, "fp16": {"enabled": "yes"}}', "both enabled"),
    ],
)
def test_each_refusal_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    spec = write(tmp_path, text)
    with pytest.raises(SettingError, match=re.escape(says)) as info:
        parse_recipe(spec)
    assert "\n" not in str(info.value)
    result = CliRunner().invoke(main, ["table", "--recipe", spec, "--device", "cpu"])
    assert result.exit_code == 2 and says.split()[0] in result.output
    assert "Traceback" not in result.output


def test_the_old_bfloat16_section_and_auto_fields(tmp_path: Path) -> None:
    """``bf16: null`` falls back to ``bfloat16`` (get_bfloat16_config); ``bf16: {}`` does not;
    a field set to "auto" is dropped (DeepSpeedConfigModel, non-strict): its default holds."""
    old = parse_recipe(write(tmp_path, '{"bf16": null, "bfloat16": {"enabled": true}}'))
    assert old.setting.param_dtype == "bfloat16"
    empty = parse_recipe(write(tmp_path, '{"bf16": {}, "bfloat16": {"enabled": true}}'))
    assert empty.setting.param_dtype == "float32"
    fp16 = parse_recipe(write(tmp_path, '{"fp16": {"enabled": true, "auto_cast": "auto"}}'))
    assert fp16.input_cast is None  # auto_cast's default, False
    on = parse_recipe(write(tmp_path, '{"fp16": {"enabled": true, "auto_cast": "on"}}'))
    assert on.input_cast == "float16"


def test_a_hostile_value_is_cut_in_the_error(tmp_path: Path) -> None:
    spec = write(tmp_path, json.dumps({"bf16": {"enabled": "x" * 100_000}}))
    with pytest.raises(SettingError) as info:
        parse_recipe(spec)
    assert len(str(info.value)) < 400 and "\u2026" in str(info.value)
    with pytest.raises(SettingError) as info:
        parse_recipe("hf:" + "y" * 100_000)
    assert len(str(info.value)) < 400
