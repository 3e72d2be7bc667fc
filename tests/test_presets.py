import math

import pytest

import optical
from optical.physics import noise


def test_names_and_unknown_preset():
    assert {"ideal", "iris-like", "wang-2022"} <= set(optical.presets.names())
    with pytest.raises(ValueError, match=r"unknown preset 'iris'; valid: ideal, iris-like"):
        optical.presets.get("iris")


@pytest.mark.parametrize("name", optical.presets.names())
def test_every_preset_cites_its_sources(name):
    fn = optical.presets._PRESETS[name]
    assert fn.__doc__ and len(fn.__doc__) > 200


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
    assert cfg.source.photons_per_mac == pytest.approx(3.1)
    assert cfg.detector.shot_noise == "poisson"
    assert cfg.encoding.inputs == cfg.encoding.weights == "offset"
