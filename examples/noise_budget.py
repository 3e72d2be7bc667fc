"""Noise budget: which error source limits a preset's matmul, term by term.

Run:  python examples/noise_budget.py [--preset iris-like] [--tokens 256] [--size 1024]

Starts from the preset with every error source off (no shot, RIN, dark or read
noise, exact converters and mask, ideal optics; its mapping, outlier channels
and calibration kept) and switches one source on at a time, programming the
weights afresh on held-out inputs each time, as the machine would be
calibrated for that configuration. Each row is that source's error power
alone, as an SQNR against the exact float64 product, and its share of the
summed error powers. Dark and read noise are referred to the signal's photons,
so they exist only with shot noise: their rows are the error they add to shot
noise alone. A source the mapping cancels (iris-like pre-distorts its mask for
the lens crosstalk) reads "at the floor". The last lines compare the sum of
the parts with the preset itself: independent errors add in power, so the two
agree where the terms do not interact (the ADC windows, calibrated on each
configuration's own noise, are where they do).
"""

import argparse
import math

import numpy as np

import optical

#: Every error source off: the quiet machine each row adds one source to.
QUIET = {"source.photons_per_mac": math.inf, "source.rin_db_per_hz": -math.inf,
         "detector.dark_electrons": 0.0, "detector.read_noise_electrons": 0.0,
         "adc.bits": None, "adc.enob_loss": 0.0, "dac.bits": None, "mask.bits": None,
         "optics.model": "ideal"}

#: Rows: (name, the preset's fields it switches on, the last its own; the row
#: it is measured above).
TERMS = [
    ("mask quantisation", ("mask.bits",), None),
    ("DAC quantisation", ("dac.bits",), None),
    ("optics (crosstalk)", ("optics.model",), None),
    ("ADC quantisation", ("adc.bits",), None),
    ("ADC noise (ENOB loss)", ("adc.bits", "adc.enob_loss"), "ADC quantisation"),
    ("RIN", ("source.rin_db_per_hz",), None),
    ("shot noise", ("source.photons_per_mac",), None),
    ("dark counts", ("source.photons_per_mac", "detector.dark_electrons"), "shot noise"),
    ("read noise", ("source.photons_per_mac", "detector.read_noise_electrons"), "shot noise"),
]


def error_power(x, w, x_calibration, exact, config, seed):
    """Mean squared error of ``x @ w`` on ``config``, its weights programmed
    on ``x_calibration`` where the config needs calibration."""
    needs = optical.quant.calibration_needs(config)
    programmed = optical.program(w, config, calibration=x_calibration if needs else None)
    y = optical.matmul(x, programmed, config, seed=seed)
    return float(np.mean((y - exact) ** 2))


def budget(preset, x, w, x_calibration, seed=0):
    """(parts, floor, full): each error source's added error power (the
    rows of :data:`TERMS` that ``preset`` has on), the quiet machine's and
    the preset's own, against the exact float64 product."""
    exact = x.astype(np.float64) @ w.astype(np.float64)
    quiet = preset.replace(QUIET)
    floor = error_power(x, w, x_calibration, exact, quiet, seed)
    alone, parts = {}, {}
    for name, paths, above in TERMS:
        if preset.get(paths[-1]) == quiet.get(paths[-1]):
            continue  # the preset has this source off too
        config = quiet.replace({p: preset.get(p) for p in paths})
        alone[name] = error_power(x, w, x_calibration, exact, config, seed) - floor
        parts[name] = alone[name] - (alone[above] if above in alone else 0.0)
    return parts, floor, error_power(x, w, x_calibration, exact, preset, seed)



def main() -> None:
    from _cli import positive, seed_type  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="iris-like", choices=optical.presets.names())
    parser.add_argument("--tokens", type=positive, default=256)
    parser.add_argument("--size", type=positive, default=1024)
    parser.add_argument("--seed", type=seed_type, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.tokens, args.size), dtype=np.float32)
    w = rng.standard_normal((args.size, args.size), dtype=np.float32) / math.sqrt(args.size)
    x_calibration = rng.standard_normal((256, args.size), dtype=np.float32)
    signal = float(np.mean((x.astype(np.float64) @ w.astype(np.float64)) ** 2))
    parts, floor, full = budget(optical.presets.get(args.preset), x, w, x_calibration,
                                args.seed)
    total = sum(max(p, 0.0) for p in parts.values())

    def db(power):
        return f"{10 * math.log10(signal / power):14.2f}" if power > 0 else \
            f"{'at the floor':>14s}"

    print(f"{args.preset}: ({args.tokens}, {args.size}) @ ({args.size}, {args.size}), "
          "Gaussian; SQNR against the exact float64 product")
    print(f"{'error source':24s} {'SQNR alone dB':>14s} {'share':>7s}")
    for name, power in parts.items():
        share = max(power, 0.0) / total if total > 0 else 0.0
        print(f"{name:24s} {db(power)} {share:7.1%}")
    print(f"{'none of them (mapping)':24s} {db(floor)}")
    print(f"{'sum of the parts':24s} {db(total + floor)}")
    print(f"{'the preset':24s} {db(full)}")


if __name__ == "__main__":
    from _cli import run

    run(main, __file__)
