"""Progress bars (tqdm) that can be switched off, for sweeps and long validations."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


class _Stderr:
    """stderr for a bar: a write that fails (stderr closed, a reader gone, a
    full disk) turns the bar off rather than stopping the work it reports.
    Not equal to sys.stderr: tqdm would then flush sys.stderr itself, outside
    this guard (so tqdm.write does not clear and redraw the bar: a log line
    may follow the bar's text)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # (ValueError: a closed file)
                self._broken = True
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._broken = True

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: tqdm asks
        return getattr(self._stream, name)


class _Silent:
    """Stands in for a tqdm bar when progress is off."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(total: int, *, desc: str, enabled: bool = True, initial: int = 0,
                 unit: str = "run") -> Any:
    """A tqdm bar on stderr, or a silent stand-in when ``enabled`` is False
    (``--quiet``) or tqdm is not installed."""
    if not enabled or sys.stderr is None:  # (None: started with stderr closed)
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships in the sweep and models extras
        return _Silent()
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                smoothing=0.1, file=_Stderr(sys.stderr))
