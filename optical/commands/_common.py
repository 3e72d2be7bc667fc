"""Options every command shares: the hardware config and machine-readable output."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from optical import presets
from optical._files import (
    absolute,
    linked_to,
    own_descriptor,
    replacing_target,
    writable_descriptor,
    write_output,
)
from optical._sweep_store import encode
from optical._validation import missing_or_broken
from optical.config import OpticalConfig, parse_value


def description(doc: str | None) -> str | None:
    """A command's help description: its module docstring's first paragraph
    after the command's name; None where ``python -OO`` stripped it."""
    if not doc:
        return None
    return doc.split("\n\n")[0].replace("\n", " ").split(": ", 1)[-1]


def add_config_options(parser: argparse.ArgumentParser, *,
                       default_preset: str = "iris-like", preset_note: str = "") -> None:
    """``--preset NAME`` or ``--config FILE``, and repeatable ``--set path=value``."""
    parser.add_argument("--preset", default=None,
                        help=f"hardware preset (default {default_preset}; one of "
                             f"{', '.join(presets.names())}{preset_note})")
    parser.add_argument("--config", dest="config_file", type=path_argument, metavar="FILE",
                        help="the hardware config from a JSON file instead of a preset: what "
                             "'optical config --json' writes, or a JSON that 'optical "
                             "validate' or 'optical energy' wrote (its config); fields the "
                             "file leaves out take OpticalConfig()'s values (noise-free like "
                             "the ideal preset, but split-encoded inputs), not a preset's")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="override one config field by dotted path, e.g. --set adc.bits=6 "
                             "(repeatable)")
    parser.set_defaults(default_preset=default_preset)


def read_config_file(path: Path) -> OpticalConfig:
    """The config in the JSON file ``path`` (:meth:`OpticalConfig.to_json`'s
    sections, or a command's JSON holding them under ``"config"``);
    ValueError names ``--config``, the file and what is wrong with it
    (:meth:`OpticalConfig.from_file`)."""
    try:
        return OpticalConfig.from_file(path)
    except ValueError as err:
        raise ValueError(f"--config {err}") from None


def config_from_args(args: argparse.Namespace) -> OpticalConfig:
    """The preset (``--preset``, else the command's default) or the
    ``--config`` file, with every ``--set`` applied; ValueError names a bad
    option, path or value. Sets ``args.preset`` to the preset used (None
    with ``--config``)."""
    config_file = getattr(args, "config_file", None)
    if config_file is not None:
        if args.preset is not None:
            raise ValueError(f"--config {config_file} and --preset {args.preset}: give one "
                             "(to start a file from a preset: optical config --preset NAME "
                             "--json FILE)")
        cfg = read_config_file(config_file)
    else:
        if args.preset is None:
            args.preset = args.default_preset
        cfg = presets.get(args.preset)
    changes: dict[str, Any] = {}
    for item in args.overrides:
        path, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected PATH=VALUE, e.g. adc.bits=6")
        if path.strip() in changes:
            raise ValueError(f"--set {path.strip()}: given twice; set each path once")
        changes[path.strip()] = parse_value(path.strip(), text)
    return cfg.replace(changes)


def config_label(args: argparse.Namespace) -> str:
    """What ``config_from_args`` started from, for a report's heading: the
    preset's name or the ``--config`` file, and the ``--set`` overrides."""
    base = args.preset if args.preset is not None else str(args.config_file)
    return base + (" + " + ", ".join(args.overrides) if args.overrides else "")


def config_source(args: argparse.Namespace) -> dict[str, Any]:
    """What a command's JSON report records of where its config came from:
    ``preset`` (None with ``--config``), ``config_file`` (resolved, as the
    reports' ``model_dir`` is: a relative path names nothing once the report
    is read from elsewhere) and ``overrides``."""
    return {"preset": args.preset,
            "config_file": None if args.config_file is None
            else str(Path(args.config_file).resolve()),
            "overrides": list(args.overrides)}


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", dest="json_path", metavar="PATH", type=path_argument,
                        help="also write the result as JSON to PATH ('-' for stdout)")


def json_to_stdout(args: argparse.Namespace) -> bool:
    """Whether ``--json -`` was given: stdout then holds the JSON alone, so the
    command prints no table or summary."""
    return str(getattr(args, "json_path", None)) == "-"


def path_argument(text: str) -> Path:
    """argparse ``type`` of a path option: an empty one is refused (``Path("")``
    is ".", which the option's error would name instead); a leading ``~`` is
    the home directory, as a shell would expand it (which it does not in
    ``--model=~/x``), kept as it is where there is none to expand to."""
    return Path(path_text(text))


def path_text(text: str) -> str:
    """:func:`path_argument` of an option kept as text (a model directory,
    which a sweep resolves and stores)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is an empty path")
    return os.path.expanduser(text)


def check_output_path(path: Path | None, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written:
    ValueError naming ``option`` if ``path`` is a directory, lies under a
    regular file, or is in a directory this process may not write to, names
    a descriptor not open for writing (``/dev/stdin``), or is relative to a
    working directory that was deleted."""
    if path is None or str(path) == "-":
        return
    path = Path(path)
    try:
        absolute(path, option)
    except FileNotFoundError as err:
        raise ValueError(f"{option} {path}: {err.strerror}") from None
    number = own_descriptor(path)  # /dev/stdout, /dev/fd/N: written through that descriptor
    if number is not None:
        if not writable_descriptor(number):
            raise ValueError(f"{option} {path}: descriptor {number} is not open for writing")
        return
    # What gets written: a symlink's target (a dangling one's too), as write_output does.
    path = replacing_target(path) or path
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a directory, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option} {path}: not writable ({_not_writable_why(path)})")
        return
    parent = path.parent
    while not parent.exists():  # the nearest existing ancestor: mkdir starts there
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot create it in {parent} "
                         f"({_not_writable_why(parent)})")
    try:  # os.access says yes to root, where a file system (sysfs, NFS) may still refuse
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".optical-probe-")
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot create it in {parent} "
                         f"({err.strerror or err})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as err:  # an append-only directory (chattr +a) takes files, keeps them
        raise ValueError(f"{option} {path}: {parent} lets files be created but not replaced "
                         f"or removed ({err.strerror or err}; {probe} is left there)") from None


def _not_writable_why(path: Path) -> str:
    """Why ``os.access`` said no: a file system mounted read-only (where
    "permission denied" sent the user to the file's mode), else permission."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except (OSError, AttributeError):  # (no statvfs on Windows)
        pass
    return "permission denied"


# The files of a model directory that optical.transformer.load reads (or, for
# PyTorch pickles, finds and names).
MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
               "*.bin", "*.pt")


def check_json_model(path: Path | None, model: str | Path | None, option: str = "--model") -> None:
    """Refuse a ``--json`` ``path`` that is, or would become, one of the
    :data:`MODEL_FILES` of the model directory ``model``: the report would
    replace the config or the weights."""
    if path is None or str(path) == "-" or model is None:
        return
    target, directory = Path(path).resolve(), Path(model).resolve()
    named = target.parent == directory and any(
        fnmatch.fnmatch(target.name, pattern) for pattern in MODEL_FILES)
    files = [f for pattern in MODEL_FILES for f in directory.glob(pattern)]
    if named or target in {f.resolve() for f in files} \
            or linked_to(Path(path), files):  # through a symlink or a hard link too
        raise ValueError(f"--json {path}: a file of the model in {model} ({option}), which "
                         "it would overwrite; write the JSON elsewhere")


def check_json_path(args: argparse.Namespace) -> None:
    """:func:`check_output_path` of ``--json``: ``optical.cli.main`` calls it
    before it runs any command. Also refused: one of the files of the sweep
    the command runs or reads (``--out`` / ``DIR``), or of the ``--model``
    directory (:data:`MODEL_FILES`), which it would overwrite."""
    path = getattr(args, "json_path", None)
    check_output_path(path, "--json")
    if path is None or str(path) == "-":
        return
    check_json_model(path, getattr(args, "model", None))
    sweep = getattr(args, "out", None) or getattr(args, "sweep_dir", None)
    if sweep is None:
        return
    from optical._sweep_store import writes

    if writes(sweep, path):
        raise ValueError(f"--json {path}: a file of the sweep in {sweep}, which it would "
                         "overwrite; write the JSON elsewhere")


def describe_os_error(err: OSError) -> str:
    """An OS error as one line: ``path: reason`` where it names a file."""
    if err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror}"
    return str(err) or type(err).__name__


def check_not_json(args: argparse.Namespace, paths: Sequence[Path], option: str) -> None:
    """Refuse figure ``paths`` (of ``option``) of which ``--json`` is one:
    the JSON would silently replace the figure."""
    json_path = getattr(args, "json_path", None)
    if json_path is None or str(json_path) == "-":
        return
    target = Path(json_path).resolve()
    for path in paths:
        if Path(path).resolve() == target or linked_to(Path(json_path), [Path(path)]):
            raise ValueError(f"--json {json_path}: is also the figure {path} of {option}, "
                             "which the JSON would replace; write them to two files")


def require(module: str, extra: str, purpose: str) -> Any:
    """Import ``module``, or ImportError with the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(missing_or_broken(module, err, f"{purpose} needs {module}",
                                            extra)) from err


def write_json_and_show(args: argparse.Namespace, data: Any, show: Callable[[], None]) -> None:
    """``--json``'s file first (a reader gone, ``| head``, loses no report),
    then ``show()`` the report unless stdout holds the JSON; a file that
    cannot be written (a full disk) still shows the report before its error,
    so minutes of work are not lost with it."""
    try:
        write_json(args.json_path, data)
    except (OSError, UnicodeError):  # (a name the file system's encoding lacks)
        if not json_to_stdout(args):
            show()
        raise
    if not json_to_stdout(args):  # '-': stdout is the JSON
        show()


def write_json(path: Path | None, data: Any) -> None:
    """Write ``data`` as standard JSON (non-finite floats as strings), whole or
    not at all: a kill or a full disk keeps the previous file (an OSError
    names ``path``); except where the file is written in place (a FIFO,
    ``/dev/stdout``, a file with other hard links, whose links a new file
    would break), where a full disk leaves it partly written."""
    if path is None:
        return
    text = json.dumps(encode(data), indent=2)
    if str(path) == "-":
        print(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    text += "\n"  # (ASCII: json.dumps escapes the rest; a descriptor is given bytes)
    write_output(path, lambda p: p.write(text.encode()) if hasattr(p, "write")
                 else p.write_text(text))


def say_stopped(message: str) -> None:
    """Print a stop signal's one line to stderr, if it can still be written:
    after SIGHUP the terminal is gone (EIO), and the exit status must not
    be lost to that."""
    stream = sys.stderr  # None where the process started with it closed (2>&-)
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        print(message, file=stream)
        stream.flush()


def die_of(signum: int, message: str | None = None) -> None:
    """End this process by the default action of signal ``signum`` (a shell
    sees a process killed by it), ``message`` printed to stderr first."""
    if not hasattr(os, "kill"):  # pragma: no cover
        return
    if message is not None:
        say_stopped(message)  # (a stderr that is gone, or closed from the start)
    elif sys.stderr is not None:  # what was printed before goes out before the death
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
