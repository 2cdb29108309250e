"""The real device a verification runs on: which one, what it is called, whether weights fit.

>>> weight_bytes(nn.Linear(4, 2), torch.bfloat16)   # 8 weights and 2 biases, 2 bytes each
20
"""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch
from torch import nn

from ampgraph.errors import NoDeviceError, VerifyError
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import torch_dtype

NO_CUDA_MESSAGE = (
    "no CUDA device here: real CUDA verification needs a GPU; "
    "'ampgraph check --device cuda' checks against the dispatcher without one"
)


def device_name(device: str | torch.device) -> str:
    """The GPU's name, or the CPU model: what a record says it ran on.

    >>> isinstance(device_name("cpu"), str)
    True
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def resolve_device(setting: Setting, device: str | torch.device | None = None) -> torch.device:
    """The real device to run on: ``device`` or the setting's device type, checked to exist.

    >>> resolve_device(Setting.parse("fp32", device_type="cpu"))
    device(type='cpu')
    """
    dev = torch.device(device if device is not None else setting.device_type)
    if dev.type != setting.device_type:
        raise VerifyError(
            f"device {dev} does not match the setting's device type {setting.device_type}: "
            f"pass a {setting.device_type} device"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NoDeviceError(NO_CUDA_MESSAGE)
    return dev


def weight_bytes(module: nn.Module, param_dtype: torch.dtype) -> int:
    """Bytes of real parameters and buffers ``verify`` materialises, as ``Module.to`` makes them."""
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) in seen:
            continue  # tied weights are materialised once
        seen.add(id(t))
        dtype = param_dtype if t.is_floating_point() else t.dtype
        total += t.numel() * dtype.itemsize
    return total


def available_memory(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes (MemAvailable for the CPU), or None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(
    model: ModelInputs, setting: Setting, device: torch.device, *, force: bool = False
) -> None:
    """Refuse, in one line and before any allocation, weights that cannot fit on ``device``."""
    need = weight_bytes(model.module, torch_dtype(setting.param_dtype))
    free = available_memory(device)
    if free is not None and need > 0.8 * free and not force:
        raise VerifyError(
            f"verify needs about {need / 1e9:.1f} GB of real weights for {model.name} "
            f"({setting.name}) and {device} has {free / 1e9:.1f} GB free: verify a smaller model "
            "(the dispatcher check, 'ampgraph check', needs no weights), or pass --force"
        )


__all__ = [
    "NO_CUDA_MESSAGE",
    "available_memory",
    "check_memory",
    "device_name",
    "resolve_device",
    "weight_bytes",
]
