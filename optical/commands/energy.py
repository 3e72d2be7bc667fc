"""``optical energy``: what a prefill costs on the optical machine, component by
component, against a GPU."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from optical._version import RESULTS_VERSION, __version__, source_commit
from optical.commands._common import (
    add_config_options,
    add_json_option,
    check_not_json,
    check_output_path,
    config_from_args,
    config_label,
    config_source,
    description,
    path_argument,
    require,
    write_json_and_show,
)
from optical.energy import compare, model, workload
from optical.energy import gpu as gpu_model
from optical.transformer.spec import read_spec

EXAMPLES = """examples:
  optical energy --model models/llama-3.1-8b --prompt-tokens 2048 --preset iris-like
  optical energy --model models/llama-3.1-70b --prompt-tokens 2048 --gpu h200 \\
      --set energy.cores=64 --batch 8 --json energy.json --plot energy.png

reading the report:
  J (batch)        the whole batch's energy (one prompt's at --batch 1), J
  GPU / optical    ratios of energy and of time to first token; > 1: optics wins
  break-even photons/MAC at this batch
                   the photons_per_mac at which both cost the same energy;
                   optics uses less below it
  break-even batch at these photons
                   the fewest prompts per weight load at which optics uses no
                   more energy per token than the GPU
  break-even prompt tokens at this batch
                   the shortest prompt at which optics uses no more energy per
                   token than the GPU (every length tried, up to 8192, the
                   model's max_position_embeddings if fewer, or
                   --prompt-tokens if more)
  disaggregated    optical prefill + GPU decode against all-GPU, per request
                   (ratio: all-GPU over disaggregated)
The model, its formulas and the source of every default: docs/energy.md.
"""


def _check_counts(args: argparse.Namespace) -> None:
    """The counts and rates in range, named as their options (after parsing,
    as validate and sweep check theirs: one line, not argparse's usage)."""
    for option in ("--prompt-tokens", "--batch", "--output-tokens"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise ValueError(f"{option}: {value} must be a positive integer")
    for option in ("--gpu-utilization", "--requests-per-s"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and not 0 < value < float("inf"):
            raise ValueError(f"{option}: {value} must be a positive finite number")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "energy", help="energy and time to first token of a prefill, optical vs GPU",
        description=description(__doc__), epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=path_argument, metavar="DIR",
                        help="model directory with a config.json")
    parser.add_argument("--prompt-tokens", type=int, default=None, metavar="N",
                        help="tokens per prompt (default 2048, a long prompt: the mask "
                             "loads are amortised over it; or the model's "
                             "max_position_embeddings if smaller, e.g. 512 for "
                             "all-MiniLM-L6-v2, less --output-tokens for a decoder; "
                             "validate defaults to 256)")
    parser.add_argument("--batch", type=int, default=1,
                        help="prompts prefilled together, i.e. per weight load (default 1)")
    parser.add_argument("--gpu", default="h100", choices=sorted(gpu_model.GPUS),
                        help="GPU baseline (default h100)")
    parser.add_argument("--gpu-utilization", type=float, default=None, metavar="U",
                        help="achieved fraction of the GPU's peak FLOP/s (default 0.5)")
    parser.add_argument("--output-tokens", type=int, default=256, metavar="N",
                        help="tokens generated per request, for the disaggregated estimate "
                             "(default 256)")
    parser.add_argument("--requests-per-s", type=float, default=1.0, metavar="R",
                        help="request rate of the disaggregated estimate (default 1)")
    parser.add_argument("--plot", type=path_argument, metavar="PATH",
                        help="write a stacked-bar figure (needs matplotlib)")
    add_config_options(parser, preset_note=(
        "; the ideal preset's source, converters and mask, and wang-2022's ADC, have no "
        "finite price: give them with --set, as the error lists"))
    add_json_option(parser)
    parser.set_defaults(run=run)


def _ratio(value: float) -> str:
    """A ratio to 3 significant digits, or as many more as it takes for a
    ratio that is not 1 not to print as "1" (1.0023: "1.002"), so that which
    side wins stays visible."""
    for digits in range(3, 18):
        text = f"{value:.{digits}g}"
        if text != "1" or value == 1:
            return text
    return repr(value)


def _hardware(args: argparse.Namespace) -> str:
    """The config priced, for the report's heading and the plot's title:
    ``preset iris-like + adc.bits=6`` or ``config machine.json``."""
    return ("preset " if args.preset is not None else "config ") + config_label(args)


def run(args: argparse.Namespace) -> int:
    _check_counts(args)
    if args.plot is not None:  # before the work, not after it
        from optical.energy.plot import figure_path

        check_output_path(args.plot, "--plot")
        args.plot = figure_path(args.plot, "--plot")
        check_output_path(args.plot, "--plot")
        check_not_json(args, [args.plot], "--plot")
        require("matplotlib", "plot", "--plot")
    cfg = config_from_args(args)
    spec = read_spec(args.model)
    decoder = spec.architecture == "llama"  # an encoder decodes nothing
    if args.prompt_tokens is None:  # leave a decoder's context room for the output
        limit = spec.max_positions  # None: a Llama config without the key, no limit
        room = 2048 if limit is None else limit - (args.output_tokens if decoder else 0)
        args.prompt_tokens = min(2048, max(1, room))
    spec.check_tokens(args.prompt_tokens, "--prompt-tokens")
    if decoder:
        workload.check_context(spec, args.prompt_tokens, args.output_tokens, "--output-tokens")
    gpu = gpu_model.get_gpu(args.gpu)
    if args.gpu_utilization is not None:
        if args.gpu_utilization > 1:
            raise ValueError(f"--gpu-utilization: {args.gpu_utilization} is out of range; "
                             "valid: (0, 1]")
        gpu = gpu.replace(compute_utilization=args.gpu_utilization)
    work = workload.Workload(args.prompt_tokens, args.output_tokens, args.requests_per_s)
    if decoder:  # before the work: a load past what is counted
        workload.check_load(spec, work, gpu, "--requests-per-s x --output-tokens")
    name = Path(args.model).name
    opt = model.prefill(spec, args.prompt_tokens, cfg, batch=args.batch, model=name)
    ref = gpu_model.prefill(spec, args.prompt_tokens, gpu, batch=args.batch)
    comparison = compare.compare(spec, args.prompt_tokens, cfg, gpu, batch=args.batch)
    split = (workload.disaggregated(spec, work, cfg, gpu, prefill_batch=args.batch)
             if decoder else None)
    result: dict[str, Any] = {
        "model": str(args.model), "model_dir": str(Path(args.model).resolve()),
        "prompt_tokens": args.prompt_tokens, "batch": args.batch,
        **config_source(args), "config": cfg.to_dict(),
        "optical": opt.to_dict(), "gpu": ref.to_dict(), "comparison": comparison,
        "disaggregated": split,
        # What the estimate read of config.json, and the code that computed it:
        # an energy model's change moves these numbers, not RESULTS_VERSION.
        "model_spec": _spec_record(spec),
        "optical_version": __version__, "optical_commit": source_commit(),
        "results_version": RESULTS_VERSION,
    }
    if args.plot is not None:
        from optical.energy.plot import plot_breakdown

        result["plot"] = str(plot_breakdown(opt, ref, args.plot, hardware=_hardware(args)))
    def show() -> None:
        _print_report(args, name, cfg, gpu, opt, ref, comparison, split)
        if args.plot is not None:
            print(f"plot: {result['plot']}")

    write_json_and_show(args, result, show)
    return 0


def _spec_record(spec: Any) -> dict[str, Any]:
    """The shape of the model the estimate counts, by ModelSpec's names
    (what it reads of config.json: ``ModelSpec(**fields, raw=...)`` of
    these re-runs the same estimate)."""
    return {**{field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)
               if field.name != "raw"}, "max_positions": spec.max_positions,
            "tie_word_embeddings": spec.raw.get("tie_word_embeddings")}  # (None: absent)


def _print_report(args: argparse.Namespace, name: str, cfg: Any, gpu: Any,
                  opt: model.PrefillEnergy, ref: Any, comparison: dict[str, Any],
                  split: dict[str, Any] | None) -> None:
    e = cfg.energy
    print(f"{name}: {args.prompt_tokens} prompt tokens x batch {args.batch}, {_hardware(args)}, "
          f"{e.cores} core(s) of {cfg.core.inputs} x {cfg.core.outputs}")
    print("optical prefill")
    print(opt.table())
    t = opt.time
    print(f"  time: mask loads {t['mask_load']:.4g} s + streaming {t['streaming']:.4g} s + "
          f"digital {t['digital']:.4g} s = TTFT {opt.ttft:.4g} s; "
          f"{opt.throughput:.4g} tokens/s")
    resident = "resident" if opt.weights_resident else "reloaded every prefill"
    print(f"  weight tiles: {opt.counts['weight_tiles']} ({resident}); "
          f"{opt.counts['rows_per_weight_load']} rows per weight load")
    if opt.faster_if_reloaded is not None:
        spare = model.spare_cores(opt.cores, opt.counts["weight_tiles"])
        alt = opt.faster_if_reloaded
        print(f"  reloading the weights every prefill would be faster: TTFT {alt['ttft_s']:.4g} s "
              f"for {alt['energy_j']:.4g} J (resident weights leave optical attention's masks "
              f"{spare} core(s))")
    if cfg.outliers.policy != "none":  # which channels bypass depends on the data
        print(f"  outlier channels (outliers.policy = {cfg.outliers.policy!r}) priced as "
              "optical: their digital share is data-dependent (optical validate reports it)")
    print(f"GPU: {gpu.name} x{ref.gpus}, {gpu.compute_utilization:.0%} of peak, "
          f"{'compute' if ref.compute_bound else 'memory'}-bound: {ref.flops:.4g} FLOP, "
          f"{ref.bytes:.4g} B")
    print(f"  energy {ref.energy:.4g} J ({ref.per_token:.4g} J/token, "
          f"{ref.per_mac * 1e12:.4g} pJ per MAC over its {ref.flops / 2:.4g} MACs; optical "
          f"{opt.total / (ref.flops / 2) * 1e12:.4g} pJ over the same), TTFT {ref.time:.4g} s")
    be_p = comparison["break_even_photons_per_mac"]
    be_b = comparison["break_even_batch"]
    be_t, limit = comparison["break_even_tokens"], comparison["break_even_tokens_tried"]
    photons = ("none (the rest of the machine alone costs more)" if be_p is None
               else f"{be_p:.3g}")
    print(f"GPU / optical: energy {_ratio(comparison['energy_ratio_gpu_over_optical'])}x, "
          f"TTFT {_ratio(comparison['ttft_ratio_gpu_over_optical'])}x (> 1: optics wins); "
          f"break-even photons/MAC at this batch: {photons}; break-even batch at these photons: "
          f"{'none' if be_b is None else be_b}; break-even prompt tokens at this batch: "
          f"{f'none up to {limit}' if be_t is None else be_t}")
    if split is None:
        print(f"disaggregated: none ({name} is an encoder: it generates no "
              "tokens to decode)")
        return
    per = split["energy_per_request_j"]
    print(f"disaggregated ({args.output_tokens} output tokens, {args.requests_per_s:g} "
          f"requests/s): J/request all-GPU {per['all_gpu']['total']:.4g}, optical prefill + "
          f"GPU decode {per['disaggregated']['total']:.4g} (all-GPU / this "
          f"{_ratio(split['ratio'])}x); "
          f"GPUs {split['gpus']['all_gpu']} vs {split['gpus']['disaggregated']} + "
          f"{split['optical_machines']} optical machine(s)")
