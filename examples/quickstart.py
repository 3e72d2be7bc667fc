"""Quickstart: one 4096 x 4096 layer at 512 tokens under every preset.

Run:  python examples/quickstart.py [--tokens 512] [--size 4096]

Prints, for each preset, the accuracy of the optical matmul against the exact
float64 result (SQNR, cosine, relative error) and what the hardware did. The
weights are programmed once per preset (calibrated on held-out inputs where the
preset's mapping needs it); the time includes programming.
"""

import argparse
import math
import time

import numpy as np

import optical


def main() -> None:
    from _cli import positive, seed_type  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=positive, default=512)
    parser.add_argument("--size", type=positive, default=4096)
    parser.add_argument("--seed", type=seed_type, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.tokens, args.size), dtype=np.float32)
    w = rng.standard_normal((args.size, args.size), dtype=np.float32) / math.sqrt(args.size)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    # Held-out example inputs, for the presets whose mapping is calibrated.
    x_calibration = rng.standard_normal((256, args.size), dtype=np.float32)

    print(f"x: {x.shape}, w: {w.shape}, float32, Gaussian; reference: exact float64 matmul")
    print(f"{'preset':12s} {'SQNR dB':>8s} {'cosine':>9s} {'rel.err':>9s} {'passes':>10s} "
          f"{'photoelectrons':>15s} {'clipped':>8s} {'time s':>7s}")
    for name in optical.presets.names():
        cfg = optical.presets.get(name)
        start = time.perf_counter()
        needs = optical.quant.calibration_needs(cfg)
        programmed = optical.program(w, cfg, calibration=x_calibration if needs else None)
        y, stats = optical.matmul(x, programmed, cfg, seed=args.seed, return_stats=True)
        elapsed = time.perf_counter() - start
        print(f"{name:12s} {optical.metrics.sqnr_db(exact, y):8.2f} "
              f"{optical.metrics.cosine(exact, y):9.6f} "
              f"{optical.metrics.relative_error(exact, y):9.2e} {stats.passes:10d} "
              f"{stats.mean_photoelectrons:15.4g} {stats.clipped_fraction:8.2%} {elapsed:7.2f}")


if __name__ == "__main__":
    from _cli import run

    run(main, __file__)
