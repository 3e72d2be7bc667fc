"""The synthetic-optics compensation table of docs/quantisation.md.

The case of tests/test_compensation.py (a 512 x 128 layer, 6-bit DAC and ADC,
8-bit mask, calibrated windows; illumination falling to 0.8 at the tile sides
and 3 % crosstalk to each neighbouring row and column), with converters only
and with iris-like's noise, for split and offset weights. The synthetic
optics are plugged in where the lens model would be (``quant._optics_map``).

    python tools/compensation_table.py   # a few seconds
"""

import numpy as np

import optical
from optical import metrics, quant
from optical.compensation import SeparableCoupling

COMMON = {"core.inputs": 256, "core.outputs": 64, "dac.bits": 6, "adc.bits": 6,
          "mask.bits": 8, "adc.full_scale": "calibrated"}
CASES = {
    "converters only (ideal preset)": optical.presets.get("ideal").replace(COMMON),
    "iris-like noise (no bypass)": optical.presets.get("iris-like").replace(
        {**COMMON, "outliers.policy": "none", "optics.model": "ideal",
         "mask.compensate": False}),
}


def coupling(tile_k: int, tile_n: int, edge: float = 0.8, leak: float = 0.03):
    j = np.linspace(-1, 1, tile_k)[:, None]
    n = np.linspace(-1, 1, tile_n)[None, :]
    kernel = np.array([leak, 1 - 2 * leak, leak])
    return SeparableCoupling(edge ** (j**2 + n**2), kernel, kernel)


def sqnr(optics, cfg, w, cal, x) -> float:
    original = quant._optics_map
    quant._optics_map = lambda config: optics
    try:
        y = optical.matmul(x, optical.program(w, cfg, calibration=cal), cfg, seed=0)
    finally:
        quant._optics_map = original
    return metrics.sqnr_db(x @ w, y)


def main() -> None:
    rng = np.random.default_rng(20261202)  # the tests' rng fixture
    w = rng.standard_normal((512, 128))
    cal = rng.standard_normal((256, 512))
    x = rng.standard_normal((64, 512))
    optics = coupling(256, 64)
    print(f"{'SQNR (dB)':40s} {'ideal optics':>12s} {'uncompensated':>14s} {'compensated':>12s}")
    for label, cfg in CASES.items():
        for weights in ("split", "offset"):
            case = cfg.replace({"encoding.weights": weights})
            row = (sqnr(None, case, w, cal, x), sqnr(optics, case, w, cal, x),
                   sqnr(optics, case.replace({"mask.compensate": True}), w, cal, x))
            print(f"{label + ', ' + weights:40s} {row[0]:12.2f} {row[1]:14.2f} {row[2]:12.2f}")


if __name__ == "__main__":
    main()
