"""What the example scripts share on the command line: count and seed types
for argparse, and running ``main`` so that bad input ends in one line naming the
script (as the ``optical`` commands do), not a traceback.

The scripts import it from their own directory (``python examples/NAME.py``
puts ``examples/`` first on ``sys.path``); to copy one script out, copy this
file beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path


def positive(text: str) -> int:
    """argparse type of a count: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def seed_type(text: str) -> int:
    """argparse type of a seed: an integer in [0, 2**64), as numpy's
    generators and the ``optical`` commands take."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{value} is out of range; valid: integer in "
                                         "[0, 2**64)")
    return value


def run(main: Callable[[], None], script: str, *, resumable: bool = False) -> None:
    """``main()``; a ValueError, OSError, ImportError or failed sweep run as
    ``SCRIPT: error: ...`` (exit 1), a reader of stdout gone (``| head``)
    quietly (exit 1). With ``resumable`` (a sweep), Ctrl-C says that the
    same command resumes it (exit 130)."""
    from optical import SweepError

    name = Path(script).name
    try:
        main()
    except BrokenPipeError:  # `| head`: the reader left; quietly, as the optical commands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no flush error)
        sys.exit(1)
    except (ValueError, OSError, ImportError, SweepError) as err:  # bad input, a failed run
        sys.exit(f"{name}: error: {err}")
    except KeyboardInterrupt:
        if not resumable:
            raise
        print(f"{name}: interrupted; run the same command again to resume the sweep",
              file=sys.stderr)
        sys.exit(130)
