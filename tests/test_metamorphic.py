"""Metamorphic relations: what must hold between two calls whatever the
exact numbers (an audit checked ~110 of them; these guard the ones no other
test covered: noise in full-scale units, causal prefixes under noise, and
the encoder's token-permutation equivariance)."""

import numpy as np
import pytest

import optical
from optical import presets, transformer
from tests.transformer_helpers import TINY_BERT, TINY_LLAMA, random_llama_tensors, write_model

SMALL = {"core.inputs": 64, "core.outputs": 48}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_noise_is_drawn_in_full_scale_units_so_power_of_two_scaling_is_exact(backend):
    # Inputs scaled per token and weights per column: scaling x (with its
    # calibration) by 4 or w by 1/8 changes no normalised value, no window and
    # no draw, so the noisy output scales exactly (iris-like: noise, ADC,
    # static outlier bypass, compensation, RIN).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((70, 150)).astype(np.float32)
    x[:, 3] *= 30  # an outlier channel for the bypass
    w = rng.standard_normal((150, 100)).astype(np.float32)
    cfg = presets.get("iris-like").replace(SMALL)
    y = optical.matmul(x, optical.program(w, cfg, calibration=x), cfg, seed=5, backend=backend)
    four = np.float32(4)
    y4 = optical.matmul(four * x, optical.program(w, cfg, calibration=four * x), cfg, seed=5,
                        backend=backend)
    y8 = optical.matmul(x, optical.program(w / np.float32(8), cfg, calibration=x), cfg, seed=5,
                        backend=backend)
    np.testing.assert_array_equal(y4, 4 * y)
    np.testing.assert_array_equal(y8, y / 8)


def test_llama_prefill_is_causal_under_noise_with_held_out_calibration(tmp_path):
    # Noise is keyed by token row, calibration is held out, attention is
    # digital: a prefix's outputs are the first rows of the whole prompt's,
    # to float32 rounding. (Not bit for bit: a prefix's GEMMs have other
    # shapes, and OpenBLAS's Haswell kernels, on this machine's AMD EPYC,
    # round a row by its lane in a 24-row micro-kernel: 91 of 640 outputs
    # moved by up to 4.8e-7. Noise keyed otherwise would move them by the
    # noise, ~1e-1.)
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, random_llama_tensors(TINY_LLAMA)))
    layer = model.layer(1)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((24, 64)).astype(np.float32)
    cal = layer.matmul_inputs(rng.standard_normal((32, 64)).astype(np.float32))
    cfg = presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 32})
    full = layer.optical(h, cfg, seed=3, calibration=cal)
    np.testing.assert_allclose(layer.optical(h[:10], cfg, seed=3, calibration=cal), full[:10],
                               rtol=1e-5, atol=1e-5)
    ideal = presets.get("ideal").replace({"core.inputs": 32, "core.outputs": 32})
    np.testing.assert_allclose(layer.optical(h[:10], ideal, seed=0),
                               layer.optical(h, ideal, seed=0)[:10], rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_bert_layer_is_token_permutation_equivariant(tmp_path, attention):
    # The encoder layer has no positions (they enter in the embeddings):
    # permuting tokens and mask permutes the output, in the ideal limit.
    layer = transformer.load(write_model(tmp_path, TINY_BERT)).layer(1)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((2, 12, 48)).astype(np.float32)
    mask = np.ones((2, 12), bool)
    mask[1, 9:] = False
    p = rng.permutation(12)
    cfg = presets.get("ideal").replace({"core.inputs": 32, "core.outputs": 32,
                                        "mapping.attention": attention})
    y = layer.optical(h, cfg, seed=0, mask=mask)
    yp = layer.optical(h[:, p], cfg, seed=0, mask=mask[:, p])
    real = mask[:, p]
    np.testing.assert_allclose(yp[real], y[:, p][real], rtol=0, atol=1e-5)
