import contextlib
import dataclasses
import json
import math
import os
import re
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import optical
from optical.config import ADCConfig, OpticalConfig, parse_value
from optical.physics import noise


def test_replace_by_dotted_path_returns_new_config():
    base = optical.presets.get("iris-like")
    cfg = base.replace({"adc.bits": 6, "source.photons_per_mac": 30})
    assert cfg.adc.bits == 6 and cfg.source.photons_per_mac == 30.0
    assert base.adc.bits == 8  # unchanged: configs are immutable
    assert sorted(cfg.diff(base)) == ["adc.bits", "source.photons_per_mac"]


def test_configs_are_frozen_and_hashable():
    cfg = optical.presets.get("iris-like")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.adc.bits = 4
    assert hash(cfg) == hash(optical.presets.get("iris-like"))
    assert len({cfg, cfg.replace({"adc.bits": 6})}) == 2


@pytest.mark.parametrize("path", ["adc.bitz", "adcc.bits", "bits", "optics.focal_lengthx"])
def test_unknown_path_names_path_and_valid_choices(path):
    with pytest.raises(ValueError, match="unknown config path") as err:
        optical.presets.get("ideal").replace({path: 1})
    assert repr(path) in str(err.value)
    assert "valid" in str(err.value)


@pytest.mark.parametrize(("path", "value", "expect"), [
    ("adc.bits", 0, r"adc.bits: 0 is out of range; valid: integer in \[1, 24\]"),
    ("adc.bits", 25, "adc.bits: 25 is out of range"),
    ("dac.bits", 4.5, "dac.bits: 4.5 is not an integer"),
    ("mask.bits", True, "mask.bits"),
    ("source.photons_per_mac", -1.0, r"photons_per_mac: -1.0 is out of range; valid: number in \[1e-30, inf\] photons"),
    ("source.photons_per_mac", 0.0, "photons_per_mac"),
    ("source.photons_per_mac", math.nan, "photons_per_mac"),
    ("detector.read_noise_electrons", -0.1, "read_noise_electrons"),
    ("detector.shot_noise", "laplace", "valid: one of 'poisson', 'gaussian'"),
    ("encoding.inputs", "unary", "valid: one of 'offset', 'split'"),
    ("mask.contrast_ratio", 1.0, "contrast_ratio"),
    ("core.inputs", 0, "core.inputs"),
    ("adc.enob_loss", 8.0, "leaves no effective bits"),
    ("adc.enob_loss", -1.0, "adc.enob_loss"),
    ("dac.percentile", 0.0, r"dac.percentile: 0.0 is out of range; valid: number in "
                            r"\(0.0, 100.0\] percent"),
    ("detector.dark_electrons", -1e-3, "detector.dark_electrons: -0.001 is out of range"),
    ("mask.compensate", 1, "mask.compensate: 1 is not valid; valid: true or false"),
])
def test_out_of_range_values_are_refused_with_the_range(path, value, expect):
    with pytest.raises(ValueError, match=expect):
        optical.presets.get("iris-like").replace({path: value})


@pytest.mark.parametrize(("path", "value", "expect"), [
    # A figure typed in the docs' pJ/fJ is refused, the range naming the unit.
    ("energy.dram_energy_per_byte", 31, r"31.0 is out of range; valid: number in "
                                        r"\[0.0, 1e-06\] J/byte"),
    ("energy.walden_fom", 25, r"\[0.0, 1e-09\] J per conversion-step"),
    ("energy.adc_energy", 2.3, r"\[0.0, 1e-06\] J per conversion or None"),
    ("energy.dac_energy", 6.4, r"\[0.0, 1e-06\] J per conversion or None"),
    ("energy.detector_energy", 1.0, "J per readout"),
    ("energy.digital_energy_per_op", 0.71, "J/op"),
    ("energy.sram_energy_per_byte", 1.25, "J/byte"),
    ("energy.link_energy_per_byte", 8, "J/byte"),
    ("energy.mask_load_energy", 1e3, r"\[0.0, 1.0\] J per load"),
    ("source.wavelength", 850, r"valid: number in \[1e-07, 0.0001\] m$"),
])
def test_values_in_the_wrong_unit_are_refused_naming_the_unit(path, value, expect):
    with pytest.raises(ValueError, match=expect):
        optical.presets.get("iris-like").replace({path: value})
    with pytest.raises(ValueError, match=expect):  # --set and --param parse the same way
        optical.config.parse_value(path, str(value))
    section, _, leaf = path.partition(".")
    with pytest.raises(ValueError, match=expect):  # and a section built directly
        type(getattr(OpticalConfig(), section))(**{leaf: value})
    # The bounds sit far above any device: a thousand times the default passes.
    default = OpticalConfig().get(path)
    if default is not None and path != "source.wavelength":
        assert OpticalConfig().replace({path: default * 1000}).get(path) == default * 1000


def test_enob_follows_bits_so_sweeping_bits_keeps_converter_quality():
    cfg = optical.presets.get("iris-like")
    assert cfg.adc.enob == 6.5
    assert cfg.replace({"adc.bits": 6}).adc.enob == 4.5
    assert cfg.replace({"adc.bits": None}).adc.enob is None


@pytest.mark.parametrize("name", optical.presets.names())
def test_presets_round_trip_through_dict_and_json_exactly(name):
    cfg = optical.presets.get(name)
    assert OpticalConfig.from_dict(cfg.to_dict()) == cfg
    text = cfg.to_json()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert OpticalConfig.from_json(text) == cfg
    assert OpticalConfig.from_json(text).to_json() == text


def test_from_file_reads_a_config_file_or_a_report_and_from_json_points_to_it(tmp_path):
    """README: a machine of one's own is a JSON file, read in Python by
    from_file (from_json takes text: given a path, it said only "Expecting
    value: line 1 column 1")."""
    cfg = optical.presets.get("iris-like").replace({"adc.bits": 6})
    machine = tmp_path / "machine.json"
    machine.write_text(cfg.to_json(), encoding="utf-8-sig")  # with a BOM, as some editors
    assert OpticalConfig.from_file(machine) == OpticalConfig.from_file(str(machine)) == cfg
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"model": "x", "config": json.loads(cfg.to_json())}))
    assert OpticalConfig.from_file(report) == cfg
    partial = tmp_path / "partial.json"
    partial.write_text('{"adc": {"bits": 6}}')
    assert OpticalConfig.from_file(partial) == OpticalConfig().replace({"adc.bits": 6})
    with pytest.raises(ValueError, match=r"from_json reads JSON text: for a file, "
                                         r"OpticalConfig.from_file\('machine.json'\)"):
        OpticalConfig.from_json("machine.json")
    for broken in ('{"adc": ', "", "  "):  # JSON text, broken or empty: json's own error
        with pytest.raises(json.JSONDecodeError):
            OpticalConfig.from_json(broken)
    with pytest.raises(TypeError, match="path: expected a file path, got NoneType"):
        OpticalConfig.from_file(None)
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "wrong.json").write_text('{"adc": {"bitz": 6}}')
    for name, message in (("none.json", "No such file"), ("bad.json", "not JSON"),
                          ("wrong.json", "adc.bitz")):
        with pytest.raises(ValueError, match=rf"^{tmp_path / name}: .*{message}"):
            OpticalConfig.from_file(tmp_path / name)


def test_a_config_file_naming_a_section_or_field_twice_is_refused(tmp_path):
    """A machine file with an override appended at its end ({"adc": {...},
    ..., "adc": {"enob_loss": 0.5}}) was read as the last "adc" alone: the
    first's bits and full_scale were dropped without a word (an exact ADC
    emulated). Named now, as --set given twice is."""
    machine = tmp_path / "machine.json"
    for text, key in (('{"adc": {"bits": 6, "full_scale": "max"}, "source": {"photons_per_mac":'
                       ' 1000}, "adc": {"enob_loss": 0.5}}', "adc"),
                      ('{"adc": {"bits": 6, "bits": 8}}', "bits"),
                      ('{"model": "x", "config": {"dac": {"bits": 4, "bits": 6}}}', "bits")):
        machine.write_text(text)
        with pytest.raises(ValueError, match=rf"^{machine}: key '{key}' appears twice"):
            OpticalConfig.from_file(machine)
        with pytest.raises(ValueError, match=rf"^key '{key}' appears twice"):
            OpticalConfig.from_json(text)
    # A report's "config" beside sections of its own: one of the two was
    # dropped without a word (the top-level adc.bits 7, for "config"'s 5).
    machine.write_text('{"config": {"adc": {"bits": 5}}, "adc": {"bits": 7}}')
    with pytest.raises(ValueError, match=rf'^{machine}: config sections both under "config" '
                                         r"\(as a report holds them\) and beside it \(adc\); "
                                         "keep one place$"):
        OpticalConfig.from_file(machine)
    machine.write_text('{"adc": {"bits": 6}, "dac": {"bits": 6}}')  # one key per object
    assert OpticalConfig.from_file(machine) == OpticalConfig().replace({"adc.bits": 6,
                                                                       "dac.bits": 6})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_from_file_refuses_what_is_not_a_plain_file(tmp_path):
    """``--config`` on a FIFO waited for a writer for ever (and /dev/zero
    filled the memory): refused, as model and sweep files are. A writer
    thread stands by, so a reader that waits gets ``{}`` and fails the test
    instead of hanging it."""
    fifo = tmp_path / "machine.json"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader yet
            except OSError:
                stop.wait(0.01)
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b"{}")
            os.close(fd)
            return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with pytest.raises(ValueError, match=rf"^{fifo}: not a plain file"):
            OpticalConfig.from_file(fifo)
    finally:
        stop.set()
        thread.join()
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:  # sparse: claims 1 GiB, costs nothing
        handle.truncate(1 << 30)
    with pytest.raises(ValueError, match=rf"^{huge}: 1073741824 bytes, more than"):
        OpticalConfig.from_file(huge)


_REAL = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)


@given(bits=st.one_of(st.none(), st.integers(1, 24)), p=st.one_of(st.just(math.inf), _REAL),
       read=st.floats(0, 1e4), contrast=st.one_of(st.just(math.inf), st.floats(1.01, 1e4)),
       inputs=st.sampled_from(["offset", "split"]), balanced=st.booleans(),
       tile=st.integers(1, 4096))
def test_any_valid_config_round_trips(bits, p, read, contrast, inputs, balanced, tile):
    cfg = OpticalConfig().replace({
        "adc.bits": bits, "source.photons_per_mac": p, "detector.read_noise_electrons": read,
        "mask.contrast_ratio": contrast, "encoding.inputs": inputs,
        "detector.balanced": balanced, "core.inputs": tile})
    assert OpticalConfig.from_json(cfg.to_json()) == cfg
    assert OpticalConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_names_unknown_fields():
    with pytest.raises(ValueError, match="unknown config path 'adc.resolution'"):
        OpticalConfig.from_dict({"adc": {"resolution": 8}})


def test_a_derived_property_given_as_a_path_says_what_to_set():
    """adc.enob (docs/energy.md's tables name it) and mask.min_transmission
    read like fields but are made of others: a path to one names them (it
    was "unknown config path", listing the valid ones). Every property of
    every section is covered, and its formula is what the property gives."""
    from optical import config

    properties = {f"{name}.{attr}" for name, cls in config._SECTIONS.items()
                  for attr in dir(cls) if isinstance(getattr(cls, attr), property)}
    assert properties == set(config._DERIVED)
    cfg = optical.presets.get("iris-like")
    assert cfg.adc.enob == cfg.adc.bits - cfg.adc.enob_loss
    assert cfg.mask.min_transmission == 1 / cfg.mask.contrast_ratio
    assert cfg.source.rin_sigma == pytest.approx(
        (10 ** (cfg.source.rin_db_per_hz / 10) * cfg.source.rin_bandwidth) ** 0.5)
    with pytest.raises(ValueError, match=r"^config path 'adc.enob' is derived, not set: it is "
                                         r"adc.bits - adc.enob_loss; set those$"):
        cfg.replace({"adc.enob": 6.5})
    with pytest.raises(ValueError, match=r"'mask.min_transmission' is derived, not set: it is "
                                         r"1 / mask.contrast_ratio"):
        OpticalConfig.field_spec("mask.min_transmission")


def test_replace_with_a_field_as_a_keyword_points_to_the_mapping():
    """replace(**{"adc.bits": 6}) and replace(bits=6) said only "unknown
    config section", where from_dict hints: a field is changed by its dotted
    path in a mapping; a name of no field gets no hint."""
    cfg = optical.presets.get("iris-like")
    for kwargs, hint in (({"adc.bits": 6}, "replace({'adc.bits': value}))"),
                         ({"photons_per_mac": 3.0}, "replace({'source.photons_per_mac': value}))"),
                         ({"bits": 6}, "replace({'dac.bits': value}); bits is dac.bits, "
                                       "mask.bits, adc.bits)")):
        with pytest.raises(ValueError, match=r"keywords are whole sections; .*" + re.escape(hint)):
            cfg.replace(**kwargs)
    for name in ("adcc.bits", "adc.bitz", "foo"):
        with pytest.raises(ValueError, match=rf"unknown config section '{name}'; valid: [a-z, ]*$"):
            cfg.replace(**{name: 1})


def test_from_dict_names_an_unknown_section_even_when_it_is_empty():
    # An empty misspelt section was dropped, so a typo went unseen.
    with pytest.raises(ValueError, match="unknown config section .adcc.; valid sections: source, dac"):
        OpticalConfig.from_dict({"adcc": {}})
    with pytest.raises(ValueError, match="unknown config section 'adcc'"):
        OpticalConfig.from_json('{"adcc": {}, "adc": {"bits": 6}}')


def test_every_path_is_gettable_and_replaceable():
    cfg = optical.presets.get("iris-like")
    for path, value in cfg.items():
        assert cfg.get(path) == value
        assert cfg.replace({path: value}) == cfg


@pytest.mark.parametrize(("path", "text", "value"), [
    ("adc.bits", "6", 6), ("adc.bits", "None", None), ("source.photons_per_mac", "inf", math.inf),
    ("source.photons_per_mac", "1e300", 1e300), ("detector.dark_electrons", "0.0e-400", 0.0),
    ("detector.balanced", "false", False), ("encoding.inputs", "split", "split"),
])
def test_parse_value_from_command_line_text(path, text, value):
    assert parse_value(path, text) == value


@pytest.mark.parametrize(("path", "text"), [
    ("adc.bits", "six"), ("adc.bits", "0"), ("detector.balanced", "maybe"),
    # An integer field is not rounded (6.9 is no bit count), nor is an empty
    # value (an unset shell variable) None.
    ("adc.bits", "6.9"), ("adc.bits", "1e1"), ("adc.bits", ""), ("source.photons_per_mac", "")])
def test_parse_value_refuses_bad_text(path, text):
    with pytest.raises(ValueError, match=path):
        parse_value(path, text)


def test_ideal_is_the_limit_of_the_physics():
    cfg = optical.presets.get("ideal")
    assert cfg.source.photons_per_mac == math.inf
    assert cfg.source.rin_sigma == 0.0
    assert cfg.dac.bits is None and cfg.mask.bits is None and cfg.adc.bits is None
    assert cfg.mask.min_transmission == 0.0
    assert cfg.detector.read_noise_electrons == 0.0 and cfg.detector.dark_electrons == 0.0
    # The same types as any other machine: no separate code path.
    assert type(cfg) is type(optical.presets.get("iris-like"))


def test_numpy_scalars_are_accepted_as_python_numbers():
    """A sweep over ``np.arange`` passes numpy scalars: accepted, stored as the
    Python number (so the config's hash, JSON and equality are unchanged)."""
    import numpy as np

    base = optical.presets.get("iris-like")
    cfg = base.replace({"adc.bits": np.int64(6), "source.photons_per_mac": np.float32(1e3),
                        "detector.balanced": np.False_})
    assert type(cfg.adc.bits) is int and type(cfg.source.photons_per_mac) is float
    assert type(cfg.detector.balanced) is bool
    assert cfg == base.replace({"adc.bits": 6, "source.photons_per_mac": 1000.0,
                                "detector.balanced": False})
    for path, value in (("adc.bits", np.float64(6.0)), ("adc.bits", np.bool_(True)),
                        ("detector.balanced", np.int64(1))):
        with pytest.raises(ValueError, match=path):
            base.replace({path: value})
    assert optical.schedule(np.int64(4), np.int32(8), 8, base) == optical.schedule(4, 8, 8, base)


def test_replace_and_schedule_refuse_wrong_container_types():
    cfg = optical.presets.get("ideal")
    with pytest.raises(TypeError, match="changes: expected a mapping of dotted paths"):
        cfg.replace([("adc.bits", 5)])
    with pytest.raises(TypeError, match="config path: expected a dotted string .* int 3"):
        cfg.replace({3: 1})
    with pytest.raises(TypeError, match="config path: expected a dotted string"):
        cfg.get(3)
    with pytest.raises(TypeError, match="adc: expected an instance of ADCConfig, got dict"):
        cfg.replace(adc={"bits": 3})
    # Beside a dotted change to that section (which edits the section given).
    with pytest.raises(TypeError, match="adc: expected an instance of ADCConfig, got NoneType"):
        cfg.replace({"adc.bits": 6}, adc=None)
    with pytest.raises(TypeError, match="config: expected an OpticalConfig, got NoneType"):
        optical.schedule(4, 8, 8, None)
    # Every entry point taking a config says how to get a preset by its name.
    x, w = np.ones((2, 3)), np.ones((3, 2))
    for call in (lambda: optical.matmul(x, w, "ideal", seed=0), lambda: optical.program(w, "ideal"),
                 lambda: optical.schedule(4, 8, 8, "ideal")):
        with pytest.raises(TypeError, match=r"got str \(for the preset 'ideal': "
                           r"optical.presets.get\('ideal'\)\)"):
            call()


def test_relative_intensity_noise_above_one_is_refused():
    cfg = optical.presets.get("ideal")
    ok = cfg.replace({"source.rin_db_per_hz": -90.0, "source.rin_bandwidth": 1e9})
    assert ok.source.rin_sigma == pytest.approx(1.0)  # 10**-9 * 1e9 = 1: the edge
    with pytest.raises(ValueError, match="relative intensity noise of 1e\\+150"):
        cfg.replace({"source.rin_db_per_hz": -1e-9, "source.rin_bandwidth": 1e300})
    # Just past the edge: -85 dB/Hz over 1 GHz is sigma 10**-4.25 * 10**4.5 = 1.78.
    with pytest.raises(ValueError, match="relative intensity noise of 1.78"):
        cfg.replace({"source.rin_db_per_hz": -85.0, "source.rin_bandwidth": 1e9})


def test_photon_counts_near_float_overflow_are_refused_in_favour_of_inf():
    # At 1.7e308 the readout means times photons_per_mac overflowed to NaN.
    cfg = optical.presets.get("iris-like")
    assert cfg.replace({"source.photons_per_mac": 1e30}).source.photons_per_mac == 1e30
    assert cfg.replace({"source.photons_per_mac": math.inf}).source.photons_per_mac == math.inf
    for huge in (1.0000001e30, 1e200, 1.7e308):
        with pytest.raises(ValueError, match=r"source.photons_per_mac: .* use inf for no shot"):
            cfg.replace({"source.photons_per_mac": huge})


def test_a_long_double_beyond_float64_is_refused_not_made_inf():
    # inf photons per MAC turns shot noise off: a finite 1e4000 must not.
    cfg = optical.presets.get("iris-like")
    with pytest.raises(ValueError, match=r"source.photons_per_mac: .* beyond float64's range"):
        cfg.replace({"source.photons_per_mac": np.longdouble("1e4000")})
    assert cfg.replace({"source.photons_per_mac": np.longdouble("inf")}).source.photons_per_mac \
        == math.inf


def test_a_json_number_beyond_float_range_is_refused_as_set_refuses_it():
    # json reads 1e999 as inf (noise-free light) and 1e-400 as 0: a config
    # file refuses them by path, as --set does; infinity is written "inf".
    for text, why in (("1e999", "overflows a float"), ("2E999", "overflows a float"),
                      ("1e-400", "underflows to 0")):
        with pytest.raises(ValueError, match=f"source.photons_per_mac: '{text}' {why}"):
            optical.OpticalConfig.from_json(f'{{"source": {{"photons_per_mac": {text}}}}}')
    read = optical.OpticalConfig.from_json('{"source": {"photons_per_mac": "inf"}, '
                                           '"optics": {"defocus_waves": 0.0e5}}')
    assert read == optical.OpticalConfig().replace({"source.photons_per_mac": math.inf,
                                                    "optics.defocus_waves": 0.0})


def test_negative_zero_is_zero():
    """-0.0 == 0.0, so the two configs are equal: they must also write the
    same JSON and so give a sweep the same run id."""
    cfg = optical.presets.get("iris-like")
    minus, plus = (cfg.replace({"detector.dark_electrons": v}) for v in (-0.0, 0.0))
    assert math.copysign(1.0, minus.detector.dark_electrons) == 1.0
    assert minus.to_json() == plus.to_json()
    assert optical.config.parse_value("detector.dark_electrons", "-0") == 0.0
    assert math.copysign(1.0, optical.config.parse_value("detector.dark_electrons", "-0")) == 1.0


@pytest.mark.parametrize(("path", "value"), [
    # Open ends (")" in the message) refuse their bound itself.
    ("adc.headroom", math.inf), ("adc.enob_loss", 24.0), ("energy.static_power", math.inf),
    ("source.rin_bandwidth", math.inf), ("energy.input_rate", math.inf),
    # Efficiencies are fractions: no more photoelectrons than photons, no more light out
    # than electrical power in.
    ("detector.quantum_efficiency", 1.001), ("energy.laser_efficiency", 1.001),
    ("energy.optical_efficiency", 1.5),
    # Beyond these the noise variances overflow to NaN outputs.
    ("detector.read_noise_electrons", 1.01e30), ("detector.dark_electrons", 1e31),
    ("adc.headroom", 1.01e6),
    # Below it the read and dark noise in full-scale units (~1/p**2) overflow: a
    # ZeroDivisionError (p * p = 0) at 1e-200, a bare "adc_lo" error at 1e-80.
    ("source.photons_per_mac", 0.99e-30), ("source.photons_per_mac", 1e-200),
    # Degenerate machines. No photoelectron per photon: emitted = detected / QE is
    # undefined. An "rms" window of half-width 0 sigma has no codes.
    ("detector.quantum_efficiency", 0.0), ("adc.headroom", 0.0),
    # No core, no mask load rate, no light: nothing computes.
    ("energy.cores", 0), ("energy.mask_refresh_rate", 0.0), ("energy.source_mean_level", 0.0),
    # Infinite digital throughput, like an infinite input rate, is refused.
    ("energy.digital_ops_per_s", math.inf),
    # An outlier exceeds the median: a threshold below 1 is no outlier rule.
    ("outliers.threshold", 0.5),
])
def test_open_and_physical_upper_bounds_are_refused(path, value):
    with pytest.raises(ValueError, match=f"{path}: .* is out of range"):
        OpticalConfig().replace({path: value})


@pytest.mark.parametrize(("path", "value"), [
    # Closed ends ("]" in the message) accept their bound: 24-bit converters, 1-bit
    # ones, a perfect detector and laser, the 100th percentile, a 2**20-wide core.
    ("adc.bits", 24), ("dac.bits", 24), ("mask.bits", 24), ("adc.bits", 1),
    ("detector.quantum_efficiency", 1.0), ("energy.laser_efficiency", 1.0),
    ("dac.percentile", 100.0), ("optics.fill_factor", 1.0), ("core.inputs", 1 << 20),
    ("detector.read_noise_electrons", 1e30), ("adc.headroom", 1e6),
    ("source.photons_per_mac", 1e-30),
    # No lens crosstalk kept, or up to 64 pixels of it; a 2**20-tall core; no bypass.
    ("optics.kernel_radius", 0), ("optics.kernel_radius", 64), ("core.outputs", 1 << 20),
    ("outliers.top_k", 0),
])
def test_closed_range_ends_are_accepted(path, value):
    assert OpticalConfig().replace({path: value}).get(path) == value


@pytest.mark.parametrize("backend", ["numpy", "numba", "jax"])
@pytest.mark.parametrize("preset", ["iris-like", "wang-2022"])
def test_the_fewest_photons_allowed_still_give_a_finite_float32_result(backend, preset):
    """At photons_per_mac = 1e-30 the noise drowns the signal but every
    number stays finite, in float32, on every backend."""
    if backend == "jax":
        pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    cfg = optical.presets.get(preset).replace({"core.inputs": 64, "core.outputs": 48,
                                               "source.photons_per_mac": 1e-30})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend)
    assert y.dtype == np.float32 and np.isfinite(y).all()


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("True", True), ("1", True), ("yes", True), ("YES", True),
    ("false", False), ("FALSE", False), ("0", False), ("no", False), (" yes ", True),
])
def test_parse_value_reads_every_boolean_spelling(text, value):
    assert parse_value("detector.balanced", text) is value


def test_none_parses_only_for_optional_fields():
    assert parse_value("adc.bits", " none ") is None
    assert parse_value("outliers.threshold", "None") is None
    for path in ("core.inputs", "source.wavelength", "adc.full_scale", "detector.balanced"):
        with pytest.raises(ValueError, match=path):
            parse_value(path, "none")


@pytest.mark.parametrize("side", ["fan_out", "fan_in"])
def test_numerical_aperture_must_stay_below_one(side):
    """NA = aperture / (2 f) (the half-angle's tangent, paraxially); a lens of
    NA 1 is refused, one just below accepted."""
    cfg = OpticalConfig().replace({f"optics.{side}_focal_length": 0.05})
    with pytest.raises(ValueError, match=f"optics.{side}_aperture: 0.1 m gives a numerical "
                                         "aperture 1 >= 1"):
        cfg.replace({f"optics.{side}_aperture": 0.1})
    assert cfg.replace({f"optics.{side}_aperture": 0.0999}).get(f"optics.{side}_aperture") \
        == 0.0999


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_every_outlier_policy_needs_a_threshold_or_a_cap(policy):
    cfg = OpticalConfig()
    with pytest.raises(ValueError, match=f"outliers.policy: '{policy}' needs outliers.threshold"):
        cfg.replace({"outliers.policy": policy, "outliers.threshold": None})
    assert cfg.replace({"outliers.policy": policy, "outliers.threshold": None,
                        "outliers.top_k": 2}).outliers.top_k == 2
    off = cfg.replace({"outliers.policy": "none", "outliers.threshold": None})
    assert off.outliers.threshold is None and off.outliers.top_k is None


def test_replace_applies_dotted_paths_on_top_of_a_given_section():
    """A whole section and dotted paths into it: the paths change that section,
    not the config's old one (nothing of either is lost)."""
    cfg = optical.presets.get("iris-like")
    new = cfg.replace({"adc.bits": 6, "dac.bits": 4},
                      adc=ADCConfig(full_scale="max", headroom=3.0, window="per_tile"))
    assert new.adc == ADCConfig(bits=6, full_scale="max", headroom=3.0, window="per_tile")
    assert new.dac.bits == 4 and new.dac.scaling == cfg.dac.scaling
    assert sorted(new.diff(cfg)) == ["adc.bits", "adc.enob_loss", "adc.full_scale",
                                     "adc.headroom", "adc.window", "dac.bits"]
    with pytest.raises(ValueError, match="unknown config section 'adcc'; valid: source, dac"):
        cfg.replace(adcc=ADCConfig())


def test_every_real_field_has_the_unit_its_docstring_gives():
    """field_unit reads the section docstrings' ``name : type, unit`` lines;
    every real-valued field has one, as a length in pixels does; other counts,
    choices and flags have none."""
    cfg = optical.presets.get("iris-like")
    for path in cfg.paths():
        kind = OpticalConfig.field_spec(path)["kind"]
        unit = OpticalConfig.field_unit(path)
        assert bool(unit) == (kind == "real" or path == "optics.kernel_radius"), (path, unit)
    expected = {"source.wavelength": "m", "source.rin_db_per_hz": "dB/Hz",
                "optics.fan_in_aperture": "m", "optics.spherical_waves": "waves RMS",
                "energy.walden_fom": "J per conversion-step", "outliers.threshold":
                "dimensionless", "energy.adc_energy": "J per conversion", "adc.bits": "",
                "dac.scaling": ""}
    assert {p: OpticalConfig.field_unit(p) for p in expected} == expected
    with pytest.raises(ValueError, match="unknown config path 'adc.bitz'"):
        OpticalConfig.field_unit("adc.bitz")


def test_the_config_command_prints_each_value_with_its_unit(capsys):
    from optical.cli import main

    assert main(["config", "--preset", "iris-like"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["path", "value", "unit"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["source.wavelength"] == ["8.5e-07", "m"]
    assert rows["energy.mask_load_energy"][1:] == ["J", "per", "load"]
    assert rows["adc.bits"] == ["8"]


def test_sections_built_directly_store_numpy_scalars_as_python_values():
    """Not only replace(): a section built by hand from numpy scalars (a bool,
    an int, and an int for a float field) stores Python's bool, int and
    float, so the config's JSON, hash and equality are those of the plain
    values."""
    from optical.config import DetectorConfig, SourceConfig

    detector = DetectorConfig(balanced=np.True_, read_noise_electrons=np.int64(100))
    adc = ADCConfig(bits=np.int64(6))
    source = SourceConfig(photons_per_mac=np.float32(1e3))
    assert type(detector.balanced) is bool and type(adc.bits) is int
    assert type(detector.read_noise_electrons) is float
    assert type(source.photons_per_mac) is float
    cfg = OpticalConfig(detector=detector, adc=adc, source=source)
    assert OpticalConfig.from_json(cfg.to_json()) == cfg
    assert cfg == OpticalConfig(detector=DetectorConfig(balanced=True, read_noise_electrons=100.0),
                                adc=ADCConfig(bits=6), source=SourceConfig(photons_per_mac=1e3))


def _another_value(cfg, path):
    """cfg with ``path`` set to another valid value, or None if none is found."""
    value = cfg.get(path)
    if isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, str):
        candidates = [c for c in OpticalConfig.field_spec(path)["choices"] if c != value]
    elif value is None:
        candidates = [8, 0.5, 1, 1e-12]
    elif isinstance(value, int):
        candidates = [value + 1, value - 1, 2 * value]
    else:
        candidates = [value * 1.01, value * 0.99, value + 1.0, 0.5, -1.0, 1e3, -150.0]
    for candidate in candidates:
        try:
            changed = cfg.replace({path: candidate})
        except (ValueError, TypeError):
            continue
        if changed.get(path) != value:
            return changed
    return None


@pytest.mark.parametrize("preset", ["iris-like", "ideal"])
def test_diff_names_exactly_the_path_that_changed_for_every_path(preset):
    """diff() is what ProgrammedWeights.check_compatible and a sweep's change
    report read: changing any one field (the first included) is that field's
    path and nothing else, in either direction."""
    base = optical.presets.get(preset)
    changed = 0
    for path in OpticalConfig.paths():
        other = _another_value(base, path)
        if other is None:
            continue
        assert other.diff(base) == [path] and base.diff(other) == [path], path
        changed += 1
    assert changed == len(OpticalConfig.paths()), changed
    assert base.diff(base) == []


@pytest.mark.parametrize("path", OpticalConfig.paths())
def test_a_config_changed_in_any_one_field_round_trips(path):
    """OpticalConfig's docstring: it "round-trips exactly through to_dict /
    from_dict and to_json / from_json" -- for every field, not only those the
    presets and the hypothesis test happen to vary."""
    cfg = _another_value(optical.presets.get("iris-like"), path)
    assert cfg is not None, path
    assert OpticalConfig.from_dict(cfg.to_dict()) == cfg, path
    assert OpticalConfig.from_json(cfg.to_json()) == cfg, path
    assert path.split(".")[1] in json.loads(cfg.to_json())[path.split(".")[0]]


@pytest.mark.parametrize("path", ["core.inputs", "source.wavelength", "adc.headroom",
                                  "energy.cores", "detector.dark_electrons"])
def test_none_is_refused_for_a_field_that_is_not_optional(path):
    with pytest.raises(ValueError, match=rf"{path}: None is not valid"):
        OpticalConfig().replace({path: None})
    section, leaf = path.split(".")
    with pytest.raises(ValueError, match=rf"{path}: None is not valid"):
        OpticalConfig.from_json(json.dumps({section: {leaf: None}}))


def test_the_rin_ranges_are_open_where_rin_is_undefined():
    """0 Hz: no bandwidth to integrate RIN over (noise.rin_sigma refuses it
    too); 0 dB/Hz: the RIN density's range is open at 0 (over 1 Hz its sigma
    of 1 would otherwise pass the sigma check)."""
    with pytest.raises(ValueError, match="bandwidth"):
        noise.rin_sigma(-150.0, 0.0)
    with pytest.raises(ValueError, match="source.rin_bandwidth"):
        OpticalConfig().replace({"source.rin_bandwidth": 0.0})
    for changes, path in (
            ({"source.rin_db_per_hz": -150.0, "source.rin_bandwidth": 0.0},
             "source.rin_bandwidth"),
            ({"source.rin_db_per_hz": 0.0, "source.rin_bandwidth": 1.0},
             "source.rin_db_per_hz")):
        with pytest.raises(ValueError, match=rf"{path}: .* is out of range"):
            OpticalConfig().replace(changes)


def test_a_section_of_the_wrong_type_is_refused_at_construction():
    with pytest.raises(TypeError, match="adc: expected an instance of ADCConfig, got dict"):
        OpticalConfig(adc={"bits": 6})


def test_an_unknown_leaf_lists_the_valid_paths_of_its_own_section():
    with pytest.raises(ValueError) as err:
        OpticalConfig().replace({"adc.bitz": 6})
    message = str(err.value)
    assert "adc.bits" in message and "adc.headroom" in message
    assert "source." not in message


def test_malformed_config_data_is_a_value_error_naming_where(tmp_path):
    """from_dict: a section that is not a mapping is refused by name;
    from_file: "ValueError names the file and what is wrong with it", for a
    JSON list as for anything else."""
    with pytest.raises(ValueError, match="adc: expected a mapping of fields, got int"):
        OpticalConfig.from_dict({"adc": 6})
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"^{bad}: expected a mapping of sections, got list"):
        OpticalConfig.from_file(bad)
    section = tmp_path / "section.json"
    section.write_text('{"adc": 6}')
    with pytest.raises(ValueError, match=rf"^{section}: adc: expected a mapping of fields"):
        OpticalConfig.from_file(section)


def test_replace_refuses_text_for_a_number():
    with pytest.raises(ValueError, match=r"source.photons_per_mac: '1e3' is not a number"):
        OpticalConfig().replace({"source.photons_per_mac": "1e3"})


def test_a_config_prints_as_a_table_of_its_fields():
    """An interactive-use audit: ``print(cfg)`` (and a bare ``cfg`` in
    IPython) showed the dataclass repr, 1,551 characters on one line. It is
    a line naming the config, then one line per field: path, value, unit."""
    cfg = optical.presets.get("iris-like").replace({"adc.bits": 6})
    lines = str(cfg).splitlines()
    assert lines[0] == "OpticalConfig: iris-like with adc.bits=6"
    assert lines[1].split() == ["path", "value", "unit"]
    rows = lines[2:]
    assert len(rows) == len(OpticalConfig.paths())
    for row, path in zip(rows, OpticalConfig.paths(), strict=True):
        assert row.split()[0] == path and f" {cfg.get(path)!r}" in row
        assert row.endswith(f" {OpticalConfig.field_unit(path)}".rstrip() or repr(cfg.get(path)))
    assert "\nadc.bits                           6\n" in str(cfg)
    assert str(optical.presets.get("ideal")).splitlines()[0] == "OpticalConfig: ideal"
    assert repr(cfg).startswith("OpticalConfig(source=SourceConfig(")  # repr unchanged

    class Printer:  # IPython's pretty printer, as _repr_pretty_ is called
        def __init__(self):
            self.parts = []

        def text(self, part):
            self.parts.append(part)

    printer = Printer()
    cfg._repr_pretty_(printer, cycle=False)
    assert printer.parts == [str(cfg)]
