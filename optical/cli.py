"""The ``optical`` command. Each subcommand lives in ``optical/commands/<name>.py``
and exposes ``register(subparsers)``; add new ones to ``COMMANDS`` below."""

from __future__ import annotations

import argparse
import os
import sys

from optical.commands import config as config_command
from optical.commands import energy as energy_command
from optical.commands import plot as plot_command
from optical.commands import sweep as sweep_command
from optical.commands import validate as validate_command
from optical.commands._common import check_json_path, describe_os_error

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
    for sub in subparsers.choices.values():  # a command's own errors name it
        sub.set_defaults(command_parser=sub)
        sub.allow_abbrev = False  # `sweep --seed 5` must not pass for --seeds 5
    parser.command_names = tuple(subparsers.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names. Exit codes: 0 done; 2 bad input (an
    option, value, path or file), 1 anything else that stopped it (a failed
    run, a missing optional dependency, an operating-system error); each is
    one line ``optical COMMAND: error: ...`` on stderr, never a traceback."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        # optical itself has no options: this one is a command's, given before it
        command = next((a for a in argv if a in parser.command_names), "COMMAND")
        parser.error(f"unrecognized arguments: {argv[0]} (a command's options go after it: "
                     f"optical {command} {argv[0]} ...)")
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit:  # --help (or a usage error) into a pipe whose reader left
        _flush_stdout()
        raise
    if unknown:  # "optical validate: error: ...", with validate's usage
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        check_json_path(args)  # an unwritable --json is refused before any work
        code = int(args.run(args) or 0)
        # A block-buffered pipe whose reader left fails at this flush, not at
        # the interpreter's exit (exit 120 and "Exception ignored" there).
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:  # Ctrl-C; `optical sweep` says more (where to resume)
        print(f"optical {args.command}: interrupted", file=sys.stderr)
        return 130
    except MemoryError as err:  # numpy's says how much it could not allocate
        print(f"optical {args.command}: error: out of memory ({err})", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError, KeyError) as err:
        # Bad input: one clear line, no traceback.
        text = describe_os_error(err) if isinstance(err, FileNotFoundError) and \
            err.strerror else str(err)
        print(f"optical {args.command}: error: {text}", file=sys.stderr)
        return 2
    except ImportError as err:  # an optional dependency: the message names its extra
        print(f"optical {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left (`| head`): no message. Point stdout at devnull so the
        # flush at exit does not fail again (Python's signal docs, "Note on
        # SIGPIPE"), and exit 1 as they do.
        _silence_stdout()
        return 1
    except OSError as err:
        print(f"optical {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
        return 1



def _silence_stdout() -> None:
    """Point stdout at devnull, so no later flush fails."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _flush_stdout() -> None:
    """Flush stdout; a reader gone exits 1 quietly, as in :func:`main`."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        raise SystemExit(1) from None


if __name__ == "__main__":
    sys.exit(main())
