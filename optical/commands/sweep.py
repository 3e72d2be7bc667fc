"""``optical sweep``: run a parameter sweep (resumable), locally or on Dask."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from optical.commands._common import (
    add_config_options,
    add_json_option,
    check_json_model,
    describe_os_error,
    description,
    die_of,
    json_to_stdout,
    path_argument,
    path_text,
    require,
    say_stopped,
    write_json,
)

EXAMPLES = """examples:
  # ADC bits x photons per MAC on a synthetic 512x4096x4096 matmul, 3 seeds, all cores
  optical sweep --matmul 512x4096x4096 --param adc.bits=4,6,8 \\
      --param source.photons_per_mac=1e3,1e4,1e5 --seeds 3 --out runs/adc

  # the same sweep on a Dask cluster
  optical sweep --matmul 512x4096x4096 --param adc.bits=4,6,8 \\
      --param source.photons_per_mac=1e3,1e4,1e5 --seeds 3 --out runs/adc \\
      --scheduler tcp://10.0.0.5:8786

  # one layer of a model, precision of the converters
  optical sweep --model models/llama-3.1-8b --layer 0 --tokens 512 \\
      --param adc.bits=4,6,8 --param dac.bits=4,6,8 --seeds 2 --out runs/llama

  # SQNR against depth: every 4th layer of a model, noise-only error bars
  optical sweep --model models/llama-3.2-1b --tokens 64 --param workload.layer=0,4,8,12,15 \\
      --seeds 3 --data-seed 0 --out runs/depth

  # 50 random points, photons per MAC log-uniform in [1e3, 1e6]
  optical sweep --matmul 64x1024x1024 --param source.photons_per_mac=1e3:1e6:log \\
      --param adc.bits=4,6,8 --samples 50 --out runs/random

  # photons per MAC x seeds in one process, vmapped on the JAX backend (GPU if present)
  optical sweep --matmul 512x4096x4096 --backend jax --vmap \\
      --param source.photons_per_mac=1e3,1e4,1e5 --set adc.full_scale=rms \\
      --seeds 8 --out runs/vmap

  # resume an interrupted (or finish a finished) sweep from its manifest
  optical sweep --out runs/adc

  # resume a layer sweep copied to a machine where its model is elsewhere
  optical sweep --out runs/llama --moved-model /data/models/llama-3.1-8b

Re-running a sweep skips the runs already in --out; a different sweep in the same
--out is refused, and so are options of the sweep's definition given with --out
alone (they would be ignored). Results: DIR/results.parquet, one row per point
and seed.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="sweep config parameters x seeds (resumable; local cores or Dask)",
        description=description(__doc__), epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_argument_group(
        "workload (omit it, and every option of this group and the next, to resume the "
        "sweep in --out as its manifest defines it)")
    which = what.add_mutually_exclusive_group()
    which.add_argument("--matmul", metavar="TxKxN",
                       help="a synthetic (T, K) @ (K, N) matmul, e.g. 512x4096x4096; a "
                       "calibrated preset calibrates on the inputs it scores (an optimistic "
                       "oracle)")
    which.add_argument("--model", metavar="DIR", type=path_text,
                       help="a model directory (config.json): one layer's validate, "
                       "calibrated on a held-out input; sweep its layers, prompt lengths, "
                       "reference dtype or batch with --param workload.layer=0,4,8, "
                       "workload.tokens=64,512, workload.dtype=float16,bfloat16, "
                       "workload.batch=1,4")
    # Defaults are None so that an option given is known: it is refused where it
    # would be ignored (a resume from --out alone, the other workload's option).
    what.add_argument("--layer", type=int, help="layer of --model (default 0)")
    what.add_argument("--tokens", type=int,
                      help="prompt tokens of --model's prefill (default 512; validate's "
                           "default is 256)")
    what.add_argument("--weights-seed", type=int,
                      help="seed of --model's synthetic weights (default 0; refused "
                           "beside a checkpoint)")
    what.add_argument("--local", action="store_const", const=True,
                      help="also record each optical product of --model against the exact "
                           "product of its own inputs (local_sqnr_db.<product>: the "
                           "hardware's own error, without what came from upstream)")
    what.add_argument("--inputs", choices=("gaussian", "uniform", "laplace"),
                      help="input distribution of --matmul (default gaussian)")
    what.add_argument("--outlier-channels", type=int, metavar="N",
                      help="input channels of --matmul scaled by --outlier-scale (default 0)")
    what.add_argument("--outlier-scale", type=float, metavar="X",
                      help="factor of --matmul's outlier channels (default 20)")
    what.add_argument("--dtype", choices=("float32", "float64"),
                      help="dtype of --matmul (default float32)")
    what.add_argument("--data-seed", type=int,
                      help="seed of the data, apart from the noise seeds: --matmul's matrices "
                           "(default 0); --model's layer input and held-out calibration input "
                           "(default: each run's seed), so that seeds differ in noise alone")
    what.add_argument("--backend", choices=("auto", "numpy", "numba", "jax"),
                      help="engine of --matmul (default auto: numba); jax runs can be "
                           "batched with --vmap")

    grid = parser.add_argument_group("parameters")
    grid.add_argument("--param", action="append", default=[], metavar="PATH=VALUES",
                      help="a dotted config path and its values, e.g. adc.bits=4,6,8 "
                           "(repeatable; the grid is their product); LO:HI or LO:HI:log "
                           "draws from a range with --samples; workload.FIELD sweeps a "
                           "field of the workload: workload.layer=0,1,2 (--model), "
                           "workload.tokens=16,64 (both)")
    grid.add_argument("--seeds", type=int, metavar="N",
                      help="seeds 0..N-1 at every point (default 1): the noise, and for "
                           "--model also the layer input and held-out calibration input "
                           "unless --data-seed (--matmul's data: --data-seed)")
    grid.add_argument("--samples", type=int, metavar="N",
                      help="N random points instead of the grid (identical draws "
                           "count as one point)")
    grid.add_argument("--sample-seed", type=int, metavar="S",
                      help="seed of the random points of --samples (default 0)")
    add_config_options(parser)  # --preset None: not given (resume), iris-like when starting

    run = parser.add_argument_group("execution")
    run.add_argument("--out", type=path_argument, required=True, metavar="DIR",
                     help="directory of the sweep (created; resumed if it holds this sweep)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=int, metavar="N",
                       help="most local worker processes, one per run left (default: every "
                            "core; 1: this process)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on the Dask cluster at ADDRESS (e.g. tcp://host:8786)")
    where.add_argument("--vmap", action="store_true",
                       help="run in this process, vmapping the runs of a --backend jax "
                            "--matmul that differ only in seed and numeric noise fields")
    run.add_argument("--moved-model", metavar="DIR", type=path_text,
                     help="resume the layer sweep in --out with its model now in DIR (it "
                          "moved since the sweep began: the same config.json and weights, "
                          "checked)")
    run.add_argument("--format", choices=("parquet", "csv"), default=None,
                     help="format of DIR/results.* (default: that of the results file "
                          "already in DIR, else parquet)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    add_json_option(parser)
    parser.set_defaults(run=run_command, own_signals=True)  # says where to resume


def parse_param(item: str) -> tuple[str, Any]:
    """``"adc.bits=4,6,8"`` -> ``("adc.bits", [4, 6, 8])``; ``"p=10:1e5:log"`` ->
    a Range. ValueError names the option, the path and the bad value."""
    from optical.sweep import Range, parse_swept_value

    path, sep, text = item.partition("=")
    path = path.strip()
    if not sep or not path or not text.strip():
        raise ValueError(f"--param {item!r}: expected PATH=VALUES, e.g. adc.bits=4,6,8")
    try:
        if ":" in text:
            parts = [p.strip() for p in text.split(":")]
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "log"):
                raise ValueError(f"{path}: range {text!r} must be LO:HI or LO:HI:log")
            lo, hi = parse_swept_value(path, parts[0]), parse_swept_value(path, parts[1])
            return path, Range(lo, hi, log=len(parts) == 3)
        return path, [parse_swept_value(path, v) for v in text.split(",")]
    except ValueError as err:
        raise ValueError(f"--param {item!r}: {err}") from None


#: Options of each workload: attribute, option, default.
MATMUL_OPTIONS = (("inputs", "--inputs", "gaussian"), ("outlier_channels", "--outlier-channels", 0),
                  ("outlier_scale", "--outlier-scale", 20.0), ("dtype", "--dtype", "float32"),
                  ("backend", "--backend", "auto"))
MODEL_OPTIONS = (("layer", "--layer", 0), ("tokens", "--tokens", 512),
                 ("weights_seed", "--weights-seed", 0), ("local", "--local", False))
#: Options of both workloads; their defaults are each workload's own (data_seed:
#: --matmul 0, --model None, the runs' seeds).
WORKLOAD_OPTIONS = (("data_seed", "--data-seed", None),)
#: Options of the sweep's definition besides its workload.
GRID_OPTIONS = (("param", "--param", []), ("overrides", "--set", []),
                ("preset", "--preset", None), ("config_file", "--config", None),
                ("seeds", "--seeds", 1),
                ("samples", "--samples", None), ("sample_seed", "--sample-seed", 0))
#: Integer options and their least valid value (--layer: the workload's check,
#: which names the model's layers, as validate's does).
MINIMUM = {"tokens": 1, "weights_seed": 0, "outlier_channels": 0, "data_seed": 0,
           "seeds": 1, "samples": 1, "sample_seed": 0}
#: How long to wait for a --scheduler to answer.
SCHEDULER_TIMEOUT_S = 20


def _given(args: argparse.Namespace, options: tuple[tuple[str, str, Any], ...]) -> list[str]:
    return [option for attr, option, _ in options if getattr(args, attr) not in (None, [])]


def _fill_defaults(args: argparse.Namespace) -> None:
    for attr, option, default in (*MATMUL_OPTIONS, *MODEL_OPTIONS, *WORKLOAD_OPTIONS,
                                  *GRID_OPTIONS):
        if getattr(args, attr) is None:
            setattr(args, attr, default)
        value = getattr(args, attr)
        if attr in MINIMUM and value is not None:
            if value < MINIMUM[attr]:
                kind = "positive" if MINIMUM[attr] else "non-negative"
                raise ValueError(f"{option}: {value} must be a {kind} integer")
            if attr.endswith("seed") and value >= 2**64:
                raise ValueError(f"{option}: {value} is out of range; valid: [0, 2**64)")
    if not (0 < args.outlier_scale < float("inf")):
        raise ValueError(f"--outlier-scale: {args.outlier_scale} must be a positive finite "
                         "number")


def _definition(args: argparse.Namespace) -> Any:
    """The sweep definition the options give, or None when only --out is given
    (resume). Options that would be ignored are refused, by name."""
    from optical.commands._common import config_from_args
    from optical.sweep import SweepDefinition
    from optical.workloads import LayerWorkload, MatmulWorkload

    if args.matmul is None and args.model is None:
        given = _given(args, (*GRID_OPTIONS, *MATMUL_OPTIONS, *MODEL_OPTIONS,
                              *WORKLOAD_OPTIONS))
        if given:
            raise ValueError(
                f"{', '.join(given)} given without a workload: give a workload (--matmul "
                "TxKxN or --model DIR) with the sweep's options, or only --out DIR (with "
                "--jobs, --scheduler, --vmap, --moved-model, --format, --quiet, --json) to "
                "resume the sweep there as its manifest defines it")
        return None
    if args.moved_model is not None:
        raise ValueError("--moved-model resumes the sweep in --out from its manifest; with a "
                         "workload given, give the model's directory now as --model")
    other = MODEL_OPTIONS if args.matmul is not None else MATMUL_OPTIONS
    if misplaced := _given(args, other):
        own, alien = ("--matmul", "--model") if args.matmul is not None else ("--model",
                                                                             "--matmul")
        raise ValueError(f"{', '.join(misplaced)} appl{'ies' if len(misplaced) == 1 else 'y'} "
                         f"to {alien}, not to {own}")
    if args.sample_seed is not None and args.samples is None:
        raise ValueError("--sample-seed applies only with --samples (random points)")
    # A workload option given beside --param workload.<its field> would be ignored.
    given = {attr: option for attr, option, _ in (*MATMUL_OPTIONS, *MODEL_OPTIONS,
                                                  *WORKLOAD_OPTIONS)
             if getattr(args, attr) is not None}
    _fill_defaults(args)
    params: dict[str, Any] = {}
    for item in args.param:
        path, values = parse_param(item)
        if path in params:
            raise ValueError(f"--param {item!r}: {path} is given twice")
        field = path.removeprefix("workload.")
        if path.startswith("workload.") and field in given:
            raise ValueError(f"--param {item!r}: {given[field]} sets the {field} this "
                             f"parameter sweeps; drop {given[field]}")
        params[path] = values
    base = config_from_args(args)
    _check_set_unswept(args, params)
    if args.matmul is not None:
        workload: Any = MatmulWorkload.from_shape(
            args.matmul, inputs=args.inputs, outlier_channels=args.outlier_channels,
            outlier_scale=args.outlier_scale, dtype=args.dtype,
            data_seed=0 if args.data_seed is None else args.data_seed, backend=args.backend)
    else:
        try:
            workload = LayerWorkload(args.model, layer=args.layer, tokens=args.tokens,
                                     weights_seed=args.weights_seed, local=args.local,
                                     data_seed=args.data_seed)
        except ValueError as err:  # "layer: 99 is out of range": named as the option
            field, colon, rest = str(err).partition(":")
            if colon and field in ("layer", "tokens", "weights_seed", "data_seed"):
                raise ValueError(f"--{field.replace('_', '-')}:{rest}") from None
            raise
    return SweepDefinition.build(workload, params, seeds=args.seeds, base=base,
                                 samples=args.samples, sample_seed=args.sample_seed)


def _check_set_unswept(args: argparse.Namespace, params: dict[str, Any]) -> None:
    """Refuse a ``--set`` of a path ``--param`` sweeps: no point takes its
    value, yet the manifest's base config would record it (and a later run
    with another value would be refused as a different sweep). Kept where
    the base config is invalid without it (a rule ``outliers.policy``
    "static" needs, say, swept and set at once)."""
    from optical.commands._common import config_from_args

    swept = [item for item in args.overrides if item.partition("=")[0].strip() in params]
    if not swept:
        return
    rest = argparse.Namespace(**{**vars(args), "overrides": [item for item in args.overrides
                                                             if item not in swept]})
    try:
        config_from_args(rest)
    except ValueError:  # the base needs it; each point still takes its own value
        return
    path = swept[0].partition("=")[0].strip()
    raise ValueError(f"--set {swept[0]!r}: --param sweeps {path}, so no point takes this value "
                     "(each takes its own); drop the --set")


def _vmappable(definition: Any) -> bool:
    """Whether the vmap executor would batch any run of ``definition``: as
    it does, asking each point's own workload (``--param workload.backend``
    makes some points' JAX ones)."""
    points = definition.points()
    for workload, config in zip(definition.workloads(points), definition.configs(points),
                                strict=True):
        key_of = getattr(workload, "batch_key", None)
        if key_of is not None and key_of(config) is not None:
            return True
    return False


def _connect(address: str) -> Any:
    """A Dask client of the scheduler at ``address``; errors name the address."""
    client_class = require("distributed", "sweep", "--scheduler").Client
    result: list[Any] = []

    def connect() -> None:
        try:
            result.append(client_class(address, timeout=f"{SCHEDULER_TIMEOUT_S}s"))
        except Exception as err:
            result.append(err)

    # Client's timeout bounds the TCP connect, not Dask's handshake: a port that
    # accepts and never answers (a dashboard's, say) would hang here for good.
    thread = threading.Thread(target=connect, daemon=True, name="optical-dask-connect")
    thread.start()
    thread.join(SCHEDULER_TIMEOUT_S + 5)
    if not result:
        raise ConnectionError(f"--scheduler {address}: no Dask scheduler answered within "
                              f"{SCHEDULER_TIMEOUT_S} s (something accepted the connection "
                              "but did not speak Dask)")
    outcome = result[0]
    if isinstance(outcome, OSError):  # TimeoutError included
        raise ConnectionError(f"--scheduler {address}: no Dask scheduler answered within "
                              f"{SCHEDULER_TIMEOUT_S} s ({outcome})") from None
    if isinstance(outcome, ValueError | TypeError):  # a bad address; TLS without its settings
        raise ValueError(f"--scheduler {address}: {outcome}") from None
    if isinstance(outcome, Exception):
        # Something that speaks first and not Dask (an HTTP or SSH port): Dask
        # read its bytes as a frame's length and failed allocating 3 EiB,
        # which the CLI printed as "out of memory".
        text = str(outcome)
        text = text if len(text) <= 120 else text[:117] + "..."
        raise ConnectionError(f"--scheduler {address}: what answered is not a Dask scheduler "
                              f"({type(outcome).__name__}: {text})") from None
    return outcome


def run_command(args: argparse.Namespace) -> int:
    from optical._signals import describe, sigterm_as_exit
    from optical.sweep import SweepError, Terminated, execute

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: {args.jobs} must be a positive integer")
    model_dir: str | None = None
    began = False  # whether execute was called: before, nothing in --out is touched

    def stopped(signum: int) -> str:
        if not began:
            return f"optical sweep: {describe(signum)}"
        return (f"optical sweep: {describe(signum)}; finished runs are kept in {args.out}; run "
                f"{_resume_command(args.out, model_dir)} to resume")

    def abandon(signum: int) -> None:  # a stop signal Python ignored (numba compiling)
        die_of(signum, stopped(signum))

    client = None
    try:
        # From the definition on (a million random points, a model's digest or a
        # scheduler's answer can take a while) to the end: a Ctrl-C while the
        # table prints is one too.
        with sigterm_as_exit(abandon if getattr(args, "program", False) else None):
            definition = _definition_or_stored(args)
            if args.vmap and not _vmappable(definition):
                raise ValueError("--vmap: none of this sweep's runs can be vmapped (only a "
                                 "--matmul sweep's runs on the JAX backend, --backend jax or "
                                 "--param workload.backend=...,jax, batch); drop --vmap")
            if args.scheduler is not None:
                client = _connect(args.scheduler)
                executor: Any = client
            elif args.vmap:
                executor = "vmap"
            else:
                executor = args.jobs
            model_dir = getattr(definition.workload, "model_dir", None)
            began = True
            try:
                summary = execute(definition, args.out, executor=executor,
                                  progress=not args.quiet, results_format=args.format)
            except OSError as err:
                if isinstance(err, FileNotFoundError | PermissionError | BrokenPipeError):
                    raise  # a path to mend or a reader gone: the CLI's own handling
                # A full disk, say: what finished is on disk; the sweep goes on from there.
                print(f"optical sweep: error: {describe_os_error(err)}; finished runs are kept "
                      f"in {args.out}; "
                      f"run {_resume_command(args.out, model_dir)} to resume once that is "
                      "mended",
                      file=sys.stderr)
                return 1
            write_json(args.json_path, summary.to_dict())  # first: a reader gone loses none
            if not args.quiet and not json_to_stdout(args):  # '-': stdout is the JSON
                if summary.ran:
                    print(f"{args.out}: {summary.runs} runs ({summary.already_done} already "
                          f"done, {summary.ran} run now on {summary.executor})")
                else:
                    print(f"{args.out}: {summary.runs} runs, all done already (nothing run "
                          "now)")
                _print_table(summary.results_path, definition.paths)
                print(f"results: {summary.results_path}")
    except (KeyboardInterrupt, Terminated) as stop:
        say_stopped(stopped(stop.signum if isinstance(stop, Terminated) else signal.SIGINT))
        if isinstance(stop, Terminated) and began and args.vmap \
                and getattr(args, "program", False):
            # XLA may still be compiling the batch in its own threads, and an
            # interpreter exit under it crashed (a segfault in 11 of 20 tries):
            # die of the signal instead (no worker processes to see off).
            die_of(stop.signum)
        return int(stop.code) if isinstance(stop, Terminated) else 130
    except SweepError as err:  # a failed run; what finished is kept
        text = str(err)
        if "running the sweep again" not in text:
            text = (f"{text.removesuffix('.')}; run {_resume_command(args.out, model_dir)} to "
                    "run the rest once that is mended")
        print(f"optical sweep: error: {text}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    return 0


def _definition_or_stored(args: argparse.Namespace) -> Any:
    """The sweep the options define, or, given only --out, the one stored there."""
    from optical.sweep import stored_definition

    definition = _definition(args)
    if definition is not None:
        return definition
    try:  # resumed: its model is the stored workload's
        definition = stored_definition(args.out, model_dir=args.moved_model)
    except (ValueError, TypeError) as err:  # named as the option given
        text = str(err)
        if args.moved_model is None or not text.startswith("model_dir: "):
            raise
        raise type(err)("--moved-model: " + text.removeprefix("model_dir: ")) from None
    check_json_model(args.json_path, getattr(definition.workload, "model_dir", None),
                     f"the model of the sweep in {args.out}")
    return definition


def _shown(value: Any) -> str:
    """A swept value in the summary table: ``None``, ``6``, ``1000.0001``, ``offset``."""
    return f"{value:.12g}" if isinstance(value, float) else str(value)


def _resume_command(out: str, model_dir: str | None = None) -> str:
    """The command that resumes the sweep in ``out``, in backquotes and quoted
    for a POSIX shell: ``optical sweep --out DIR`` once the manifest is
    written (with ``--moved-model`` where ``model_dir``, the sweep's model
    now, is not the directory its manifest names); before it (a full disk or
    a kill as it was written) only the whole command can, as ``--out`` alone
    finds no sweep to rebuild."""
    from optical._sweep_store import MANIFEST, read_manifest

    if not (Path(out) / MANIFEST).is_file():
        return "the same `optical sweep` command (workload, --param, ... and --out) again"
    moved = ""
    if model_dir is not None:
        try:
            stored = read_manifest(out)["definition"]["workload"].get("model_dir")
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            stored = model_dir  # unreadable now: the plain command names what is wrong
        if stored != model_dir:
            moved = f" --moved-model {shlex.quote(_not_an_option(model_dir))}"
    return f"`optical sweep --out {shlex.quote(_not_an_option(str(out)))}{moved}`"


def _not_an_option(text: str) -> str:
    """A path as a command line takes it: a directory named "~" (given as
    ./~/...) is not the home, "-s" not an option."""
    return f".{os.sep}{text}" if text.startswith(("~", "-")) else text


def _print_table(results: Path, paths: list[str], metric: str = "sqnr_db") -> None:
    """Mean, sample standard deviation (blank for one seed, "-" where it is
    undefined: an infinite mean) and count of ``metric`` over seeds at each
    point."""
    from optical.sweep import load

    frame = load(results.parent)
    if metric not in frame.columns or frame.empty:
        return
    keys = paths or ["point"]
    # Grouped by point, each shown by its values as the sweep gave them
    # (grouping on a column of None and ints would show nan and 6.0).
    stats = frame.groupby("point", sort=False)[metric].agg(["mean", "std", "count"])
    shown = frame.drop_duplicates("point").set_index("point")[paths]
    header = " ".join(f"{k:>24s}" for k in keys) + f" {metric + ' mean':>14s} {'std':>8s} {'n':>3s}"
    print(header)
    for point, (mean, std, count) in zip(stats.index, stats.itertuples(index=False),
                                         strict=True):
        std_text = f"{std:8.3f}" if math.isfinite(std) else "" if count <= 1 else "-"
        values = shown.loc[point] if paths else [point]
        print(" ".join(f"{_shown(v):>24s}" for v in values) +
              f" {mean:14.3f} {std_text:>8s} {count:3d}")
