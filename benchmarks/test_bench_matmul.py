"""The numpy reference backend against the plain fp32 matmul, 512 x 4096 @ 4096 x 4096.

The reference is the readable, draw-for-draw definition of the emulator, not a
fast path (those are in test_bench_kernels.py, on the same case and operands:
run together, the two files share the case's baselines). Its weights are
programmed once, outside the timing, as for the fast paths: a weight load is
not part of a matmul (test_bench_quant.py times programming). At ~2.5 s a call
here, one warm-up round and two timed rounds keep this file to ~15-25 s.
"""

import pytest
from baselines import jax_matmul

import optical

CASE = "512x4096@4096x4096"
CFG = optical.presets.get("iris-like")


def test_baseline_numpy(benchmark, operands, record):
    x, w = operands
    benchmark.pedantic(lambda: x @ w, rounds=5, warmup_rounds=1)
    record(CASE, "baseline numpy x @ w", benchmark)


def test_baseline_jax(benchmark, operands, record):
    pytest.importorskip("jax")
    x, w = operands
    benchmark.pedantic(jax_matmul(x, w), rounds=5, warmup_rounds=1)
    record(CASE, "baseline jax jit x @ w", benchmark)


def test_optical_numpy_reference_iris_like(benchmark, operands, record):
    x, w = operands
    programmed = optical.program(w, CFG, calibration=x[:256])
    benchmark.pedantic(lambda: optical.matmul(x, programmed, CFG, seed=0, backend="numpy"),
                       rounds=2, warmup_rounds=1)
    record(CASE, "optical numpy ref, iris-like, programmed once", benchmark)
