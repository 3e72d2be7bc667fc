"""Writing a file so that a reader, a kill or a full disk never leaves half of
it: the new content goes to a temporary file beside it, renamed over it at
the end. Used by the sweep store and by every ``--json`` report and figure."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write", "replacing", "replacing_target"]


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write its new content to, which
    replaces ``path`` when the block ends: a reader (or a kill) never sees
    half a file. A failed write (a full disk) leaves ``path`` as it was,
    removes the temporary file and raises an OSError naming ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        # A write names no file, a rename or an open the temporary one: name path.
        if isinstance(err, OSError) and err.filename in (None, str(tmp)):
            raise OSError(err.errno, f"{err.strerror or err} while writing it",
                          str(path)) from err
        raise


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader (or a kill) never sees half a file."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def replacing_target(path: Path) -> Path | None:
    """Where :func:`replacing` should write a user's output ``path``: the file a
    symlink names (the link is kept), or None for a target that must be
    written in place: one that is not a regular file (a FIFO) or a file
    descriptor's name (``/dev/stdout`` redirected to a file: a new file there
    would leave the shell's open one behind)."""
    target = Path(os.path.realpath(path))
    if any(str(p).startswith(("/dev/", "/proc/")) for p in (Path(os.path.abspath(path)), target)):
        return None
    if path.exists() and not path.is_file():  # (follows symlinks)
        return None
    return target
