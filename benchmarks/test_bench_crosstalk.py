"""Cost of the lens crosstalk: programming and the optical matmul with the
iris-like optics on (scalar-diffraction kernels) against the same config with
ideal optics, in the same run: each case's baseline is the ideal-optics
config, not a plain matmul. The kernels act once per weight load, so the
matmul pays them only through program(): the matmul rows pass raw weights
and program (calibrated on the call's own 512 tokens) on every call."""

import pytest

import optical
from optical.physics import crosstalk

PROGRAM_CASE = "program 4096x4096 iris-like"
MATMUL_CASE = "matmul 512x4096@4096x4096 iris-like"


@pytest.fixture(scope="module")
def configs():
    on = optical.presets.get("iris-like")
    assert on.optics.model == "diffraction"
    crosstalk.kernels(on)  # computed once per configuration, outside the timing
    return on, on.replace({"optics.model": "ideal"})


def test_program_crosstalk_off(benchmark, operands, configs, record):
    x, w = operands
    benchmark.pedantic(lambda: optical.program(w, configs[1], calibration=x[:256]), rounds=5,
                       warmup_rounds=1)
    record(PROGRAM_CASE, "baseline program, ideal optics", benchmark)


def test_program_crosstalk_on(benchmark, operands, configs, record):
    x, w = operands
    benchmark.pedantic(lambda: optical.program(w, configs[0], calibration=x[:256]), rounds=5,
                       warmup_rounds=1)
    record(PROGRAM_CASE, "program, diffraction optics", benchmark)


def test_matmul_crosstalk_off(benchmark, operands, configs, record):
    x, w = operands
    benchmark.pedantic(lambda: optical.matmul(x, w, configs[1], seed=0), rounds=3,
                       warmup_rounds=1)
    record(MATMUL_CASE, "baseline matmul, ideal optics (programs every call)", benchmark)


def test_matmul_crosstalk_on(benchmark, operands, configs, record):
    x, w = operands
    benchmark.pedantic(lambda: optical.matmul(x, w, configs[0], seed=0), rounds=3,
                       warmup_rounds=1)
    record(MATMUL_CASE, "matmul, diffraction optics (programs every call)", benchmark)
