"""Crosstalk and illumination of the optical core against focal length and aperture.

Run:  python examples/crosstalk_vs_optics.py [--out crosstalk_vs_optics.png] [--points 12]

Starting from the "iris-like" optics (850 nm, 10 um pixels at fill factor
0.9, f = 50 mm, a 50.8 mm fan-out and a 25.4 mm fan-in aperture), sweeps the
focal length of both lenses (at fixed apertures) and the aperture of both
lenses (at fixed focal length), and plots what scalar diffraction predicts:

- nearest-neighbour input coupling (a source's light in the next mask row)
  and output coupling (a mask column's light on the next detector), in dB;
- the illumination fall-off across the 1024 x 2 mask columns,
  ``1 - min(envelope)``, for the flat-top fan-out beam and for the far field
  of a 1.5 um Gaussian source mode.

Requires matplotlib (``pip install -e ".[plot]"``).
"""

import argparse
import os
from pathlib import Path

import numpy as np

import optical
from optical.physics import crosstalk


def _row(cfg: optical.OpticalConfig) -> tuple[float, float, float, float]:
    kern = crosstalk.kernels(cfg)
    gauss = crosstalk.kernels(cfg.replace({"optics.beam_profile": "gaussian"}))
    return (kern.input_coupling[0], kern.output_coupling[0], 1 - kern.envelope.min(),
            1 - gauss.envelope.min())


def sweep(points: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Kernel figures along both sweeps: {name: (x values in mm, rows)}."""
    base = optical.presets.get("iris-like")
    aperture = base.optics.fan_out_aperture
    focal = base.optics.fan_out_focal_length
    # Fan-out f/1 to f/8 (NA 0.5 to 0.06: the paraxial model's range), and
    # f/16 to f/1 at the base focal length; below 20.5 mm the fan-out
    # aperture no longer spans the mask's rail columns.
    focals = np.geomspace(aperture, 8 * aperture, points)
    apertures = np.geomspace(focal / 16, focal, points)
    out = {}
    out["focal length"] = (focals * 1e3, np.array([_row(base.replace({
        "optics.fan_out_focal_length": f, "optics.fan_in_focal_length": f})) for f in focals]))
    out["aperture"] = (apertures * 1e3, np.array([_row(base.replace({
        "optics.fan_out_aperture": d, "optics.fan_in_aperture": d})) for d in apertures]))
    return out


def plot(results: dict[str, tuple[np.ndarray, np.ndarray]], path: str):
    """Draw the four panels and save them to ``path``; returns the Figure.

    Built on ``matplotlib.figure.Figure``, not pyplot: a caller's backend and
    open figures are left alone.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    for col, (name, (x, rows)) in enumerate(results.items()):
        upper, lower = axes[0, col], axes[1, col]
        upper.semilogx(x, 10 * np.log10(rows[:, 0]), "o-", label="input (next row)")
        upper.semilogx(x, 10 * np.log10(rows[:, 1]), "s-", label="output (next detector)")
        upper.set_ylabel("nearest-neighbour coupling, dB")
        lower.loglog(x, np.maximum(rows[:, 2], 1e-6), "o-", label="flat-top line generator")
        lower.loglog(x, np.maximum(rows[:, 3], 1e-6), "s-", label="Gaussian source, 1.5 um waist")
        lower.set_ylabel("illumination fall-off, 1 - min(envelope)\n(under 1e-6: drawn at 1e-6)")
        for ax in (upper, lower):
            ax.set_xlabel(f"{name} of both lenses, mm")
            ax.grid(True, which="both", alpha=0.3)
            # The sweeps span about one decade: decades alone would label one
            # tick (or none); 1-2-5 steps label three or four.
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.legend()
    fig.suptitle("iris-like core: crosstalk and illumination from scalar diffraction")
    fig.savefig(path, dpi=120)
    return fig



def main() -> None:
    from _cli import positive  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="crosstalk_vs_optics.png", help="PNG to write")
    parser.add_argument("--points", type=positive, default=12, help="points per sweep")
    args = parser.parse_args()
    # Before the sweep's work: the figure's package and directory.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("the figure needs matplotlib: pip install -e '.[plot]'") from None
    if not args.out.strip() or Path(args.out).is_dir() or args.out.endswith(("/", os.sep)):
        # "." wrote a hidden ".png"; "new/" failed after the whole sweep
        raise ValueError(f"--out {args.out!r}: expected a file name for the PNG, not a directory")
    if not Path(args.out).suffix:  # as matplotlib names it (it said "wrote NAME")
        args.out += ".png"
    if not Path(args.out).absolute().parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: no such directory")
    results = sweep(args.points)
    for name, (x, rows) in results.items():
        print(f"{name:>12s} mm   input dB  output dB  fall-off flat  fall-off gauss")
        for value, row in zip(x, rows, strict=True):
            print(f"{value:15.2f} {10 * np.log10(row[0]):10.1f} {10 * np.log10(row[1]):10.1f} "
                  f"{row[2]:14.4f} {row[3]:15.4f}")
    plot(results, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    from _cli import run

    run(main, __file__)
