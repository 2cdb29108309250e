"""Settings: the (device type, autocast on/off, autocast dtype, parameter dtype) a model runs in.

The seed notebook compares four settings, which are ampgraph's default matrix:

========== ========= ==========================
name       autocast  parameters
========== ========= ==========================
fp32       off       fp32
half       off       the 16-bit dtype (bf16/fp16)
amp-fp32   on        fp32
amp-half   on        the 16-bit dtype
========== ========= ==========================

Any other combination is spelled ``autocast=on,params=fp16`` (keys: ``autocast``, ``params``,
``dtype``, ``device``), so a setting always has a name that round-trips through the CLI.

A framework's precision recipe (:mod:`ampgraph.recipes`) also says what happens around the
parameters, and a setting holds that too, after a preset or the keys above: ``inputs=bf16``
(floating inputs cast before the forward, as FSDP2's ``cast_forward_inputs`` does),
``buffers=fp32`` (floating buffers kept in that dtype while the parameters are cast, as FSDP2
does) and ``outputs=fp32`` (floating outputs cast after it, as Accelerate's
``convert_outputs_to_fp32`` does): ``half,inputs=bf16,buffers=fp32``. Left out, each is what
``Module.to(dtype)`` and a plain call do, and the setting's dictionary has no such key, so
reports and cache keys written before these keys existed still read the same.

This module is torch-free: dtypes are names (``"float32"``, ``"bfloat16"``) and are turned into
``torch.dtype`` by the stages that need torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from ampgraph.errors import SettingError, clip

#: Canonical torch dtype names and the short names people type and diagrams print.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}
SHORT_DTYPE: dict[str, str] = {
    "float64": "fp64",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "int64": "int64",
    "int32": "int32",
    "bool": "bool",
}
#: The device types ampgraph analyses: those whose autocast kernels ATen registers in-tree and
#: ampgraph has lists for (:mod:`ampgraph.policy`). None needs the device: fake tensors on it run
#: its real autocast kernels.
DEVICE_TYPES = ("cuda", "cpu", "xpu", "mps")
#: Device types with an autocast dispatch key whose kernels an out-of-tree plugin registers, and
#: the plugin's module (None: whichever backend claims PrivateUse1).
PLUGIN_DEVICE_TYPES: dict[str, str | None] = {
    "hpu": "habana_frameworks",
    "ipu": "poptorch",
    "privateuseone": None,
}
AMP_DTYPES = ("bfloat16", "float16")
PRESETS = ("fp32", "half", "amp-fp32", "amp-half")
#: What a recipe adds to a setting: the keys of its spelling, and its fields, in one order.
EXTRA_KEYS = ("inputs", "buffers", "outputs")
EXTRA_FIELDS = ("input_dtype", "buffer_dtype", "output_dtype")


def check_device_type(device_type: str) -> str:
    """``device_type`` if ampgraph analyses it; else a :class:`SettingError` in one line that
    says why: an unknown name (with those that exist), or one whose autocast kernels come from
    a plugin.

    >>> check_device_type("mps")
    'mps'
    >>> check_device_type("hpu")
    Traceback (most recent call last):
    ...
    ampgraph.errors.SettingError: hpu's autocast kernels are not torch's but come from an out-of-tree plugin, habana_frameworks, not installed here, and ampgraph has no lists for them: analyse with --device cuda, cpu, xpu or mps
    """
    if device_type in DEVICE_TYPES:
        return device_type
    if device_type in PLUGIN_DEVICE_TYPES:
        plugin = PLUGIN_DEVICE_TYPES[device_type]
        if plugin is None:
            where = "an out-of-tree backend that renames PrivateUse1"
        else:  # find_spec looks for the plugin without importing it (nor torch)
            installed = importlib.util.find_spec(plugin) is not None
            where = f"an out-of-tree plugin, {plugin}, {'installed' if installed else 'not installed'} here"
        raise SettingError(
            f"{device_type}'s autocast kernels are not torch's but come from {where}, and "
            f"ampgraph has no lists for them: analyse with --device {', '.join(DEVICE_TYPES[:-1])} or "
            f"{DEVICE_TYPES[-1]}"
        )
    raise SettingError(
        f"unknown device type {clip(device_type)}: use one of {', '.join(DEVICE_TYPES)} "
        f"({', '.join(PLUGIN_DEVICE_TYPES)} have autocast keys whose kernels come from plugins)"
    )


def canonical_dtype(name: str) -> str:
    """Return torch's name for a dtype given as ``bf16``, ``bfloat16``, ``torch.bfloat16``...

    >>> canonical_dtype("bf16")
    'bfloat16'
    """
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise SettingError(
            f"unknown dtype {clip(name)}: use one of fp32, bf16, fp16 (or float32, bfloat16, "
            "float16)"
        )
    return DTYPE_ALIASES[key]


def short_dtype(name: str | None) -> str:
    """The short name diagrams and tables print: ``float32`` -> ``fp32``.

    >>> short_dtype("bfloat16")
    'bf16'
    """
    if name is None:
        return "-"
    return SHORT_DTYPE.get(name, name)


@dataclass(frozen=True)
class Setting:
    """One way of running a model: what autocast does and what dtype the parameters have.

    >>> s = Setting.parse("amp-fp32")
    >>> (s.autocast, s.amp_dtype, s.param_dtype, s.device_type)
    (True, 'bfloat16', 'float32', 'cuda')
    >>> Setting.parse("autocast=on,params=fp16,dtype=fp16").name
    'amp-half'
    """

    device_type: str = "cuda"
    autocast: bool = False
    amp_dtype: str = "bfloat16"
    param_dtype: str = "float32"
    #: Floating inputs of the forward are cast to this before it runs (None: as given).
    input_dtype: str | None = None
    #: Floating buffers have this dtype (None: the parameters', as ``Module.to(dtype)`` does).
    buffer_dtype: str | None = None
    #: Floating outputs of the forward are cast to this after it returns (None: as computed).
    output_dtype: str | None = None

    def __post_init__(self) -> None:
        check_device_type(self.device_type)
        if self.amp_dtype not in AMP_DTYPES:
            raise SettingError(
                f"autocast dtype must be bf16 or fp16, not {short_dtype(self.amp_dtype)}"
            )
        if self.param_dtype not in ("float32", *AMP_DTYPES):
            raise SettingError(
                f"parameter dtype must be fp32, bf16 or fp16, not {self.param_dtype}"
            )
        for key, value in zip(EXTRA_KEYS, self._extras(), strict=True):
            if value is not None and value not in ("float32", *AMP_DTYPES):
                raise SettingError(f"{key} must be fp32, bf16 or fp16, not {value}")
        if self.buffer_dtype == self.param_dtype:
            # One spelling per setting (names and cache keys): buffers in the parameters' dtype
            # are what Module.to(dtype) gives anyway.
            object.__setattr__(self, "buffer_dtype", None)

    def _extras(self) -> tuple[str | None, str | None, str | None]:
        return (self.input_dtype, self.buffer_dtype, self.output_dtype)

    @property
    def buffers(self) -> str:
        """The dtype of the floating buffers in this setting.

        >>> Setting.parse("half").buffers, Setting.parse("half,buffers=fp32").buffers
        ('bfloat16', 'float32')
        """
        return self.buffer_dtype or self.param_dtype

    def floating_dtype(self, kind: str) -> str | None:
        """The dtype this setting gives a floating tensor of ``kind`` (``parameter``, ``buffer``
        or ``input``); None: the tensor keeps its own. Every stage that makes the model's tensors
        (the capture, the eager oracles, the real runs) asks here.

        >>> s = Setting.parse("half,inputs=bf16,buffers=fp32")
        >>> s.floating_dtype("parameter"), s.floating_dtype("buffer"), s.floating_dtype("input")
        ('bfloat16', 'float32', 'bfloat16')
        """
        if kind not in ("parameter", "buffer", "input"):
            raise ValueError(f"kind is parameter, buffer or input, not {kind!r}")
        return {"parameter": self.param_dtype, "buffer": self.buffers}.get(kind, self.input_dtype)

    @property
    def graph_key(self) -> tuple[str, ...]:
        """What a captured graph depends on besides autocast: settings with one key may share
        a graph (:func:`ampgraph.pipeline.sharing.shared_capture`).

        >>> Setting.parse("half").graph_key == Setting.parse("amp-half").graph_key
        True
        >>> Setting.parse("half").graph_key == Setting.parse("half,inputs=bf16").graph_key
        False
        """
        return (
            self.device_type,
            self.param_dtype,
            *(value or "-" for value in self._extras()),
        )

    @property
    def name(self) -> str:
        """Short name: one of the four presets when it is one, else a ``key=value`` spelling."""
        prefix = "amp-" if self.autocast else ""
        extras = "".join(
            f",{key}={short_dtype(value)}"
            for key, value in zip(EXTRA_KEYS, self._extras(), strict=True)
            if value is not None
        )
        if self.param_dtype == "float32":
            return f"{prefix}fp32{extras}"
        if self.param_dtype == self.amp_dtype:
            return f"{prefix}half{extras}"
        flag = "on" if self.autocast else "off"
        return f"autocast={flag},params={short_dtype(self.param_dtype)}{extras}"

    @property
    def title(self) -> str:
        """A human caption, e.g. ``autocast cuda bf16, parameters fp32``.

        >>> Setting.parse("half,inputs=bf16,buffers=fp32", device_type="cpu").title
        'no autocast, parameters bf16, buffers fp32, inputs cast to bf16'
        """
        amp = (
            f"autocast {self.device_type} {short_dtype(self.amp_dtype)}"
            if self.autocast
            else "no autocast"
        )
        out = f"{amp}, parameters {short_dtype(self.param_dtype)}"
        if self.buffer_dtype is not None:
            out += f", buffers {short_dtype(self.buffer_dtype)}"
        if self.input_dtype is not None:
            out += f", inputs cast to {short_dtype(self.input_dtype)}"
        if self.output_dtype is not None:
            out += f", outputs cast to {short_dtype(self.output_dtype)}"
        return out

    @property
    def slug(self) -> str:
        """A file-name-safe identifier that includes device and autocast dtype."""
        return f"{self.device_type}-{short_dtype(self.amp_dtype)}-{self.name}".replace(
            "=", "-"
        ).replace(",", "_")

    def to_dict(self) -> dict[str, object]:
        """The setting as reports and cache keys hold it; a key of ``EXTRA_FIELDS`` only where
        set, so that a setting without them reads as it did before they existed.

        >>> Setting.parse("fp32").to_dict()["name"], "input_dtype" in Setting.parse("fp32").to_dict()
        ('fp32', False)
        >>> Setting.from_dict(Setting.parse("half,outputs=fp32").to_dict()).output_dtype
        'float32'
        """
        data = asdict(self)
        for field in EXTRA_FIELDS:
            if data[field] is None:
                del data[field]
        return {"name": self.name, **data}

    @classmethod
    def parse(cls, text: str, *, device_type: str = "cuda", amp_dtype: str = "bfloat16") -> Setting:
        """Parse a preset name (``fp32``, ``half``, ``amp-fp32``, ``amp-half``) or ``k=v,...``.

        ``device_type`` and ``amp_dtype`` fill in what the text leaves out.
        """
        if isinstance(text, Setting):
            return text
        if not isinstance(text, str):
            raise SettingError(
                f"a setting is a name such as 'amp-fp32' or 'autocast=on,params=fp16', "
                f"not {type(text).__name__} {clip(text)}"
            )
        amp_dtype = canonical_dtype(amp_dtype)
        text = text.strip()
        if text in PRESETS:
            autocast = text.startswith("amp-")
            params = "float32" if text.endswith("fp32") else amp_dtype
            return cls(device_type, autocast, amp_dtype, params)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        preset = parts.pop(0) if parts and parts[0] in PRESETS else None
        fields: dict[str, str] = {}
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("autocast", "params", "dtype", "device", *EXTRA_KEYS):
                raise SettingError(
                    f"malformed setting {clip(text)}: use a preset ({', '.join(PRESETS)}) "
                    "or key=value pairs such as 'autocast=on,params=fp16' (after a preset: "
                    f"{', '.join(EXTRA_KEYS)}, e.g. 'half,inputs=bf16')"
                )
            if key.strip() in fields:
                raise SettingError(f"setting {clip(text)} gives {key.strip()} twice: give it once")
            fields[key.strip()] = value.strip().lower()
        if not fields and preset is None:
            raise SettingError(f"empty setting: use one of {', '.join(PRESETS)}")
        if preset is not None:
            base = cls.parse(preset, device_type=device_type, amp_dtype=amp_dtype)
            if not set(fields) <= {*EXTRA_KEYS, "device"}:
                raise SettingError(
                    f"setting {clip(text)} gives a preset and {', '.join(sorted(fields))}: after a "
                    f"preset give only {', '.join(EXTRA_KEYS)} or device"
                )
            fields.setdefault("device", base.device_type)
            fields["autocast"] = "on" if base.autocast else "off"
            fields["dtype"] = base.amp_dtype
            fields["params"] = base.param_dtype
        flag = fields.get("autocast", "off")
        if flag not in ("on", "off", "true", "false", "1", "0"):
            raise SettingError(f"autocast must be on or off, not {clip(flag)}")
        dtype = canonical_dtype(fields.get("dtype", amp_dtype))
        extras = {
            field: canonical_dtype(fields[key]) if key in fields else None
            for key, field in zip(EXTRA_KEYS, EXTRA_FIELDS, strict=True)
        }
        return cls(
            device_type=fields.get("device", device_type),
            autocast=flag in ("on", "true", "1"),
            amp_dtype=dtype,
            param_dtype=canonical_dtype(fields.get("params", "fp32")),
            **extras,
        )

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Setting:
        return cls(
            device_type=str(data["device_type"]),
            autocast=bool(data["autocast"]),
            amp_dtype=str(data["amp_dtype"]),
            param_dtype=str(data["param_dtype"]),
            # Reports written before these fields existed have none: None, as then.
            **{f: (None if data.get(f) is None else str(data[f])) for f in EXTRA_FIELDS},
        )


def caption(setting: dict[str, object]) -> str:
    """A report's setting (its dictionary) in words, recipe parts included: what every text
    format puts after the setting's name.

    >>> caption(Setting.parse("half,inputs=bf16,buffers=fp32").to_dict())
    'no autocast, parameters bf16, buffers fp32, inputs cast to bf16'
    >>> caption({"name": "mine", "autocast": True, "device_type": "cuda", "amp_dtype": "float16"})
    'autocast cuda fp16, parameters -'
    """
    try:
        return Setting.from_dict(setting).title
    except (KeyError, SettingError):  # a hand-made report's partial setting: what it holds
        amp = (
            f"autocast {setting.get('device_type')} {short_dtype(str(setting.get('amp_dtype')))}"
            if setting.get("autocast")
            else "no autocast"
        )
        params = setting.get("param_dtype")
        return f"{amp}, parameters {short_dtype(str(params) if params else None)}"


def seed_matrix(device_type: str = "cuda", amp_dtype: str = "bfloat16") -> list[Setting]:
    """The seed notebook's four settings, in its order of presentation.

    >>> [s.name for s in seed_matrix()]
    ['fp32', 'half', 'amp-half', 'amp-fp32']
    """
    order = ("fp32", "half", "amp-half", "amp-fp32")
    return [Setting.parse(n, device_type=device_type, amp_dtype=amp_dtype) for n in order]
