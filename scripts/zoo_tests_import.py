"""How the zoo imports a transformers checkout's ``tests/`` (issue 42, docs/zoo.md): the test
files of its models and the suite's shared modules as ``tests.*``, also those of another release
than the installed transformers, what such a file imports and the installed release no longer
has given back where it names no model or config (:func:`use_tests`, :func:`import_tests`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import types
from pathlib import Path
from typing import Any


class _Lenient(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A ``tests.*`` module that is not on disk (the generation and export mixins a test file
    imports beside its tester) as an empty module whose every name is an empty class: a tester
    needs none of them, and the suite's own helpers (``ids_tensor``...) stay the real ones.

    The suite's shared modules that are on disk (``tests/*.py``, not a model's test file) load
    as they are, tolerantly: a name they lack is an empty class too (a test file imports
    ``CausalLMModelTest`` beside ``CausalLMModelTester``, and a copy may hold the tester only),
    and one that fails to load (``test_pipeline_mixin`` reads files of a whole checkout, such as
    ``tests/utils/tiny_model_summary.json``) is an empty module. A model's own test file loads
    strictly: what fails there is the record's finding."""

    def __init__(self, tests_dir: Path) -> None:
        self.tests_dir = tests_dir
        self.inner: dict[str, Any] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not name.startswith("tests.") or name.startswith("tests.models."):
            return None
        if on_disk(self.tests_dir, name):
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return None
            self.inner[name] = spec.loader
            spec.loader = self
            return spec
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType | None:
        if spec.name in self.inner:
            return None  # the default module, as the file's own loader makes it
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__getattr__ = _empty_class  # type: ignore[attr-defined]
        inner = self.inner.get(module.__name__)
        if inner is None:
            return
        try:
            inner.exec_module(module)
        except Exception:  # noqa: BLE001 - a mixin that needs the whole checkout: no tester's
            for key in [k for k in vars(module) if not k.startswith("__")]:
                delattr(module, key)


def _empty_class(attr: str) -> type:
    """An empty module's name ``attr``: an empty class, except a dunder, which such a module
    lacks. ``inspect.getmodule`` reads every loaded module's ``__file__`` and calls
    ``.endswith`` on it (torch's data-dependent guard log does, in a draft export of blt's
    entropy patcher): a class there failed the capture of the model under analysis.

    >>> _empty_class("GenerationTesterMixin").__name__
    'GenerationTesterMixin'
    >>> _empty_class("__file__")
    Traceback (most recent call last):
    AttributeError: __file__
    """
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {})


def on_disk(tests_dir: Path, name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (tests_dir / rel).is_dir() or (tests_dir / rel).with_suffix(".py").is_file()


def use_tests(tests_dir: Path) -> None:
    """Make ``tests_dir`` (a transformers checkout's ``tests/``) importable as ``tests``, with
    the suite helpers test files of other releases import (:func:`_suite_helpers`)."""
    tests_dir = tests_dir.resolve()
    sys.path.insert(0, str(tests_dir.parent))
    sys.meta_path.insert(0, _Lenient(tests_dir))
    _suite_helpers()


def _unchanged(test: Any) -> Any:
    return test


def _available() -> bool:
    return True  # SDPA, which every torch this project supports has


def _from_parts(*keys: str) -> Any:
    """transformers 4.x's factory of a composite config from its parts' configs, given as
    ``keys`` (``from_text_vision_configs(text, vision, **kwargs)``).

    >>> from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
    >>> config = _from_parts("text_config", "vision_config")(
    ...     CLIPConfig, CLIPTextConfig(hidden_size=32), CLIPVisionConfig(), projection_dim=8)
    >>> config.text_config.hidden_size, config.projection_dim
    (32, 8)
    """

    def from_parts(cls: Any, *parts: Any, **kwargs: Any) -> Any:
        return cls(**{k: p.to_dict() for k, p in zip(keys, parts)}, **kwargs)

    return from_parts


def _suite_helpers() -> None:
    """Give back the test-suite helpers an older test file imports beside its tester and the
    installed transformers no longer has: decorators of its test cases,
    ``transformers.utils.cached_property`` (now ``functools``'), torch version flags, and the
    4.x factories of a composite config from its parts' configs (``from_text_vision_configs``:
    the config built from the parts' dicts, as the installed config's own ``__init__`` takes
    them). None is a model class or config: a tester whose config the installed models reject
    still fails, and is recorded so. Each job is its own process; no analysis reads these."""
    import functools

    import transformers
    import transformers.file_utils as file_utils
    import transformers.pytorch_utils as pytorch_utils
    import transformers.testing_utils as testing_utils
    import transformers.utils as utils

    given = {
        utils: {"cached_property": functools.cached_property, "is_torch_sdpa_available": _available},
        file_utils: {"cached_property": functools.cached_property},
        pytorch_utils: {"is_torch_greater_or_equal_than_1_10": True},
        transformers.PreTrainedConfig: {
            "from_text_vision_configs": classmethod(_from_parts("text_config", "vision_config")),
            "from_text_audio_configs": classmethod(_from_parts("text_config", "audio_config")),
        },
        testing_utils: dict.fromkeys(
            ("require_read_token", "require_torch_sdpa", "is_pt_tf_cross_test"), _unchanged
        ),
    }
    for module, names in given.items():
        for name, value in names.items():
            if name not in dir(module):
                setattr(module, name, value)


#: What an older test file imports that names no model or config: the lists of checkpoint
#: names transformers 4.x kept beside each model (``BROS_PRETRAINED_MODEL_ARCHIVE_LIST``).
ARCHIVE_LIST = re.compile(r"cannot import name '(\w+_PRETRAINED_\w*ARCHIVE_LIST)' from '([\w.]+)'")


def import_tests(module_name: str) -> types.ModuleType:
    """A model's test file, imported; a checkpoint list it imports and the installed
    transformers no longer has (:data:`ARCHIVE_LIST`) given back empty, the import tried again.

    >>> import_tests("json").__name__
    'json'
    """
    for _ in range(8):  # a file imports a few such lists, one per model part
        try:
            return importlib.import_module(module_name)
        except ImportError as exc:
            found = ARCHIVE_LIST.search(str(exc))
            if found is None or found.group(2) not in sys.modules:
                raise
            setattr(sys.modules[found.group(2)], found.group(1), [])
            sys.modules.pop(module_name, None)
    return importlib.import_module(module_name)
