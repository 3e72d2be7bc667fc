"""The ``optical`` command. Each subcommand lives in ``optical/commands/<name>.py``
and exposes ``register(subparsers)``; add new ones to ``COMMANDS`` below."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from optical._files import cwd_deleted
from optical.commands import config as config_command
from optical.commands import energy as energy_command
from optical.commands import plot as plot_command
from optical.commands import sweep as sweep_command
from optical.commands import validate as validate_command
from optical.commands._common import check_json_path, describe_os_error, die_of, say_stopped

#: Subcommand modules, in the order ``optical --help`` lists them.
COMMANDS = [config_command, validate_command, sweep_command, plot_command, energy_command]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optical",
        description="Emulate free-space optical matrix multipliers and transformer "
                    "prefill on them.",
        epilog="exit status:\n"
               "  0    done\n"
               "  2    bad input (an option, value, path or file)\n"
               "  1    anything else that stopped the command (a failed run, a missing\n"
               "       optional dependency, an operating-system error)\n"
               "  Ctrl-C prints one line, then the process dies of SIGINT; SIGTERM\n"
               "  prints one line and exits 143 (SIGHUP: 129); an error ends\n"
               "  in one line 'optical COMMAND: error: ...' on stderr (after the\n"
               "  command's usage, for a malformed command line; 'optical: error: ...'\n"
               "  where no command is known yet)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version_line(),
                        help="print optical's version, its git commit where it has one, "
                             "and the results version, then exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    for sub in subparsers.choices.values():  # a command's own errors name it
        sub.set_defaults(command_parser=sub)
        sub.allow_abbrev = False  # `sweep --seed 5` must not pass for --seeds 5
    parser.command_names = tuple(subparsers.choices)
    return parser


def _version_line() -> str:
    """``optical 0.1.0 (commit 1a2b3c4d5e6f, results version 5)``: what a
    report of a run records of the code that computed it."""
    from optical._version import RESULTS_VERSION, __version__, source_commit

    commit = source_commit()
    where = f"commit {commit[:12]}" if commit else "no git commit"
    return f"optical {__version__} ({where}, results version {RESULTS_VERSION})"


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names. Exit codes: 0 done; 2 bad input (an
    option, value, path or file), 1 anything else that stopped it (a failed
    run, a missing optional dependency, an operating-system error); each
    ends in one line ``optical COMMAND: error: ...`` on stderr (after the
    usage, for a malformed command line; ``optical: error: ...`` where no
    command is known yet), never a traceback.
    Ctrl-C: one line, then 130, or, run as the program (``argv`` None), the
    process dies of SIGINT as Python would, so a shell loop around it stops.
    SIGTERM, run as the program: one line, then 143, a half-written output
    file's temporary removed (``optical sweep``, from Python too: its own
    line, where to resume); called from Python, its default action. SIGHUP
    (the terminal closed) as SIGTERM, exit 129."""
    parser = build_parser()
    program = argv is None  # the `optical` command itself, not a caller in Python
    argv = sys.argv[1:] if program else list(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        # optical itself has no options but these: this one is a command's, given before it
        command = next((a for a in argv if a in parser.command_names), "COMMAND")
        parser.error(f"unrecognized arguments: {argv[0]} (a command's options go after it: "
                     f"optical {command} {argv[0]} ...)")
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as stop:  # --help (or a usage error) into a pipe whose reader left
        code = stop.code if isinstance(stop.code, int) else 2
        raise SystemExit(_flush_stdout("optical", code)) from None
    if unknown:  # "optical validate: error: ...", with validate's usage
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.program = program
    # A block-buffered pipe whose reader left (or a full disk) fails at this
    # flush, not at the interpreter's exit (exit 120 and "Exception ignored" there).
    with _no_swallowed_interrupt(f"optical {args.command}: interrupted", program), \
            _printable_stdout():
        code = _run(args)
    code = _flush_stdout(f"optical {args.command}", code)
    if program and code == 130:  # Ctrl-C, reported in one line: now die of SIGINT, as
        die_of(signal.SIGINT)    # Python would (a shell sees a process killed by Ctrl-C,
    return code                  # not one that exited 130, and stops its loop too)


@contextlib.contextmanager
def _printable_stdout() -> Iterator[None]:
    """stdout escapes what its encoding cannot show (``\\xe9``), as stderr
    always has: under ``PYTHONIOENCODING=ascii`` (or a console's code page)
    a path with an é made validate fail after its work, its table unprinted,
    and report it as bad input (exit 2). Restored afterwards (``main``
    called from Python leaves the caller's stdout as it found it), except
    where stdout can no longer be flushed (its reader gone, a full disk:
    ``reconfigure`` flushes first, and that failure is already reported)."""
    stream = sys.stdout
    errors = getattr(stream, "errors", None)
    if errors != "strict" or not hasattr(stream, "reconfigure"):
        yield
        return
    try:
        stream.reconfigure(errors="backslashreplace")
    except (OSError, ValueError):  # (a closed or unusual stream: left as it is)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            stream.reconfigure(errors=errors)


@contextlib.contextmanager
def _no_swallowed_interrupt(message: str, program: bool) -> Iterator[None]:
    """Ctrl-C whose KeyboardInterrupt Python ignores, where it is raised
    inside a callback from C (numba's compiler calls back into Python while
    it compiles; JAX's garbage-collection hook): the command would go on for
    a minute, or numba fail later with "no compiled object yet". Run as the
    program, print ``message`` and die of SIGINT there; else as before."""
    hook = sys.unraisablehook

    def stop(unraisable: Any) -> None:
        if program and isinstance(unraisable.exc_value, KeyboardInterrupt):
            die_of(signal.SIGINT, message)
        hook(unraisable)

    sys.unraisablehook = stop
    try:
        yield
    finally:
        sys.unraisablehook = hook


def _run(args: argparse.Namespace) -> int:
    from optical._signals import Terminated, describe, sigterm_as_exit

    def abandon(signum: int) -> None:  # a stop signal Python ignored (numba compiling)
        die_of(signum, f"optical {args.command}: {describe(signum)}")

    try:
        check_json_path(args)  # an unwritable --json is refused before any work
        if getattr(args, "own_signals", False) or not args.program:
            # `optical sweep` says where to resume. Called from Python, SIGTERM
            # keeps its default (or the caller's) action: a handler's exception
            # raised inside a garbage-collection callback (JAX's) is dropped,
            # and the command would run on to a normal return.
            return int(args.run(args) or 0)
        # Run as the program: SIGTERM (SIGHUP) as an exit, so a half-written output's
        # temporary file is removed (it was left beside the output) and the
        # command says so; one Python drops is acted on at once (abandon).
        with sigterm_as_exit(abandon):
            return int(args.run(args) or 0)
    except Terminated as stop:  # (SIGHUP: the terminal may be gone, stderr with it)
        say_stopped(f"optical {args.command}: {describe(stop.signum)}")
        return int(stop.code)
    except KeyboardInterrupt:  # Ctrl-C; `optical sweep` says more (where to resume)
        say_stopped(f"optical {args.command}: interrupted")
        return 130
    except Warning as err:  # turned into an error by -W error (or the caller's filter)
        print(f"optical {args.command}: error: {type(err).__name__}: {err} (a warning, "
              f"raised as an error by the warnings filter{_where_raised(err)})",
              file=sys.stderr)
        return 1
    except MemoryError as err:  # numpy's says how much it could not allocate
        why = f" ({err})" if str(err) else ""
        print(f"optical {args.command}: error: out of memory{why}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError, KeyError) as err:
        # Bad input: one clear line, no traceback.
        text = describe_os_error(err) if isinstance(err, FileNotFoundError) and \
            err.strerror else str(err)
        if isinstance(err, FileNotFoundError) and err.filename is None and cwd_deleted():
            text += " (the current directory was deleted: cd to a directory that exists)"
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


def _where_raised(err: BaseException) -> str:
    """``, at FILE:LINE``: the innermost Python frame the warning was raised
    from (a traceback said where; the one line should too)."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    return f", at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _silence_stdout() -> None:
    """Point stdout at devnull, so no later flush fails."""
    try:
        target = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):  # (no descriptor; stdout None: `>&-`)
        return
    if null == target:  # the descriptor was closed under sys.stdout: it is devnull now
        return
    try:
        os.dup2(null, target)
    except OSError:
        pass
    finally:
        os.close(null)  # (dup2 made its own; one descriptor per broken pipe leaked)


def _flush_stdout(prog: str, code: int) -> int:
    """Flush stdout, then the exit code: ``code``, or 1 where the flush
    failed (a reader gone: quietly, as in :func:`main`; another error, a full
    disk, one line unless the command already failed). stdout then points at
    devnull, so the interpreter's own flush at exit does not fail again. A
    stdout closed when Python started (``>&-``, ``sys.stdout`` None) is left alone."""
    if sys.stdout is None:
        return code
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return code or 1
    except OSError as err:
        if not code:
            print(f"{prog}: error: {describe_os_error(err)}", file=sys.stderr)
        _silence_stdout()
        return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
