"""Options every command shares: the hardware config and machine-readable output."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from optical import presets
from optical.config import OpticalConfig, parse_value


def add_config_options(parser: argparse.ArgumentParser, *,
                       default_preset: str = "iris-like") -> None:
    """``--preset NAME`` and repeatable ``--set path=value``."""
    parser.add_argument("--preset", default=default_preset,
                        help=f"hardware preset (default {default_preset}; one of "
                             f"{', '.join(presets.names())})")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="override one config field by dotted path, e.g. --set adc.bits=6 "
                             "(repeatable)")


def config_from_args(args: argparse.Namespace) -> OpticalConfig:
    """The preset with every ``--set`` applied; ValueError names a bad path or value."""
    cfg = presets.get(args.preset)
    changes: dict[str, Any] = {}
    for item in args.overrides:
        path, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected PATH=VALUE, e.g. adc.bits=6")
        changes[path.strip()] = parse_value(path.strip(), text)
    return cfg.replace(changes)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", dest="json_path", metavar="PATH", type=Path,
                        help="also write the result as JSON to PATH ('-' for stdout)")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def write_json(path: Path | None, data: Any) -> None:
    """Write ``data`` as standard JSON (non-finite floats as strings)."""
    if path is None:
        return
    text = json.dumps(_jsonable(data), indent=2)
    if str(path) == "-":
        print(text)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
