"""Seeded random configs (1-5 dotted-path changes of a preset,
small cores that do not divide the shapes) -- numba exact mode against the
numpy reference, and the ideal limit against x @ w.

Truth: the documented contracts (docs/ARCHITECTURE.md, Backends): exact=True
draws every noise from the reference's streams, so on the BLAS engine (every
tile here is under 128 x 128 weights) the outputs agree to float rounding;
an ADC code may move only where a readout sits within rounding of a code
boundary (the fuzz saw none in 398 BLAS-engine cases), so the bound allows
at most one output in 500 off. The ideal preset with any encoding / scaling /
tiling / outlier / calibration choice is x @ w to float rounding.
"""
import math

import numpy as np
import pytest

import optical
from optical import metrics

CASES = [  # (preset, changes, tokens, K, N, dtype) drawn by a seeded random-config fuzz
    ("wang-2022", {"core.inputs": 29, "mask.scaling": "per_tile"}, 25, 60, 57, np.float64),
    ("iris-like", {"core.inputs": 48, "core.outputs": 20, "adc.window": "per_tile",
                   "encoding.inputs": "split"}, 11, 100, 45, np.float32),
    ("iris-like", {"core.inputs": 33, "core.outputs": 7, "outliers.policy": "dynamic",
                   "outliers.top_k": 2, "adc.full_scale": "max"}, 17, 70, 23, np.float64),
    ("ideal", {"core.inputs": 13, "core.outputs": 9, "adc.bits": 6, "adc.enob_loss": 1.2,
               "source.photons_per_mac": 50.0, "detector.shot_noise": "gaussian",
               "detector.balanced": False}, 9, 40, 30, np.float32),
    ("wang-2022", {"core.outputs": 17, "source.rin_db_per_hz": -100.0,
                   "detector.dark_electrons": 5.0, "dac.scaling": "per_tensor"},
     30, 50, 40, np.float32),
]


@pytest.mark.parametrize(("preset", "changes", "tokens", "k", "n", "dtype"), CASES)
def test_numba_exact_mode_matches_the_reference_on_random_configs(preset, changes, tokens, k, n,
                                                                  dtype):
    rng = np.random.default_rng(7)
    cfg = optical.presets.get(preset).replace(changes)
    x = rng.standard_normal((tokens, k)).astype(dtype)
    x[:, 3] *= 40  # an outlier channel for the outlier policies
    w = rng.standard_normal((k, n)).astype(dtype)
    ref = optical.matmul(x, w, cfg, seed=123, backend="numpy")
    y = optical.matmul(x, w, cfg, seed=123, backend="numba", exact=True)
    tol = (1e-4 if dtype == np.float32 else 1e-12) * np.abs(ref).max()
    assert np.count_nonzero(np.abs(y - ref) > tol) <= ref.size // 500


@pytest.mark.parametrize("changes", [
    {"encoding.inputs": "split", "encoding.weights": "offset", "core.inputs": 7,
     "core.outputs": 5, "mask.scaling": "per_tile"},
    {"outliers.policy": "static", "outliers.top_k": 3, "core.inputs": 11,
     "mask.contrast_ratio": 30.0, "detector.balanced": False},
    {"dac.scaling": "static", "dac.percentile": 100.0, "core.outputs": 6,
     "outliers.policy": "dynamic", "outliers.threshold": 3.0},
])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_ideal_limit_of_random_choices_is_the_product(changes, backend):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 9, 37))
    x[..., 5] *= 40
    w = rng.standard_normal((37, 23))
    cfg = optical.presets.get("ideal").replace(changes)
    assert math.isinf(cfg.source.photons_per_mac)
    y = optical.matmul(x, w, cfg, seed=0, backend=backend)
    assert metrics.relative_error(x @ w, y) < 1e-11
