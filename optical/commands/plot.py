"""``optical plot``: plot a sweep's results as PNG and SVG."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from optical._version import __version__
from optical.commands._common import (
    add_json_option,
    check_not_json,
    check_output_path,
    description,
    json_to_stdout,
    path_argument,
    require,
    write_json,
)

EXAMPLES = """examples:
  # SQNR against ADC bits, one line per photons-per-MAC value (mean +- std over seeds)
  optical plot runs/adc --x adc.bits --y sqnr_db --hue source.photons_per_mac

  # a heatmap of SQNR over two parameters
  optical plot runs/adc --kind heatmap --x adc.bits --y source.photons_per_mac --z sqnr_db

  # per-matmul SQNR of a layer sweep, at one point
  optical plot runs/llama --kind bars --y sqnr_db --hue adc.bits --where dac.bits=8

Other swept parameters must be held fixed with --where PATH=VALUE (or be the --hue).
Writes DIR/plots/<name>.png and .svg unless --output STEM is given; --output
fig.png (a format's suffix) writes that file alone unless --formats says more.
--json PATH also writes the numbers drawn ("data": each point's mean, sample
std and seeds), the table behind the figure, with the sweep directory and
the figures' paths (absolute), the sweep's results version and definition
hash, the swept parameters on --x and --hue, and the plotting optical's
version.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help="plot a sweep (PNG and SVG)",
        description=description(__doc__), epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=path_argument, metavar="DIR",
                        help="a sweep's --out directory")
    parser.add_argument("--kind", choices=("line", "heatmap", "bars"), default="line",
                        help="line (default): --y against --x; heatmap: --z over --x and "
                             "--y; bars: per-matmul --y of a layer sweep")
    parser.add_argument("--x", metavar="PATH", help="swept parameter on the x axis")
    parser.add_argument("--y", metavar="NAME",
                        help="metric (line, bars) or second parameter (heatmap)")
    parser.add_argument("--z", metavar="METRIC", help="metric of a heatmap")
    parser.add_argument("--hue", metavar="PATH", help="swept parameter drawn as separate "
                        "lines or bar groups")
    parser.add_argument("--where", action="append", default=[], metavar="PATH=VALUE",
                        help="hold a swept parameter at one value (repeatable)")
    parser.add_argument("--output", type=path_argument, metavar="STEM",
                        help="write STEM.png, STEM.svg (default DIR/plots/<name>); "
                             "STEM.png alone if STEM ends in .png (or .svg, .pdf)")
    parser.add_argument("--formats", metavar="LIST",
                        help="comma-separated file formats: png, svg, pdf (default png,svg; "
                             "or the suffix of --output)")
    add_json_option(parser)
    parser.set_defaults(run=run)


def _where(items: list[str]) -> dict[str, Any]:
    from optical.sweep import parse_swept_value

    where: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--where {item!r}: expected PATH=VALUE, e.g. adc.bits=8")
        path = path.strip()
        if path in where:  # as --set: one value per path, not the last one silently
            raise ValueError(f"--where {path}: given twice; hold each parameter at one value")
        try:
            where[path] = parse_swept_value(path, text)
        except ValueError as err:
            raise ValueError(f"--where {item!r}: {err}") from None
        if path.removeprefix("workload.") in _path_fields() \
                and not isinstance(where[path], str) \
                and os.path.isdir(os.path.expanduser(text.strip())):
            where[path] = text.strip()  # a directory named "8" or "none": its text
    return where


def _path_fields() -> set[str]:
    """The layer workload's fields that hold a path (``model_dir``)."""
    import dataclasses

    from optical.workloads import LayerWorkload

    return {f.name for f in dataclasses.fields(LayerWorkload) if f.metadata.get("path")}


#: The options each --kind reads; any other plot option given is refused.
USES = {"line": ("x", "y", "hue"), "heatmap": ("x", "y", "z"), "bars": ("y", "hue")}


def _need(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) is None:
            raise ValueError(f"--kind {args.kind} needs --{name}")


def _check_unused(args: argparse.Namespace) -> None:
    """Refuse an option the kind of plot would ignore (e.g. --z of a line)."""
    for name in ("x", "y", "z", "hue"):
        if getattr(args, name) is not None and name not in USES[args.kind]:
            uses = ", ".join(f"--{n}" for n in USES[args.kind])
            raise ValueError(f"--{name}: --kind {args.kind} does not use it (it uses {uses} "
                             "and --where); drop it or choose another --kind")


def make_figure(frame: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The figure the options ask for, and a file name for it."""
    from optical import plots

    where = _where(args.where)
    if args.kind == "line":
        _need(args, "x", "y")
        fig = plots.line(frame, args.x, args.y, hue=args.hue, where=where)
        name = f"{args.y}-vs-{args.x}" + (f"-by-{args.hue}" if args.hue else "")
    elif args.kind == "heatmap":
        _need(args, "x", "y", "z")
        fig = plots.heatmap(frame, args.x, args.y, args.z, where=where)
        name = f"{args.z}-over-{args.x}-{args.y}"
    else:
        metric = args.y or "sqnr_db"
        fig = plots.matmul_bars(frame, metric, hue=args.hue, where=where)
        name = f"{metric}-per-matmul" + (f"-by-{args.hue}" if args.hue else "")
    for path, value in where.items():
        name += f"-{path}={value}"
    return fig, re.sub(r"[^A-Za-z0-9_.=+-]", "_", name)


def run(args: argparse.Namespace) -> int:
    from optical import plots
    from optical.sweep import load

    _check_unused(args)
    formats = None
    if args.formats is not None:
        formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
        for fmt in formats:
            if fmt not in plots.FORMATS:
                raise ValueError(f"--formats: {fmt!r} is not valid; valid: "
                                 f"{', '.join(plots.FORMATS)}")
        if not formats:
            raise ValueError(f"--formats: {args.formats!r} names no format; valid: "
                             f"{', '.join(plots.FORMATS)}")
    if args.output is not None:
        suffix = args.output.suffix.lower().lstrip(".")
        if suffix in plots.FORMATS and formats is not None and suffix not in formats:
            raise ValueError(f"--output {args.output}: names the format {suffix}, but "
                             f"--formats is {','.join(formats)}; drop the suffix or add "
                             "the format")
        if reason := plots.unwritten_suffix(args.output):  # .jpg: named as the option
            raise ValueError(f"--output {args.output}: {reason}")
        planned_paths = plots.output_paths(args.output, formats)
        for path in planned_paths:  # writable, before the work
            check_output_path(path, "--output")
        check_not_json(args, planned_paths, "--output")
    elif (args.sweep_dir / "plots").is_symlink():  # a sweep from someone else: it may name any
        raise ValueError(f"{args.sweep_dir / 'plots'}: a symlink; the default figures go only "
                         "into a plots/ directory of the sweep's own (or give --output)")
    for module in ("pandas", "matplotlib"):  # optical[sweep] has both: one round, not two
        require(module, "sweep", "optical plot")
    frame = load(args.sweep_dir)
    planned = frame.attrs["sweep"]["runs"]
    if len(frame) < planned:  # an interrupted sweep: say what the figure lacks
        from optical.commands.sweep import _resume_command  # quoted for the shell

        print(f"optical plot: note: {len(frame)} of the sweep's {planned} runs are finished; "
              f"the figure shows those ({_resume_command(args.sweep_dir)} finishes "
              "the rest)", file=sys.stderr)
    fig, name = make_figure(frame, args)
    if args.output is None:
        stem, formats = args.sweep_dir / "plots" / name, formats or ["png", "svg"]
        check_not_json(args, plots.output_paths(stem, formats), "the default --output")
        # Links to the figures inside it are replaced, not written through.
        try:
            paths = plots.save(fig, stem, formats, follow_links=False)
        except OSError as err:  # a sweep read where it cannot be written (a read-only
            if err.errno is None or not err.strerror:  # mount, another user's)
                raise
            raise type(err)(err.errno, f"{err.strerror}; give --output STEM to write the "
                            "figure elsewhere", err.filename) from None
    else:
        paths = plots.save(fig, args.output, formats)
    metric = args.z if args.kind == "heatmap" else (args.y or "sqnr_db")
    write_json(args.json_path, {"sweep": os.path.abspath(args.sweep_dir),
                                "results_version": frame.attrs["sweep"]["results_version"],
                                "optical_version": __version__,
                                # what computed the runs (the plotting optical is above)
                                "run_commits": sorted({c for c in frame["optical_commit"]
                                                       if isinstance(c, str)}),
                                "files": [os.path.abspath(p) for p in paths],
                                "definition_hash": frame.attrs["sweep"]["definition_hash"],
                                "kind": args.kind, "x": args.x, "hue": args.hue,
                                "metric": metric, "where": _where(args.where),
                                "runs": len(frame), "planned_runs": planned,
                                "data": plotted_data(frame, args)})  # first: a reader gone
    if not json_to_stdout(args):  # '-': stdout is the JSON
        for path in paths:
            print(path)
    return 0


def plotted_data(frame: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The figure's numbers (:func:`optical.plots.summary`), one record per
    point, line or bar: a line's ``--hue``, ``--x`` and the mean, std and
    seeds of ``--y``; a heatmap's ``--y``, ``--x`` and ``--z``'s; the bars'
    ``matmul`` ("layer output" for the metric itself) and ``--hue``."""
    from optical import plots

    where = _where(args.where)
    if args.kind == "line":
        by = [args.hue, args.x] if args.hue else [args.x]
        table = plots.summary(frame, args.y, by, where=where)
    elif args.kind == "heatmap":
        table = plots.summary(frame, args.z, [args.y, args.x], where=where)
    else:
        metric = args.y or "sqnr_db"
        prefix = metric + "."
        by = [args.hue] if args.hue else []
        parts = []
        for column in [c for c in frame.columns if str(c).startswith(prefix)] + \
                ([metric] if metric in frame.columns else []):
            part = plots.summary(frame, column, by, where=where)
            part.insert(0, "matmul", column[len(prefix):] if column != metric else
                        "layer output")
            parts.append(part)
        table = require("pandas", "sweep", "plots").concat(parts, ignore_index=True)
    return table.to_dict("records")
