"""The ``optical`` command. Each subcommand lives in ``optical/commands/<name>.py``
and exposes ``register(subparsers)``; add new ones to ``COMMANDS`` below."""

from __future__ import annotations

import argparse
import sys

from optical.commands import config as config_command
from optical.commands import energy as energy_command
from optical.commands import plot as plot_command
from optical.commands import sweep as sweep_command
from optical.commands import validate as validate_command

#: Subcommand modules, in the order ``optical --help`` lists them.
COMMANDS = [config_command, validate_command, sweep_command, plot_command, energy_command]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optical",
        description="Emulate free-space optical matrix multipliers and transformer "
                    "prefill on them.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, KeyError) as err:
        # Bad input: one clear line, no traceback.
        print(f"optical {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
