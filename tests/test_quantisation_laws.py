"""The converters' and the mask's rounding, end to end through optical.matmul,
against the uniform-quantiser law: an error of variance step**2 / 12 per
rounded value, summed over the passes and rails that make one output.

The converters are tested alone in test_converters.py; here their steps are
derived by hand from the encodings (optical.physics.encoding) and must add up to the
error the whole matmul makes, on every CPU backend. Inputs: every row's
largest |x| is 1 (x[:, 0]) and every column's largest |w| is 1 (w[0]), so
the per-row DAC and per-column mask scales are 1 and the steps are exact.
"""

import numpy as np
import pytest

import optical

K, N, T, BITS = 64, 32, 4000, 8
TOP = 2**BITS - 1
BACKENDS = ["numpy", "numba"]


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(5)
    w = rng.uniform(-1, 1, (K, N))
    w[0] = 1.0
    x = rng.uniform(-1, 1, (T, K))
    x[:, 0] = 1.0
    return x, w


def _config(**fields):
    return optical.presets.get("ideal").replace({"core.inputs": K, "core.outputs": N,
                                                 **fields})


def _error_variance(x, w, config, backend):
    exact = optical.matmul(x, w, _config(**{k: v for k, v in config.items()
                                            if k.startswith(("encoding.", "detector."))}),
                           seed=0, backend="numpy")
    np.testing.assert_allclose(exact, x @ w, rtol=1e-12, atol=1e-12)  # the ideal limit
    y = optical.matmul(x, w, _config(**config), seed=0, backend=backend)
    return ((y - exact) ** 2).mean(axis=0)  # per column, over T tokens


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs, weights, balanced", [
    ("split", "split", True), ("split", "split", False), ("offset", "split", True),
    ("offset", "offset", True)])
@pytest.mark.parametrize("enob_loss", [0.0, 1.5])
def test_adc_rounding_adds_step_squared_over_12_per_readout(operands, backend, inputs, weights,
                                                            balanced, enob_loss):
    """adc.full_scale = "max": each readout's window is its noise-free range
    (inputs in [0, 1] on the light): sum_k |w| for balanced split weights,
    each rail's sum for unbalanced ones, sum_k (1 + w) / 2 for offset
    weights. Decoding multiplies a split-input pass by 1 (two passes, the
    signs) and an offset input or weight by 2; ENOB loss multiplies the
    variance by 4**loss."""
    x, w = operands
    if weights == "offset":
        rails, gain_w = [((1 + w) / 2).sum(axis=0)], 2
    elif balanced:
        rails, gain_w = [np.abs(w).sum(axis=0)], 1
    else:
        rails, gain_w = [np.maximum(w, 0).sum(axis=0), np.maximum(-w, 0).sum(axis=0)], 1
    passes, gain_x = (2, 1) if inputs == "split" else (1, 2)
    expected = passes * (gain_x * gain_w) ** 2 * sum((r / TOP) ** 2 / 12 for r in rails)
    expected = expected * 4.0**enob_loss
    ratio = _error_variance(x, w, {"encoding.inputs": inputs, "encoding.weights": weights,
                                   "detector.balanced": balanced, "adc.bits": BITS,
                                   "adc.full_scale": "max", "adc.enob_loss": enob_loss},
                            backend) / expected
    # 4000 tokens a column: each ratio within ~6 % (1 sigma ~2 %), their mean within ~0.7 %.
    assert abs(ratio.mean() - 1) < 0.015, ratio.mean()
    assert np.all(np.abs(ratio - 1) < 0.12), ratio


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs, gain_x", [("split", 1), ("offset", 2)])
def test_dac_rounding_adds_step_squared_over_12_per_input(operands, backend, inputs, gain_x):
    """Each input's drive is rounded to 1/TOP (split: |x| in [0, 1]; offset:
    (1 + x) / 2, decoded x2), and y's error is that error weighted by w:
    gain_x**2 step**2 / 12 sum_k w**2 (x[:, 0] = 1 and 0 sit on a level)."""
    x, w = operands
    expected = gain_x**2 * (1 / TOP) ** 2 / 12 * (w[1:] ** 2).sum(axis=0)
    ratio = _error_variance(x, w, {"encoding.inputs": inputs, "dac.bits": BITS},
                            backend) / expected
    assert abs(ratio.mean() - 1) < 0.015, ratio.mean()
    assert np.all(np.abs(ratio - 1) < 0.12), ratio


@pytest.mark.parametrize("weights, gain_w", [("split", 1), ("offset", 2)])
def test_mask_rounding_is_a_uniform_error_of_half_a_step_at_most(operands, weights, gain_w):
    """With x = I the output is the decoded mask itself: each weight off by at
    most half a transmission step (times 2 for offset weights), with the
    uniform law's variance over the K x N weights."""
    _, w = operands
    config = {"encoding.weights": weights, "mask.bits": BITS}
    y = optical.matmul(np.eye(K), w, _config(**config), seed=0, backend="numpy")
    error = (y - w)[1:]  # row 0 (all 1) sits on a level
    half_step = gain_w / TOP / 2
    assert np.abs(error).max() <= half_step * (1 + 1e-9)
    assert np.abs(error).max() > 0.9 * half_step  # rounding, not a finer grid
    variance = np.mean(error**2) / (gain_w**2 / TOP**2 / 12)
    assert abs(variance - 1) < 0.1, variance  # 2016 weights: 1 sigma ~3 %
