import math
import re

import numpy as np
import pytest

import optical
from optical.physics import noise


def test_names_and_unknown_preset():
    assert {"ideal", "iris-like", "wang-2022"} <= set(optical.presets.names())
    with pytest.raises(ValueError, match=r"unknown preset 'iris'; valid: ideal, iris-like"):
        optical.presets.get("iris")
    # a machine file's path given as a preset says where a file goes (an extension audit)
    with pytest.raises(ValueError, match=r"unknown preset 'cfgs/mine.json'; valid: .* \(a "
                                         r"machine file is read by OpticalConfig.from_file"):
        optical.presets.get("cfgs/mine.json")
    for name in (["ideal"], {"ideal": 1}, None):  # not an unhashable-type TypeError
        with pytest.raises(TypeError, match=r"name: a preset's name is a string, got \w+; "
                                            "valid: ideal, iris-like"):
            optical.presets.get(name)


def test_name_of_finds_the_preset_a_config_equals():
    for name in optical.presets.names():
        assert optical.presets.name_of(optical.presets.get(name)) == name
    iris = optical.presets.get("iris-like")
    assert optical.presets.name_of(iris.replace({"adc.bits": 6})) is None
    # an override that restores the preset's own value is still the preset
    assert optical.presets.name_of(iris.replace({"adc.bits": iris.adc.bits})) == "iris-like"


#: A journal reference, "Nat. Commun. 13, 123 (2022)": abbreviated title,
#: volume, page and year.
_JOURNAL = re.compile(r"\b(?:[A-Z][a-z]*\. ?)+ \d+, \d+ \((?:19|20)\d{2}\)")
#: A "Sources:" paragraph whose first source carries its year, "Lumai ... (2026)".
_SOURCES = re.compile(r"^\s*Sources?: [^;\n]+\((?:19|20)\d{2}\)", re.MULTILINE)


@pytest.mark.parametrize("name", optical.presets.names())
def test_every_preset_cites_its_sources(name):
    """A machine modelled on real hardware names where its numbers come from:
    a journal reference or a "Sources:" paragraph, with years; one named after
    a paper ("wang-2022") cites that year's paper. The ideal machine models
    no hardware: it must say it is the physics' exact limit instead."""
    doc = optical.presets._PRESETS[name].__doc__
    assert doc
    if name == "ideal":
        assert "limit" in doc and "exact" in doc
        return
    citations = _JOURNAL.findall(doc) + _SOURCES.findall(doc)
    assert citations, doc
    year = re.search(r"-((?:19|20)\d{2})$", name)
    if year:
        assert any(f"({year.group(1)})" in c for c in _JOURNAL.findall(doc)), citations


def test_the_citation_patterns_recognise_citations():
    assert _JOURNAL.search("Wang et al., Nat. Commun. 13, 123 (2022).")
    assert _JOURNAL.search("Halko, Martinsson & Tropp, SIAM Rev. 53, 217, 2011") is None
    assert _SOURCES.search("    Sources: Lumai Iris Nova press release (2026); vendor data")
    assert _SOURCES.search("    Sources: vendor data.") is None


def test_iris_like_derived_numbers_match_the_reference_sheet():
    cfg = optical.presets.get("iris-like")
    assert cfg.source.wavelength == 850e-9
    assert cfg.mask.min_transmission == pytest.approx(0.02)
    # Responsivity 0.55 A/W at 850 nm -> eta = R * 1.23984 / 0.85 um.
    assert cfg.detector.quantum_efficiency == pytest.approx(0.55 * 1.2398420 / 0.85, rel=1e-6)
    # -150 dB/Hz over 1 GHz -> 1e-3 relative intensity fluctuation.
    assert cfg.source.rin_sigma == pytest.approx(1e-3)
    # 10 pA/sqrt(Hz) integrated over 1 ns at 1 GHz -> 1e-11 / sqrt(1e9) / q.
    assert cfg.detector.read_noise_electrons == pytest.approx(1e-11 / math.sqrt(1e9) / 1.602176634e-19)
    assert cfg.core.inputs == cfg.core.outputs == 1024


def test_tia_and_rin_conversions():
    assert noise.tia_noise_electrons(10e-12, 1e9) == pytest.approx(1973.7, rel=1e-4)
    assert noise.rin_sigma(-150.0, 1e9) == pytest.approx(1e-3)
    assert noise.rin_sigma(-math.inf, 1e9) == 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        noise.rin_sigma(-150.0, 0.0)


def test_wang_2022_is_the_low_photon_poisson_regime():
    cfg = optical.presets.get("wang-2022")
    # Their budget, 3.1 photons per multiplication averaged over a sample, is
    # the full-scale count n_max = 3.1 K / sum(x / max x) (ONN-QAT-SQL's
    # shot_noise): for MNIST's mean fill (pixel mean 0.1307 of a maximum of 1).
    assert cfg.source.photons_per_mac * 0.1307 == pytest.approx(3.1)
    assert cfg.detector.shot_noise == "poisson"
    # Non-negative inputs sent as they are (split: the negative pass is dark),
    # weights shifted to non-negative transmissions.
    assert (cfg.encoding.inputs, cfg.encoding.weights) == ("split", "offset")
    # 711-wide dot products, 8-bit input display and weight SLM (Nat. Commun. 13, 123).
    assert cfg.core.inputs == cfg.core.outputs == 711
    assert cfg.dac.bits == cfg.mask.bits == 8
    # The docstring's assumptions: 100:1 SLM contrast, 532 nm light (the
    # energy model's photon energy), no balanced detection.
    assert cfg.mask.contrast_ratio == 100.0
    assert cfg.source.wavelength == 532e-9
    assert cfg.detector.balanced is False


def test_iris_like_matches_its_docstring_and_the_reference_sheet():
    """The numbers iris-like cites, each re-derived from its source's units
    (../shared/REFERENCES.md, docs/energy.md, the preset's docstring)."""
    cfg = optical.presets.get("iris-like")
    q = 1.602176634e-19
    # Dark current 1 nA integrated over 1 ns: 6.24 electrons per readout.
    assert cfg.detector.dark_electrons == pytest.approx(1e-9 * 1e-9 / q, rel=1e-9)
    assert cfg.detector.dark_electrons == pytest.approx(6.24, rel=1e-3)
    # Optics: 10 um pixels at fill factor 0.9, f = 50 mm lenses, 2" and 1" pupils.
    o = cfg.optics
    assert (o.pixel_pitch, o.fill_factor) == (10e-6, 0.9)
    assert o.fan_out_focal_length == o.fan_in_focal_length == 50e-3
    assert (o.fan_out_aperture, o.fan_in_aperture) == (2 * 25.4e-3, 25.4e-3)
    assert cfg.dac.bits == cfg.mask.bits == cfg.adc.bits == 8
    e = cfg.energy
    # 1 GS/s input rate, 1 kHz mask refresh, Walden FOM 25 fJ/step, laser 30%.
    assert (e.input_rate, e.mask_refresh_rate, e.walden_fom) == (1e9, 1e3, 25e-15)
    assert e.laser_efficiency == 0.3
    # H100: 700 W at 989 TFLOP/s dense BF16 -> 0.71 pJ per operation.
    assert e.digital_ops_per_s == 989e12
    assert e.digital_energy_per_op == pytest.approx(700 / 989e12, rel=0.01, abs=0)
    # Per byte, from per-bit and per-access figures: HBM2 ~3.9 pJ/bit, Horowitz's
    # 10 pJ per 64-bit SRAM access, a 1 pJ/bit link.
    assert e.dram_energy_per_byte == pytest.approx(8 * 3.9e-12, rel=0.01, abs=0)
    assert e.sram_energy_per_byte == pytest.approx(10e-12 / 8, rel=1e-9, abs=0)
    assert e.link_energy_per_byte == pytest.approx(8 * 1e-12, rel=1e-9, abs=0)
    # Half the emitted light reaches the detectors (an assumption it names).
    assert e.optical_efficiency == 0.5
    # Offset inputs, split weights; channels above 6x the median bypass the optics.
    assert (cfg.encoding.inputs, cfg.encoding.weights) == ("offset", "split")
    assert (cfg.outliers.policy, cfg.outliers.threshold) == ("static", 6.0)
    # The ideal machine keeps iris-like's encodings and core, so tiling is exercised alike.
    ideal = optical.presets.get("ideal")
    assert (ideal.encoding, ideal.core) == (cfg.encoding, cfg.core)


def test_describe_names_the_preset_or_the_nearest_one_and_its_changes():
    """A sweep's figure and validate's table named any changed preset "custom
    config": iris-like with read and dark noise off could not be told from
    any other machine."""
    from optical.presets import describe

    iris = optical.presets.get("iris-like")
    assert [describe(optical.presets.get(n)) for n in optical.presets.names()] == \
        optical.presets.names()
    quiet = iris.replace({"detector.read_noise_electrons": 0.0, "detector.dark_electrons": 0.0})
    assert describe(quiet) == ("iris-like with detector.dark_electrons=0.0, "
                               "detector.read_noise_electrons=0.0")  # in the config's order
    wang = optical.presets.get("wang-2022").replace({"adc.bits": 6})
    assert describe(wang) == "wang-2022 with adc.bits=6"
    assert describe(optical.OpticalConfig()) == "ideal with encoding.inputs='split'"
    four = iris.replace({"adc.bits": 6, "dac.bits": 6, "mask.bits": 6, "core.inputs": 32})
    assert describe(four) == "custom config"
    assert describe(four, max_changes=4) == ("iris-like with dac.bits=6, mask.bits=6, "
                                             "adc.bits=6, core.inputs=32")
    # A tie goes to the preset listed first: 5 of wang-2022's 10 changes to the
    # ideal machine are 5 changes from each.
    halfway = optical.presets.get("ideal").replace({
        "dac.bits": 8, "mask.bits": 8, "core.inputs": 711, "core.outputs": 711,
        "source.wavelength": 532e-9})
    assert len(optical.presets.get("ideal").diff(halfway)) == 5
    assert len(optical.presets.get("wang-2022").diff(halfway)) == 5
    assert describe(halfway, 5).startswith("ideal with ")
    # A sweep's swept paths: their base value is never run, so never named.
    assert describe(four, ignore={"adc.bits", "dac.bits"}) == \
        "iris-like with mask.bits=6, core.inputs=32"
    with pytest.raises(TypeError, match="config: expected an OpticalConfig, got str"):
        describe("iris-like")
    with pytest.raises(ValueError, match="max_changes: '3' must be a non-negative integer"):
        describe(iris, "3")
    with pytest.raises(TypeError, match="ignore: expected a collection of config paths"):
        describe(iris, ignore="adc.bits")


def test_iris_like_mapping_and_detection_match_its_docstring():
    """presets.iris_like: "DAC 8 bits, per-token dynamic scaling"; "mask 8
    bits, contrast 50:1, per-column scaling"; "Gaussian shot noise ...;
    balanced detection of split weights"; "each column's ADC window
    calibrated"; outliers "chosen on the calibration inputs"; "the mask
    pre-distorted for the lens crosstalk (mask.compensate)"."""
    cfg = optical.presets.get("iris-like")
    assert cfg.dac.scaling == "per_token"
    assert cfg.mask.scaling == "per_column" and cfg.mask.compensate is True
    assert cfg.detector.shot_noise == "gaussian" and cfg.detector.balanced is True
    assert (cfg.adc.full_scale, cfg.adc.window) == ("calibrated", "per_column")
    assert cfg.outliers.policy == "static"
    assert cfg.source.photons_per_mac == 1e5
    assert cfg.optics.model == "diffraction" and cfg.optics.kernel_radius == 1
    assert (cfg.optics.defocus_waves, cfg.optics.spherical_waves) == (0.0, 0.0)
    assert cfg.energy.static_power == 0.0 and cfg.energy.cores == 1


def test_wang_2022_has_only_shot_noise_as_its_docstring_says():
    """presets.wang_2022: "detector read noise and converter error are
    negligible next to shot noise at these counts, so they are off here"."""
    cfg = optical.presets.get("wang-2022")
    assert cfg.detector.read_noise_electrons == 0.0 and cfg.detector.dark_electrons == 0.0
    assert cfg.adc.bits is None
    assert cfg.source.rin_sigma == 0.0
    assert cfg.optics.model == "ideal" and cfg.mask.compensate is False


def test_wang_2022_lights_the_weights_with_3_photons_per_multiplication_on_mnist_like_data():
    """Wang et al.'s shot-noise model (ONN-QAT-SQL's ``shot_noise``): each
    sample's light is scaled so that its inputs, x / max x, deliver on average
    3.1 photons per multiplication to the weights, and the detector counts
    Poisson photons of mean n_max * sum_k x_k w_k over the weights'
    transmissions, with no light added to the inputs. On inputs of MNIST's
    mean fill the preset's total count must be that, within Poisson error
    (offset-encoded inputs, which add (1 - x) / 2 of full scale to every
    source, counted several times as many)."""
    cfg = optical.presets.get("wang-2022")
    rng = np.random.default_rng(3)
    k, n, tokens = 711, 24, 16
    # 8-bit display levels, each row's maximum full scale, mean fill 0.1307.
    x = np.where(rng.uniform(size=(tokens, k)) < 0.1307 / 0.6,
                 rng.integers(77, 230, size=(tokens, k)), 0) / 255.0
    x[:, 0] = 1.0
    w = rng.standard_normal((k, n))
    t = optical.program(w, cfg).transmissions[0]  # (K, N): the one offset-encoded rail
    expected = 3.1 / 0.1307 * (x @ t).sum()
    _, stats = optical.matmul(x, w, cfg, seed=0, return_stats=True)
    assert abs(stats.detected_photons - expected) < 5 * np.sqrt(expected)
    photons_per_multiplication = 3.1 / 0.1307 * x.mean()  # at full transmission
    assert photons_per_multiplication == pytest.approx(3.1, rel=0.1)
