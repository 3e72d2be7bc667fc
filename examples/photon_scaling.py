"""Photons per MAC against dot-product width at Llama sizes, measured with the emulator.

Run:  python examples/photon_scaling.py [--target-snr 20] [--preset ideal]
      [--widths 2048 4096 8192 14336 28672] [--tokens 16] [--outputs 64]

For each width d (Llama 3.2 1B / 3.1 8B / 3.1 70B hidden sizes, and the 8B
and 70B MLP widths) the emulator runs x (tokens, d) @ w (d, outputs) on a core
whose fan-in is d, and finds the detected photons per MAC p* at which the
output SNR reaches the target (optical.energy.photons.required_photons). A
power-law fit of p* against d gives the exponent:

- coherent operands (uniform on [0, 1]: the sum grows like d): p* ~ 1/d, so
  the optical energy per MAC falls as 1/d (Anderson et al., Optical
  Transformers, 2024);
- zero-mean operands (uniform on [-1, 1]: the sum grows like sqrt(d)): p* is
  flat.

With --preset iris-like the read noise, RIN and 8-bit converters of that
preset stay on (its core is resized to d x outputs); the converters set an
SNR ceiling, so keep the target below it. Its calibrated ADC windows (fitted
on each call's own inputs, as raw weights are programmed) suit both kinds of
operands; with --set adc.full_scale=rms, a window centred for zero-mean
inputs, coherent operands clip and their SNR stops rising (the "max" window
in turn leaves zero-mean sums, which grow only as sqrt(d), too few ADC codes).
"""

import argparse
import time

import optical
from optical.config import parse_value
from optical.energy import photons


def main() -> None:
    from _cli import positive, seed_type  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=positive, nargs="+",
                        default=[2048, 4096, 8192, 14336, 28672])
    parser.add_argument("--target-snr", type=float, default=20.0, help="output SNR, dB")
    parser.add_argument("--preset", default="ideal", choices=optical.presets.names())
    parser.add_argument("--tokens", type=positive, default=16)
    parser.add_argument("--outputs", type=positive, default=64)
    parser.add_argument("--seed", type=seed_type, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE", help="override a config field (repeatable)")
    args = parser.parse_args()

    cfg = optical.presets.get(args.preset)
    for item in args.overrides:
        path, _, text = item.partition("=")
        cfg = cfg.replace({path: parse_value(path, text)})
    overrides = "".join(f" {item}" for item in args.overrides)
    print(f"preset {args.preset}{overrides}, target SNR {args.target_snr} dB, {args.tokens} "
          f"tokens x {args.outputs} outputs per width; energy per MAC from the preset's "
          "energy section")
    for operands in photons.OPERANDS:
        start = time.perf_counter()
        try:
            result = photons.photon_scaling(args.widths, target_snr_db=args.target_snr,
                                            operands=operands, tokens=args.tokens,
                                            outputs=args.outputs, config=cfg, seed=args.seed)
        except ValueError as err:  # a converter or noise floor below the target
            print(f"\n{operands}: {err}")
            continue
        print(f"\n{operands}: p* ~ d^{result.photons_exponent:+.3f}, laser energy per MAC ~ "
              f"d^{result.energy_exponent:+.3f}  ({time.perf_counter() - start:.1f} s)")
        print(f"  {'width':>7s} {'photons/MAC':>12s} {'dB/decade':>10s} {'laser J/MAC':>12s}")
        for r in result.requirements:
            print(f"  {r.width:7d} {r.photons_per_mac:12.4g} {r.snr_slope_db_per_decade:10.2f} "
                  f"{r.laser_energy_per_mac:12.3e}")


if __name__ == "__main__":
    from _cli import run

    run(main, __file__)
