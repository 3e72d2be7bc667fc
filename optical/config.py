"""The hardware description: frozen dataclasses, SI units, dotted-path access.

An :class:`OpticalConfig` describes one free-space optical matrix-vector
multiplier: its sources, input DAC, weight mask, optics, detectors, ADC, the
encoding of signed values, the core size, how transformer layers map onto
it, and what its energy and time cost (``energy``, read by
:mod:`optical.energy` only). Every field is reachable by a
dotted path (``"adc.bits"``), which is how :meth:`OpticalConfig.replace`, the
CLI (``--set adc.bits=6``) and sweeps (``--param adc.bits=4,6,8``) name it.

The ideal machine is the limit of the physics, not a separate code path:
``photons_per_mac = inf`` (no shot noise), ``bits = None`` (no quantisation),
zero dark and read noise, infinite contrast, no crosstalk.

Units are SI (m, s, Hz, W, J) or counts (photons, electrons); each field's
docstring entry gives its unit after the type.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from optical._config_fields import Section, check, field_units, parse
from optical._config_sections import (  # the sections and their limits live there
    MAX_BITS,  # noqa: F401 (public here, as before the split)
    MAX_FINITE_PHOTONS_PER_MAC,  # noqa: F401
    MIN_PHOTONS_PER_MAC,  # noqa: F401
    ADCConfig,
    CalibrationConfig,
    CoreConfig,
    DACConfig,
    DetectorConfig,
    EncodingConfig,
    EnergyConfig,
    MappingConfig,
    MaskConfig,
    OpticsConfig,
    OutliersConfig,
    SourceConfig,
)
from optical._files import read_plain
from optical._validation import DuplicateKeyError, parse_json

__all__ = [
    "ADCConfig",
    "CalibrationConfig",
    "CoreConfig",
    "DACConfig",
    "DetectorConfig",
    "EncodingConfig",
    "EnergyConfig",
    "MappingConfig",
    "MaskConfig",
    "OpticalConfig",
    "OpticsConfig",
    "OutliersConfig",
    "SourceConfig",
]

#: Largest file :meth:`OpticalConfig.from_file` reads (a config, or a report holding one).
_CONFIG_FILE_BYTES = 1 << 24


def check_value(path: str, value: Any) -> Any:
    """Validate one value for the field at a dotted ``path`` on its own (not
    against other fields); return it in canonical form.

    Raises
    ------
    ValueError
        Naming the path for an unknown path or an invalid value.
    """
    return check(path, value, OpticalConfig.field_spec(path), OpticalConfig.field_unit(path))


def parse_value(path: str, text: str) -> Any:
    """Parse a command-line string (``"6"``, ``"inf"``, ``"none"``, ``"true"``)
    into a value of the kind the field at ``path`` holds.

    Raises
    ------
    ValueError
        If ``path`` is unknown or ``text`` does not parse to a valid value.
    """
    return parse(path, text, OpticalConfig.field_spec(path), OpticalConfig.field_unit(path))


# --------------------------------------------------------------------------- #
# The whole machine
# --------------------------------------------------------------------------- #

_SECTIONS: dict[str, type[Section]] = {
    "source": SourceConfig,
    "dac": DACConfig,
    "mask": MaskConfig,
    "optics": OpticsConfig,
    "detector": DetectorConfig,
    "adc": ADCConfig,
    "encoding": EncodingConfig,
    "core": CoreConfig,
    "mapping": MappingConfig,
    "outliers": OutliersConfig,
    "calibration": CalibrationConfig,
    "energy": EnergyConfig,
}


#: The sections' derived properties, by path: what each is made of.
_DERIVED = {
    "source.rin_sigma": "sqrt(10**(source.rin_db_per_hz / 10) * source.rin_bandwidth)",
    "mask.min_transmission": "1 / mask.contrast_ratio",
    "adc.enob": "adc.bits - adc.enob_loss",
}


#: The fields :meth:`OpticalConfig.unread` decides by: whether another field
#: counts depends on these alone.
UNREAD_CONDITIONS = ("adc.bits", "adc.full_scale", "dac.scaling", "optics.model",
                     "outliers.policy")


@dataclasses.dataclass(frozen=True)
class OpticalConfig:
    """A complete, immutable description of one optical matmul accelerator.

    Change it with :meth:`replace` (``cfg.replace({"adc.bits": 6})``); it is
    hashable and round-trips exactly through :meth:`to_dict` / :meth:`from_dict`
    and :meth:`to_json` / :meth:`from_json`.
    """

    source: SourceConfig = dataclasses.field(default_factory=SourceConfig)
    dac: DACConfig = dataclasses.field(default_factory=DACConfig)
    mask: MaskConfig = dataclasses.field(default_factory=MaskConfig)
    optics: OpticsConfig = dataclasses.field(default_factory=OpticsConfig)
    detector: DetectorConfig = dataclasses.field(default_factory=DetectorConfig)
    adc: ADCConfig = dataclasses.field(default_factory=ADCConfig)
    encoding: EncodingConfig = dataclasses.field(default_factory=EncodingConfig)
    core: CoreConfig = dataclasses.field(default_factory=CoreConfig)
    mapping: MappingConfig = dataclasses.field(default_factory=MappingConfig)
    outliers: OutliersConfig = dataclasses.field(default_factory=OutliersConfig)
    calibration: CalibrationConfig = dataclasses.field(default_factory=CalibrationConfig)
    energy: EnergyConfig = dataclasses.field(default_factory=EnergyConfig)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name}: expected an instance of {cls.__name__}, got "
                                f"{type(getattr(self, name)).__name__}")

    def __str__(self) -> str:
        """The config as a table, one field a line (path, value, unit), under
        a line naming it as :func:`optical.presets.describe` does; ``repr``
        stays the dataclass's (1,500 characters on one line)."""
        from optical.presets import describe  # presets imports this module

        return f"OpticalConfig: {describe(self)}\n{self._table()}"

    def _table(self) -> str:
        """Path, value and unit of every field, under a header (``optical config``)."""
        lines = [f"{'path':34s} {'value':22s} unit"]
        lines += [f"{path:34s} {value!r:22s} {self.field_unit(path)}".rstrip()
                  for path, value in self.items()]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython and Jupyter show a config as its table (``str``)."""
        printer.text(str(self))

    # -- dotted paths ------------------------------------------------------- #

    @staticmethod
    def paths() -> list[str]:
        """Every valid dotted path, in declaration order."""
        return [f"{name}.{f.name}" for name, cls in _SECTIONS.items()
                for f in dataclasses.fields(cls)]

    @staticmethod
    def field_spec(path: str) -> Mapping[str, Any]:
        """The validation spec of the field at ``path``; ValueError if unknown."""
        if not isinstance(path, str):
            raise TypeError(f"config path: expected a dotted string such as 'adc.bits', got "
                            f"{type(path).__name__} {path!r}")
        section, _, leaf = path.partition(".")
        if section not in _SECTIONS:
            raise ValueError(f"unknown config path {path!r}: no section {section!r}; "
                             f"valid sections: {', '.join(_SECTIONS)}")
        fields = {f.name: f for f in dataclasses.fields(_SECTIONS[section])}
        if leaf not in fields:
            if path in _DERIVED:  # a property of the section, read in docs and papers
                raise ValueError(f"config path {path!r} is derived, not set: it is "
                                 f"{_DERIVED[path]}; set those")
            valid = ", ".join(f"{section}.{n}" for n in fields) or "(none yet)"
            raise ValueError(f"unknown config path {path!r}; valid paths in "
                             f"{section!r}: {valid}")
        return fields[leaf].metadata

    @staticmethod
    def field_unit(path: str) -> str:
        """The unit of the field at ``path`` as its section's docstring gives
        it (``"m"``, ``"J per load"``, ``"dimensionless"``), or ``""`` for a
        count, choice or flag that has none; ValueError if unknown."""
        OpticalConfig.field_spec(path)
        section, _, leaf = path.partition(".")
        return field_units(_SECTIONS[section]).get(leaf, "")

    def get(self, path: str) -> Any:
        """The value at a dotted path."""
        self.field_spec(path)
        section, _, leaf = path.partition(".")
        return getattr(getattr(self, section), leaf)

    def replace(self, changes: Mapping[str, Any] | None = None, /, **kwargs: Any) -> OpticalConfig:
        """A copy with the given dotted-path fields changed.

        Parameters
        ----------
        changes : mapping of str to value
            ``{"adc.bits": 6, "source.photons_per_mac": 30.0}``.
        **kwargs
            Whole sections, e.g. ``adc=ADCConfig(bits=6)``.

        Raises
        ------
        ValueError
            Naming the path for an unknown path or an out-of-range value.
        TypeError
            ``changes`` not a mapping, or a path not a string.
        """
        if changes is not None and not isinstance(changes, Mapping):
            raise TypeError(f"changes: expected a mapping of dotted paths to values, such as "
                            f"{{'adc.bits': 6}}, got {type(changes).__name__}")
        by_section: dict[str, dict[str, Any]] = {}
        for path, value in (changes or {}).items():
            spec = self.field_spec(path)
            section, _, leaf = path.partition(".")
            by_section.setdefault(section, {})[leaf] = check(path, value, spec,
                                                             self.field_unit(path))
        new_sections = dict(kwargs)
        for name, section in new_sections.items():
            if name not in _SECTIONS:
                # replace(**{"adc.bits": 6}) or replace(bits=6): a field, not a section
                paths = [f"{key}.{name.partition('.')[2] if '.' in name else name}"
                         for key, spec in _SECTIONS.items()
                         if ("." not in name or name.partition(".")[0] == key)
                         and (name.partition(".")[2] or name)
                         in {f.name for f in dataclasses.fields(spec)}]
                hint = "" if not paths else (
                    " (keywords are whole sections; a field is changed by its dotted path "
                    f"in a mapping: replace({{{paths[0]!r}: value}})"
                    + (f"; {name} is {', '.join(paths)}" if len(paths) > 1 else "") + ")")
                raise ValueError(f"unknown config section {name!r}; valid: "
                                 f"{', '.join(_SECTIONS)}{hint}")
            if not isinstance(section, _SECTIONS[name]):  # before a dotted change edits it
                raise TypeError(f"{name}: expected an instance of {_SECTIONS[name].__name__}, "
                                f"got {type(section).__name__}")
        for section, fields in by_section.items():
            base = new_sections.get(section, getattr(self, section))
            new_sections[section] = dataclasses.replace(base, **fields)
        return dataclasses.replace(self, **new_sections)

    def diff(self, other: OpticalConfig) -> list[str]:
        """Dotted paths whose values differ between two configs."""
        if not isinstance(other, OpticalConfig):  # a dict's get() would differ everywhere
            raise TypeError(f"other: expected an OpticalConfig, got {type(other).__name__}")
        return [p for p in self.paths() if self.get(p) != other.get(p)]  # no NaN: validated

    def unread(self, path: str) -> str | None:
        """Why the field ``path`` cannot change what this config computes,
        given its other fields (:data:`UNREAD_CONDITIONS`; None: it may):
        ``adc.headroom`` sets the "rms" window alone, the ADC's window and
        noise fields do nothing without ``adc.bits``,
        ``dac.percentile`` sets a "static" range alone, ideal optics read no
        other ``optics.*`` field nor ``mask.compensate``, and outlier rules
        do nothing with ``outliers.policy`` "none". Only these rules of the
        accuracy arithmetic are known here (``energy.*`` prices the machine
        and is never called unread). ValueError names an unknown path."""
        self.field_spec(path)
        section, _, name = path.partition(".")
        # Not adc.full_scale: on JAX a calibrated ADC runs another program
        # than the rule-based ones, whose counts round otherwise.
        if path in ("adc.enob_loss", "adc.headroom", "adc.window") and self.adc.bits is None:
            return "adc.bits is None (an ideal ADC): no window or converter noise"
        if path == "adc.headroom" and self.adc.full_scale != "rms":
            return (f"adc.full_scale is {self.adc.full_scale!r}: the headroom sets the 'rms' "
                    "window alone")
        if path == "dac.percentile" and self.dac.scaling != "static":
            return (f"dac.scaling is {self.dac.scaling!r}: the percentile sets the 'static' "
                    "input range alone")
        if self.optics.model == "ideal" and (
                (section == "optics" and name != "model") or path == "mask.compensate"):
            return "optics.model is 'ideal': no lens geometry, no crosstalk to compensate"
        if path in ("outliers.threshold", "outliers.top_k") and self.outliers.policy == "none":
            return "outliers.policy is 'none': no outlier channels are chosen"
        return None

    def items(self) -> Iterator[tuple[str, Any]]:
        """(dotted path, value) for every field."""
        for path in self.paths():
            yield path, self.get(path)

    # -- serialisation ------------------------------------------------------ #

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dict ``{section: {field: value}}``."""
        return {name: getattr(self, name).to_dict() for name in _SECTIONS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> OpticalConfig:
        """Inverse of :meth:`to_dict`. Missing fields take their defaults;
        unknown sections or fields raise ValueError naming them. Non-finite
        reals may be given as the strings ``"inf"``, ``"-inf"``."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping of sections, got {type(data).__name__}")
        changes: dict[str, Any] = {}
        for section, fields in data.items():
            if section not in _SECTIONS:  # even with no fields: a misspelt section
                nested = section.split(".", 1) if isinstance(section, str) else []
                hint = (f' (fields nest in their section: {{"{nested[0]}": {{"{nested[1]}": '
                        "...}})" if len(nested) == 2 and nested[0] in _SECTIONS else "")
                if section == "preset":  # a preset plus changes is a command line's
                    hint = (" (a config holds whole sections, missing fields taking "
                            "OpticalConfig()'s values, not a preset's: start from "
                            "optical.presets.get(NAME).replace(...), --preset NAME --set "
                            "path=value, or a file written by optical config --preset NAME "
                            "--json FILE)")
                raise ValueError(f"unknown config section {section!r}{hint}; valid sections: "
                                 f"{', '.join(_SECTIONS)}")
            if not isinstance(fields, Mapping):
                raise ValueError(f"{section}: expected a mapping of fields, got "
                                 f"{type(fields).__name__}")
            for leaf, value in fields.items():
                path = f"{section}.{leaf}"
                spec = cls.field_spec(path)
                if spec["kind"] == "real" and isinstance(value, str):
                    value = parse_value(path, value)
                changes[path] = value
        return cls().replace(changes)

    def to_json(self, **kwargs: Any) -> str:
        """JSON text; infinities are written as the strings "inf" / "-inf" so
        the text is standard JSON."""
        def encode(v: Any) -> Any:
            if isinstance(v, float) and math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return v
        data = {s: {k: encode(v) for k, v in d.items()} for s, d in self.to_dict().items()}
        return json.dumps(data, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> OpticalConfig:
        """Inverse of :meth:`to_json` (JSON text; a file: :meth:`from_file`)."""
        try:
            data = parse_json(text, unique_keys=True, parse_float=_json_number)
        except json.JSONDecodeError as err:
            if isinstance(text, str) and text.strip()[:1] not in ("", "{", "["):
                raise ValueError(f"text: not JSON ({err}); from_json reads JSON text: for "
                                 f"a file, OpticalConfig.from_file({text.strip()!r})") from None
            raise
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> OpticalConfig:
        """The config in the JSON file ``path``: :meth:`to_json`'s sections
        (what ``optical config --json FILE`` writes), or a command's JSON
        report holding them under ``"config"`` (``optical validate`` /
        ``optical energy --json``), not both; fields it leaves out take
        ``OpticalConfig()``'s values. ValueError names the file and what is
        wrong with it."""
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path: expected a file path, got {type(path).__name__}")
        try:
            # read_plain: a FIFO would block for ever, /dev/zero fill the memory.
            text = read_plain(Path(path), _CONFIG_FILE_BYTES).decode("utf-8-sig")  # a BOM,
        except (OSError, UnicodeDecodeError) as err:  # as some editors write
            reason = (err.strerror or str(err)) if isinstance(err, OSError) \
                else f"not text ({err})"
            raise ValueError(f"{path}: {reason}") from None
        try:
            data = parse_json(text, unique_keys=True, parse_float=_json_number)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
        except DuplicateKeyError as err:
            raise ValueError(f"{path}: {err}") from None
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            beside = [k for k in data if k in _SECTIONS]
            if beside:  # which is the config? (a report holds none of these)
                raise ValueError(f"{path}: config sections both under \"config\" (as a "
                                 f"report holds them) and beside it ({', '.join(beside)}); "
                                 "keep one place")
            data = data["config"]  # a report of optical validate / energy
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from None


def _json_number(text: str) -> float | str:
    """A JSON number of a config; one past float range (inf), or underflowing
    to 0, is kept as its text, which ``from_dict`` refuses naming the field,
    as ``--set`` refuses it (infinity is written out: "inf")."""
    value = float(text)
    mantissa = text.lower().partition("e")[0]
    if math.isinf(value) or (value == 0 and mantissa.strip("-+0.") != ""):
        return text
    return value


def check_config(config: object, name: str = "config") -> OpticalConfig:
    """Return ``config`` if it is an :class:`OpticalConfig`, else raise a
    TypeError naming ``name`` (and, for a preset's name, how to get it)."""
    if not isinstance(config, OpticalConfig):
        hint = (f" (for the preset {config!r}: optical.presets.get({config!r}))"
                if isinstance(config, str) else "")
        raise TypeError(f"{name}: expected an OpticalConfig, got {type(config).__name__}{hint}")
    return config
