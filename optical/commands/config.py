"""``optical config``: show a preset with overrides, as a table or JSON."""

from __future__ import annotations

import argparse

from optical.commands._common import (
    add_config_options,
    add_json_option,
    config_from_args,
    description,
    json_to_stdout,
    write_json,
)

EXAMPLES = """examples:
  optical config --preset iris-like
  optical config --preset iris-like --set adc.bits=6 --json cfg.json
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "config", help="show a hardware configuration",
        description=description(__doc__),
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(parser)
    add_json_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    write_json(args.json_path, cfg.to_dict())  # first: a reader gone (`| head`) loses no report
    if not json_to_stdout(args):  # '-': stdout is the JSON
        print(cfg._table())
    return 0
