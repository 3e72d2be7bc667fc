"""Precision sweep of one Llama-3.1-8B layer: ADC bits x mask (weight) bits, with plots.

Run:  python examples/llama_layer_sweep.py [--model models/llama-3.1-8b] [--layer 0]
          [--tokens 128] [--seeds 2] [--out runs/<model>-precision] [--jobs N]

Every point runs the layer's prefill on the "iris-like" machine with the ADC and
mask resolutions changed, against the layer's floating-point reference
(``optical.transformer.validate``), for each noise seed. The sweep is resumable:
run the same command again after an interruption and only the missing runs run.
It ends with three figures in OUT/plots/: the layer output's SQNR against ADC
bits (one line per mask resolution), a heatmap of the same, and the SQNR of each
product of the layer (seven weight matmuls, the two attention products) and of
its output at 8-bit masks.

Same sweep from the command line:

    optical sweep --model models/llama-3.1-8b --layer 0 --tokens 128 \\
        --param adc.bits=4,6,8,10 --param mask.bits=4,6,8 --seeds 2 \\
        --out runs/llama-3.1-8b-precision
    optical plot runs/llama-3.1-8b-precision --x adc.bits --y sqnr_db --hue mask.bits

Memory: each worker process holds one layer (about 0.9 GB in float32 for
Llama-3.1-8B's 218 M weights per layer) plus its activations; lower --jobs if
that does not fit. Without ``*.safetensors`` in the model directory the weights
are synthetic (seeded, with the outlier statistics of real Llamas).
"""

import argparse
from pathlib import Path

import optical
from optical import plots

ROOT = Path(__file__).resolve().parent.parent



def main() -> None:
    from _cli import positive  # (examples/_cli.py, beside this script)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "llama-3.1-8b"))
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--tokens", type=positive, default=128)
    parser.add_argument("--seeds", type=positive, default=2)
    parser.add_argument("--out", default=None,
                        help="sweep directory (default runs/<model directory name>-precision)")
    parser.add_argument("--jobs", type=positive, default=None,
                        help="worker processes (default: every core)")
    args = parser.parse_args()
    if args.out is None:  # one directory per model: another model's sweep there is refused
        args.out = f"runs/{Path(args.model).resolve().name}-precision"

    workload = optical.LayerWorkload(args.model, layer=args.layer, tokens=args.tokens)
    frame = optical.sweep(
        workload,
        {"adc.bits": [4, 6, 8, 10], "mask.bits": [4, 6, 8]},
        seeds=args.seeds, out=args.out, base="iris-like", executor=args.jobs,
    )

    stats = ["mean", "std"] if args.seeds > 1 else ["mean"]  # (one seed has no spread)
    summary = frame.groupby(["mask.bits", "adc.bits"])["sqnr_db"].agg(stats)
    print(f"{workload.label}: layer-output SQNR (dB), {' and '.join(stats)} over "
          f"{args.seeds} seed{'s' if args.seeds > 1 else ''}")
    print(summary.round(2).to_string())

    out = Path(args.out) / "plots"
    figures = {
        "sqnr_db-vs-adc.bits": plots.line(frame, "adc.bits", "sqnr_db", hue="mask.bits"),
        "sqnr_db-heatmap": plots.heatmap(frame, "adc.bits", "mask.bits", "sqnr_db"),
        "sqnr_db-per-matmul": plots.matmul_bars(frame, "sqnr_db", hue="adc.bits",
                                                where={"mask.bits": 8}),
    }
    for name, fig in figures.items():
        for path in plots.save(fig, out / name):
            print(path)


if __name__ == "__main__":
    from _cli import run

    run(main, __file__, resumable=True)
