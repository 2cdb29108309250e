"""The Python API's arguments, checked once where each public entry point receives them, with
ampgraph's own error (:class:`~ampgraph.errors.ArgumentError`, a ``TypeError`` and a
``ValueError`` too): a wrong type or a value out of range is one line naming the argument, never
an error deep inside torch. Torch-free.

>>> integer("seq_len", "8", minimum=1)
Traceback (most recent call last):
...
ampgraph.errors.ArgumentError: seq_len must be an integer, not str ('8')
>>> [s.name for s in settings("amp-fp32")]
['amp-fp32']
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ampgraph.errors import ArgumentError
from ampgraph.settings import Setting

#: The bound on an analysis in seconds (0 or None: no bound), as ``--timeout`` takes it.
MIN_TIMEOUT: float = 1
MAX_TIMEOUT: float = 7 * 24 * 3600
#: The largest seed torch's generators take (``torch.Generator.manual_seed``): 64 bits.
MAX_SEED = 2**64 - 1


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def integer(name: str, value: Any, *, minimum: int | None = None,
            maximum: int | None = None) -> int:  # fmt: skip
    """``value`` as the integer argument ``name``: an ``int`` (not a ``bool``, a string or a
    float), from ``minimum`` to ``maximum``.

    >>> integer("workers", 2, minimum=1)
    2
    >>> integer("seq_len", 2.5, minimum=1)
    Traceback (most recent call last):
    ...
    ampgraph.errors.ArgumentError: seq_len must be an integer, not float (2.5)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{name} must be an integer, not {type(value).__name__} "
                            f"({_shown(value)})")  # fmt: skip
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "" if minimum is None else f"from {minimum:,} "
        high = "" if maximum is None else f"to {maximum:,}"
        raise ArgumentError(f"{name} is {value:,}, out of range: give an integer {low}{high}"
                            .rstrip())  # fmt: skip
    return int(value)


def seed(value: Any) -> int:
    """A random seed: an integer of 64 bits at most, not negative.

    >>> seed(2**64)
    Traceback (most recent call last):
    ...
    ampgraph.errors.ArgumentError: seed is 18,446,744,073,709,551,616, out of range: give an integer from 0 to 18,446,744,073,709,551,615
    """
    return integer("seed", value, minimum=0, maximum=MAX_SEED)


def timeout(value: Any) -> float | None:
    """A bound in seconds: None for None or 0 (no bound), else a finite number from
    :data:`MIN_TIMEOUT` to :data:`MAX_TIMEOUT` (a string, ``inf``, NaN or a negative is refused).

    >>> timeout(0), timeout(90)
    (None, 90.0)
    >>> timeout(float("inf"))
    Traceback (most recent call last):
    ...
    ampgraph.errors.ArgumentError: timeout is inf seconds, out of range: give None or 0 (no bound), or 1 to 604800 (a week)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"timeout must be a number of seconds, not {type(value).__name__} "
                            f"({_shown(value)})")  # fmt: skip
    if value == 0:
        return None
    if math.isnan(value) or not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise ArgumentError(f"timeout is {value:g} seconds, out of range: give None or 0 (no "
                            f"bound), or {MIN_TIMEOUT:g} to {MAX_TIMEOUT:g} (a week)")  # fmt: skip
    return float(value)


def workers(value: Any) -> int | None:
    """How many worker processes: None (one per core) or an integer from 1.

    >>> workers(None), workers(2)
    (None, 2)
    """
    return None if value is None else integer("workers", value, minimum=1)


def path(name: str, value: Any) -> Path | None:
    """A file or folder argument: None, a ``str`` or an ``os.PathLike`` (a ``Path``), as a Path.

    >>> path("weights_dir", "/tmp")
    PosixPath('/tmp')
    """
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return Path(text)
    raise ArgumentError(f"{name} must be a path (a str or a Path), not {type(value).__name__} "
                        f"({_shown(value)})")  # fmt: skip


def settings(value: Any, *, device_type: str = "cuda",
             amp_dtype: str = "bfloat16") -> tuple[Setting, ...]:  # fmt: skip
    """Settings as the API takes them: one :class:`~ampgraph.settings.Setting` or name (one
    setting, not its characters), or a sequence of them, at least one (names parsed with
    ``device_type`` and ``amp_dtype``).

    >>> [s.name for s in settings(["fp32", "amp-fp32"], device_type="cpu")]
    ['fp32', 'amp-fp32']
    >>> settings([])
    Traceback (most recent call last):
    ...
    ampgraph.errors.ArgumentError: settings is empty: give at least one setting (a Setting or a name such as 'amp-fp32')
    """
    if isinstance(value, (str, Setting)):
        value = (value,)
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise ArgumentError(f"settings must be a setting's name, a Setting or a list of them, "
                            f"not {type(value).__name__} ({_shown(value)})")  # fmt: skip
    if not value:
        raise ArgumentError("settings is empty: give at least one setting (a Setting or a "
                            "name such as 'amp-fp32')")  # fmt: skip
    # Setting.parse refuses what is no name with its own SettingError, which says what a name is.
    return tuple(
        item if isinstance(item, Setting)
        else Setting.parse(item, device_type=device_type, amp_dtype=amp_dtype)
        for item in value
    )  # fmt: skip


__all__ = ["MAX_SEED", "MAX_TIMEOUT", "MIN_TIMEOUT", "integer", "path", "seed", "settings",
           "timeout", "workers"]  # fmt: skip
