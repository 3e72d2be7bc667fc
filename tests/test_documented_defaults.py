"""The defaults the documentation states are the defaults the code has.

The truth here is the prose a researcher reads: the config module's
docstring (the base config is the ideal machine), ``OpticsConfig``'s
("the geometry defaults are those of the iris-like preset"),
docs/quantisation.md's table of mapping choices (each marks its default) and
docs/energy.md's table of energy defaults and their sources. A default
changed in the code without its document, or the other way round, fails.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re

import pytest

import optical
from optical.config import OpticalConfig

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def _value(cfg: OpticalConfig, path: str):
    """The value at a dotted path, properties (``adc.enob``) included."""
    section, name = path.split(".")
    return getattr(getattr(cfg, section), name)


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_base_config_is_the_ideal_machine_with_the_naive_mapping():
    """config.py: "photons_per_mac = inf (no shot noise), bits = None (no
    quantisation), zero dark and read noise, infinite contrast, no
    crosstalk"; docs/quantisation.md: "The base config's defaults (rms
    windows, no bypass, no compensation) are the naive mapping"."""
    cfg = OpticalConfig()
    assert cfg.source.photons_per_mac == math.inf
    assert cfg.source.rin_db_per_hz == -math.inf and cfg.source.rin_sigma == 0.0
    assert cfg.dac.bits is None and cfg.mask.bits is None and cfg.adc.bits is None
    assert cfg.adc.enob_loss == 0.0
    assert cfg.detector.dark_electrons == 0.0 and cfg.detector.read_noise_electrons == 0.0
    assert cfg.mask.contrast_ratio == math.inf and cfg.mask.min_transmission == 0.0
    assert cfg.optics.model == "ideal"
    assert cfg.adc.full_scale == "rms"
    assert cfg.outliers.policy == "none"
    assert cfg.mask.compensate is False
    # Analogue subtraction of the two rails is the default detection.
    assert cfg.detector.balanced is True
    assert cfg.mapping.attention == "digital"


def test_the_base_optics_geometry_is_iris_likes():
    """OpticsConfig: "The geometry defaults are those of the iris-like
    preset": switching the base optics to diffraction gives iris-like's."""
    base = OpticalConfig().optics
    iris = optical.presets.get("iris-like").optics
    assert iris.model == "diffraction"
    assert dataclasses.replace(base, model="diffraction") == iris


#: docs/quantisation.md's table: (path, the option it marks as the default).
_QUANTISATION_DEFAULTS = {
    "mask.scaling": "per_column",
    "dac.scaling": "per_token",
    "adc.full_scale": "rms",
    "adc.window": "per_column",
}


def _opening(text: str, index: int) -> int:
    """Index of the "(" that the first ")" after ``index`` closes."""
    depth = 0
    for i in range(index, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            if depth == 0:
                return i
            depth -= 1
    raise AssertionError(f"no parenthesis opens before {text[index:index + 20]!r}")


def test_docs_quantisation_marks_the_defaults_the_config_has():
    text = (DOCS / "quantisation.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| what | config | options |")
    cfg = OpticalConfig()
    found = {}
    for _what, paths, options in rows:
        row_paths = re.findall(r"`([a-z_]+\.[a-z_]+)`", paths)
        # "`name` (default)", "`name` abs-max (default)", "`name` (note; default)":
        # the option named last before the parenthesis that "default)" closes,
        # a choice of one of the row's paths (a row may mark one per path).
        marked = [re.findall(r"`([a-z_]+)`", options[:_opening(options, m.start())])[-1]
                  for m in re.finditer(r"default\)", options)]
        for option in marked:
            owners = [path for path in row_paths
                      if option in OpticalConfig.field_spec(path).get("choices", ())]
            assert len(owners) == 1 and owners[0] not in found, (option, options)
            found[owners[0]] = option
        numbers = re.findall(r"\(default (\d+)", options)
        if numbers:
            found[row_paths[0]] = int(numbers[0])
    assert found == {**_QUANTISATION_DEFAULTS, "calibration.max_tokens": 256}
    for path, default in found.items():
        assert _value(cfg, path) == default, path
    # "`outliers.threshold` (default 6) times the median of the nonzero channels'".
    threshold = re.search(r"`outliers\.threshold` \(default ([\d.]+)\)", text)
    assert float(threshold.group(1)) == cfg.outliers.threshold
    # The measured table's "default ADC windows (+-4 sigma of a uniform input)".
    headroom = re.findall(r"default ADC windows \(\+-(\d+) sigma", text)
    assert headroom and {float(h) for h in headroom} == {cfg.adc.headroom}


_UNITS = {"nm": 1e-9, "pJ": 1e-12, "fJ": 1e-15, "mJ": 1e-3, "GHz": 1e9, "kHz": 1e3,
          "W": 1.0, None: 1.0}


def _energy_table_defaults() -> list[tuple[str, str, object]]:
    """(path, "base" or "iris-like", value in SI) for every default docs/energy.md's
    "Defaults and their sources" table states."""
    text = (DOCS / "energy.md").read_text(encoding="utf-8")
    stated = []
    for path_cell, default_cell, _source in _table_rows(text, "| path | default | source |"):
        paths = re.findall(r"`([a-z_]+\.[a-z_]+)`", path_cell)
        if default_cell.startswith("None:"):   # derived from the Walden FOM
            stated += [(p, scope, None) for p in paths for scope in ("base", "iris-like")]
            continue
        parts = [part.strip() for part in default_cell.split(",")]
        row_scope = re.findall(r"\((base|iris-like)\)", default_cell)
        values = []
        for part in parts:
            number = re.match(r"(false|true|[-+\d.e]+)\s*([A-Za-z]+)?", part)
            assert number, (path_cell, part)
            raw, unit = number.groups()
            value = (raw == "true") if raw in ("true", "false") else float(raw) * _UNITS[unit]
            scope = re.findall(r"\((base|iris-like)\)", part) or row_scope[-1:]
            values.append((value, scope[0] if scope else None))
        if len(paths) == len(values):
            pairs = zip(paths, values, strict=True)
        else:                                    # one path, a value per config
            assert len(paths) == 1, path_cell
            pairs = [(paths[0], v) for v in values]
        for path, (value, scope) in pairs:
            for s in ([scope] if scope else ["base", "iris-like"]):
                stated.append((path, s, value))
    return stated


def test_docs_energy_table_states_the_defaults_of_the_base_config_and_iris_like():
    stated = _energy_table_defaults()
    paths = {path for path, _, _ in stated}
    # Every energy field is in the table, and nothing the config lacks.
    energy_fields = {f"energy.{f.name}" for f in dataclasses.fields(optical.config.EnergyConfig)}
    assert energy_fields <= paths
    configs = {"base": OpticalConfig(), "iris-like": optical.presets.get("iris-like")}
    for path, scope, value in stated:
        actual = _value(configs[scope], path)
        if value is None or isinstance(value, bool):
            assert actual is value, (path, scope)
        else:
            # The table rounds (0.71 pJ is 700 W / 989 TFLOP/s; 0.80 is 0.55 A/W at 850 nm).
            assert actual == pytest.approx(value, rel=0.01, abs=0), (path, scope)


def test_docs_quantisation_static_percentile_is_the_default():
    """docs/quantisation.md measures "a static input range (99.99th
    percentile)" with dac.percentile left at its default."""
    text = (DOCS / "quantisation.md").read_text(encoding="utf-8")
    stated = {float(p) for p in re.findall(r"\(([\d.]+)th percentile", text)}
    assert stated == {OpticalConfig().dac.percentile}
