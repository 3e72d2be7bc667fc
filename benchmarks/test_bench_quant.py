"""Programming a Llama-3-8B MLP-sized matrix (4096 x 14336) once, and streaming
inputs through the programmed matrix against programming it on every call.

Baselines: numpy's ``x @ w`` and a jitted JAX ``x @ w`` (skipped without JAX),
the emulator's GEMMs running in XLA when JAX is installed; each ratio is to the
faster of the two.
"""

import numpy as np
import pytest
from baselines import jax_matmul

import optical

K, N = 4096, 14336
PROGRAM = f"program {K}x{N} (vs 512-token GEMM)"
STREAM = f"128x{K}@{K}x{N} programmed vs raw"


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N), dtype=np.float32)
    calibration = rng.standard_normal((1024, K), dtype=np.float32)
    return w, calibration


@pytest.fixture(scope="module")
def iris():
    return optical.presets.get("iris-like")


def test_baseline_prefill_gemm(benchmark, weights, record):
    w, _ = weights
    x = np.random.default_rng(1).standard_normal((512, K), dtype=np.float32)
    benchmark.pedantic(lambda: x @ w, rounds=3, warmup_rounds=1)
    record(PROGRAM, "baseline numpy 512-token x @ w", benchmark)


def _jax_gemm(x, w):
    pytest.importorskip("jax")
    return jax_matmul(x, w)


def test_baseline_prefill_gemm_jax(benchmark, weights, record):
    w, _ = weights
    x = np.random.default_rng(1).standard_normal((512, K), dtype=np.float32)
    benchmark.pedantic(_jax_gemm(x, w), rounds=3, warmup_rounds=1)
    record(PROGRAM, "baseline jax jit 512-token x @ w", benchmark)


@pytest.mark.parametrize(("label", "changes"), [
    ("program iris-like (calibrated windows, static bypass)", {}),
    ("program rms windows, no bypass", {"adc.full_scale": "rms", "outliers.policy": "none"}),
    ("program per-tile-column scales", {"mask.scaling": "per_tile_column"}),
    ("program static range + bypass", {"dac.scaling": "static"}),
])
def test_program(benchmark, weights, iris, record, label, changes):
    w, calibration = weights
    cfg = iris.replace(changes)
    # A warm-up round: the first one also maps fresh memory (~1.3 s per GiB
    # on the sandboxed machines this runs on) and loads JAX for the readouts.
    benchmark.pedantic(lambda: optical.program(w, cfg, calibration=calibration), rounds=2,
                       warmup_rounds=1)
    record(PROGRAM, label, benchmark)


@pytest.fixture(scope="module")
def stream_inputs():
    return np.random.default_rng(2).standard_normal((128, K), dtype=np.float32)


def test_baseline_stream_gemm(benchmark, weights, stream_inputs, record):
    w, _ = weights
    benchmark.pedantic(lambda: stream_inputs @ w, rounds=5, warmup_rounds=1)
    record(STREAM, "baseline numpy x @ w", benchmark)


def test_baseline_stream_gemm_jax(benchmark, weights, stream_inputs, record):
    w, _ = weights
    benchmark.pedantic(_jax_gemm(stream_inputs, w), rounds=5, warmup_rounds=1)
    record(STREAM, "baseline jax jit x @ w", benchmark)


def test_matmul_with_programmed_weights(benchmark, weights, iris, stream_inputs, record):
    w, calibration = weights
    programmed = optical.program(w, iris, calibration=calibration)
    benchmark.pedantic(lambda: optical.matmul(stream_inputs, programmed, iris, seed=0), rounds=3,
                       warmup_rounds=1)
    record(STREAM, "optical.matmul, programmed once", benchmark)


def test_matmul_with_raw_weights(benchmark, weights, iris, stream_inputs, record):
    w, _ = weights
    # ~1-2 s a call: one warm-up round (the first also maps fresh memory) and two timed.
    benchmark.pedantic(lambda: optical.matmul(stream_inputs, w, iris, seed=0), rounds=2,
                       warmup_rounds=1)
    record(STREAM, "optical.matmul, programs every call", benchmark)
