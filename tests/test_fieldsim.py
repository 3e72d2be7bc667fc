"""The fast kernel path against a field-level simulation of a 16 x 16 core:
every source propagated numerically through fan-out lens, mask and fan-in
lens, detected intensities integrated per detector."""

import numpy as np
import pytest
from scipy import special

import optical
from optical.physics import crosstalk as X
from optical.physics import fieldsim

CORE = optical.presets.get("iris-like").replace({
    "core.inputs": 16, "core.outputs": 16, "optics.model": "diffraction",
    "optics.kernel_radius": 24})  # the kernels span the whole small core


def geometry(f, d, **optics):
    changes = {"optics.fan_out_focal_length": f, "optics.fan_in_focal_length": f,
               "optics.fan_out_aperture": d, "optics.fan_in_aperture": d}
    changes.update({f"optics.{k}": v for k, v in optics.items()})
    return CORE.replace(changes)


GEOMETRIES = {
    # NA 0.25 with a 1.5 um source and a little spherical aberration: tight focus.
    "tight": geometry(5.6e-3, 2.8e-3, beam_profile="gaussian", beam_waist=1.5e-6,
                      spherical_waves=0.05),
    # NA 0.08, a 4 um source and 0.1 wave of defocus: a few percent per neighbour.
    "loose": geometry(10e-3, 1.6e-3, beam_profile="gaussian", beam_waist=4e-6,
                      defocus_waves=0.1),
}


def split_mask(rng, k, n, t_min):
    w = rng.standard_normal((k, n))
    v = w / np.abs(w).max(axis=0)
    return np.stack([t_min + (1 - t_min) * np.maximum(v, 0),
                     t_min + (1 - t_min) * np.maximum(-v, 0)])


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_kernel_path_matches_the_field_simulation_to_one_percent(name):
    cfg = GEOMETRIES[name]
    rng = np.random.default_rng(11)
    t = split_mask(rng, 16, 16, cfg.mask.min_transmission)
    a = rng.uniform(0, 1, 16)  # source intensities of one pass
    kern = X.kernels(cfg)
    simulated = fieldsim.simulate_tile(t, cfg)
    fast = kern.efficiency * X.effective_tile(t, kern)
    y_sim = np.einsum("j,rjn->rn", a, simulated)
    y_fast = np.einsum("j,rjn->rn", a, fast)
    # Every detector rail, and the balanced difference the ADC sees.
    assert np.linalg.norm(y_fast - y_sim) / np.linalg.norm(y_sim) < 0.01
    diff_sim, diff_fast = y_sim[0] - y_sim[1], y_fast[0] - y_fast[1]
    assert np.linalg.norm(diff_fast - diff_sim) / np.linalg.norm(diff_sim) < 0.01
    # The agreement means something: the optics change the result by far more.
    nominal = np.einsum("j,rjn->rn", a, t)
    effect = np.linalg.norm(diff_sim / kern.efficiency - (nominal[0] - nominal[1]))
    assert effect / np.linalg.norm(nominal[0] - nominal[1]) > {"tight": 0.03, "loose": 0.2}[name]


def test_simulation_detects_the_light_that_lands_on_an_open_tile():
    # Fill factor 1, NA 0.3 relays, an unclipped Gaussian fan-out beam of
    # radius W = lambda f / (pi w0): an open tile passes, and its detectors
    # collect, the share of the source's power that falls on the tile, which
    # is analytic: erf over the tile's width (x) times ~1 over its rows (y).
    lam, f, w0 = 850e-9, 5.6e-3, 1.5e-6
    cfg = geometry(f, 3.4e-3, beam_profile="gaussian", beam_waist=w0, fill_factor=1.0)
    detected = fieldsim.simulate_tile(np.ones((2, 3, 16)), cfg)[:, 1, :].sum()
    big_w = lam * f / (np.pi * w0)
    half_width = 16 * 10e-6  # 32 physical columns of 10 um, centred on the beam
    on_tile = special.erf(np.sqrt(2) * half_width / big_w)
    assert detected == pytest.approx(on_tile, rel=0.01)


def test_simulation_refuses_what_it_cannot_do():
    t = np.ones((2, 4, 4))
    with pytest.raises(ValueError, match="optics.model = 'diffraction'"):
        fieldsim.simulate_tile(t, CORE.replace({"optics.model": "ideal"}))
    with pytest.raises(ValueError, match=r"expected shape \(rails=2, k, n\)"):
        fieldsim.simulate_tile(np.ones((1, 4, 4)), CORE)
    with pytest.raises(ValueError, match="does not fit"):
        fieldsim.simulate_tile(np.ones((2, 17, 4)), CORE)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        fieldsim.simulate_tile(2 * t, CORE)
    with pytest.raises(ValueError, match="samples_per_pixel"):
        fieldsim.simulate_tile(t, CORE, samples_per_pixel=7)
    with pytest.raises(TypeError, match="config"):
        fieldsim.simulate_tile(t, "iris-like")
