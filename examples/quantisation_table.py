"""What each mapping choice buys: SQNR of a Gaussian layer at 4, 6 and 8 bits.

On activations with and without a few outlier channels.

Run:  python examples/quantisation_table.py [--preset ideal] [--tokens 128]

Prints the Markdown table of docs/quantisation.md. The layer is 4096 x 512
(Gaussian weights, 1024 x 1024 core); activations are Gaussian, and in the
"outliers" columns 8 of the 4096 input channels (0.2 %) are scaled by x10 to
x100; calibration inputs (512 tokens) and evaluation inputs are drawn
separately from the same distribution. DAC, mask and ADC all have the
column's number of bits; the rest of the machine is the preset's (default
"ideal": no noise, so the table shows the mapping alone; "iris-like" adds its
noise, its converters' 1.5 lost bits, and its lens optics with the mask
pre-distorted for them, ``mask.compensate``). The reference is the exact float64
product.
"""

import argparse
import time

import numpy as np

import optical

K, N = 4096, 512
OUTLIERS = 8

# Every mapping knob is set by each row, whatever the preset chooses (iris-like,
# for one, bypasses outlier channels by default).
NAIVE = {"dac.scaling": "per_tensor", "mask.scaling": "per_tensor", "adc.full_scale": "max",
         "adc.window": "per_column", "outliers.policy": "none"}
CALIBRATED = {**NAIVE, "mask.scaling": "per_column", "adc.full_scale": "calibrated"}
TOKEN_CAL = {**CALIBRATED, "dac.scaling": "per_token"}
BYPASS = {"outliers.policy": "static", "outliers.top_k": K // 100}

#: (label, config changes)
ROWS = [
    ("naive: per-tensor abs-max inputs and weights, ADC spans every possible readout",
     NAIVE),
    ("per-tensor weights, calibrated ADC windows", {**NAIVE, "adc.full_scale": "calibrated"}),
    ("per-column weights, calibrated ADC windows", CALIBRATED),
    ("per-tile-column weights, calibrated ADC windows",
     {**CALIBRATED, "mask.scaling": "per_tile_column"}),
    ("per-column weights, calibrated ADC, per-token inputs", TOKEN_CAL),
    ("... same, one calibrated ADC window per tile", {**TOKEN_CAL, "adc.window": "per_tile"}),
    ("... same, default ADC windows (+-4 sigma of a uniform input)",
     {**TOKEN_CAL, "adc.full_scale": "rms"}),
    ("... same, static input range (99.99th percentile) instead of per-token",
     {**CALIBRATED, "dac.scaling": "static"}),
    ("per-token + calibrated ADC + static outlier bypass (top 1 % of channels above 6x median)",
     {**TOKEN_CAL, **BYPASS}),
    ("static range + calibrated ADC + static bypass (everything fixed when programmed)",
     {**CALIBRATED, "dac.scaling": "static", **BYPASS}),
    ("per-token + calibrated ADC + dynamic bypass (chosen per call)",
     {**TOKEN_CAL, **BYPASS, "outliers.policy": "dynamic"}),
]


def activations(rng: np.random.Generator, tokens: int, channels: np.ndarray,
                scales: np.ndarray, outliers: bool) -> np.ndarray:
    x = rng.standard_normal((tokens, K), dtype=np.float32)
    if outliers:
        x[:, channels] *= scales
    return x



def main() -> None:
    from _cli import positive, seed_type  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ideal", choices=optical.presets.names())
    parser.add_argument("--tokens", type=positive, default=128)
    parser.add_argument("--seed", type=seed_type, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    channels = rng.choice(K, OUTLIERS, replace=False)
    scales = np.geomspace(10, 100, OUTLIERS).astype(np.float32)
    data = {}
    for outliers in (True, False):
        cal = activations(rng, 512, channels, scales, outliers)
        x = activations(rng, args.tokens, channels, scales, outliers)
        data[outliers] = (cal, x, x.astype(np.float64) @ w.astype(np.float64))

    base = optical.presets.get(args.preset).replace({"core.inputs": 1024, "core.outputs": 1024})
    bits = (4, 6, 8)
    start = time.perf_counter()
    heads = [f"{b} bits, {kind}" for kind in ("outliers", "no outliers") for b in bits]
    print(f"| mapping | {' | '.join(heads)} | digital MACs (6 bits, outliers) "
          "| ADC clipped (6 bits, outliers) |")
    print(f"|---|{'---:|' * len(heads)}---:|---:|")
    for label, changes in ROWS:
        cells, clipped, digital = [], 0.0, 0.0
        for outliers in (True, False):
            cal, x, exact = data[outliers]
            for b in bits:
                cfg = base.replace({**changes, "dac.bits": b, "mask.bits": b, "adc.bits": b})
                programmed = optical.program(w, cfg, calibration=cal)
                y, stats = optical.matmul(x, programmed, cfg, seed=args.seed, return_stats=True)
                cells.append(f"{optical.metrics.sqnr_db(exact, y):.1f}")
                if outliers and b == 6:
                    clipped, digital = stats.clipped_fraction, stats.digital_mac_fraction
        print(f"| {label} | {' | '.join(cells)} | {digital:.1%} | {clipped:.2%} |")
    print(f"\nSQNR in dB against the exact float64 product; preset {args.preset!r}, "
          f"{args.tokens} evaluation tokens, seed {args.seed}; "
          f"{time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
    from _cli import run

    run(main, __file__)
