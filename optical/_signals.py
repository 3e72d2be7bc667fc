"""Stop signals during a sweep: SIGTERM (and SIGHUP, a closed terminal) as a
:class:`Terminated` exit and Ctrl-C as KeyboardInterrupt, each also
recorded, so a sweep stops after its next result even where Python swallowed
the exception (a garbage-collection callback), and its finished runs stay on
disk."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Terminated", "sigterm_as_exit"]

#: The signals :func:`sigterm_as_exit` turns into :class:`Terminated`: SIGTERM
#: (``kill``, a batch scheduler) and, where the platform has it, SIGHUP (the
#: terminal or ssh session closed), whose default action also skipped the
#: cleanup of a half-written output.
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                    if hasattr(signal, name))


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP) under :func:`sigterm_as_exit`: a SystemExit with
    code 128 + the signal's number (143, 129), so the sweep stops its
    workers and keeps its finished runs, and the CLI can say how to resume."""

    @property
    def signum(self) -> int:
        """The signal that stopped the command (SIGTERM for a bare code)."""
        code = self.code if isinstance(self.code, int) else 0
        return code - 128 if code - 128 in TERMINATING else int(signal.SIGTERM)


def describe(signum: int) -> str:
    """How a stop signal is named in the CLI's one line: "interrupted" for
    Ctrl-C, "terminated (SIGTERM)", "terminated (SIGHUP)"."""
    if signum == signal.SIGINT:
        return "interrupted"
    return f"terminated ({signal.Signals(signum).name})"


#: Signals received under :func:`sigterm_as_exit` (the CLI) or
#: :func:`_ctrl_c_recorded` (a sweep called from Python). Their handlers raise
#: at once, but Python ignores an exception raised inside a
#: garbage-collection callback (JAX registers one), so :func:`execute` also
#: stops on this record after each result, in the main thread.
_RECEIVED: list[int] = []
#: How many :func:`_recording` blocks are open (main thread): the record is
#: cleared when the outermost opens and closes, so a nested one (a sweep
#: under the CLI's handling, a caller's own) keeps what the outer received.
_DEPTH = 0


def _stop(signum: int) -> None:
    """The exception of a stop signal: KeyboardInterrupt for SIGINT, else
    :class:`Terminated`."""
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(128 + signum)


def _raise_received() -> None:
    """Raise again for a signal whose exception was swallowed: in the main
    thread, whose sweep recorded it (one in another thread, which Python
    never signals, runs on)."""
    if _RECEIVED and threading.current_thread() is threading.main_thread():
        _stop(_RECEIVED[0])


@contextlib.contextmanager
def sigterm_as_exit(abandon: Callable[[int], None] | None = None) -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (a SystemExit, code 143; SIGHUP,
    129) in the main thread, so a terminated sweep stops its workers and
    keeps its finished runs (used by the CLI); these and SIGINT (Ctrl-C) are also
    recorded, so that a sweep stops after its next result even if the
    exception was swallowed where it was raised. ``abandon(signum)``, if
    given, is called where it is swallowed instead (numba's compiler calls
    back into Python while it compiles, for a minute or more; a batch
    scheduler's grace period is often 30 s): the CLI ends the process there,
    the finished runs being on disk already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _recording((*TERMINATING, signal.SIGINT), abandon):
        yield


@contextlib.contextmanager
def _ctrl_c_recorded() -> Iterator[None]:
    """Record Ctrl-C (SIGINT) during a sweep called from Python, as
    :func:`sigterm_as_exit` does for the CLI, so one swallowed by a
    garbage-collection callback (JAX's, imported by the numba backend for
    its GEMMs: 1 to 3 of 20 interrupts in a notebook) still stops the sweep
    after its next result. Only in the main thread where SIGINT has Python's
    own handler: a caller's handler, or the CLI's, is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    with _recording((signal.SIGINT,)):
        yield


@contextlib.contextmanager
def _recording(signals: tuple[int, ...],
               abandon: Callable[[int], None] | None = None) -> Iterator[None]:
    """Handlers of ``signals`` that record the signal and raise its stop
    exception, and an unraisable hook that drops that exception's traceback
    where Python ignores it (calling ``abandon``); main thread only."""

    def handler(signum: int, frame: Any) -> None:
        _RECEIVED.append(signum)
        _stop(signum)

    hook = sys.unraisablehook

    def quiet(unraisable: Any) -> None:
        # Where Python ignores the handler's exception (a garbage-collection
        # callback), it prints a traceback; the signal is recorded and acted
        # on after the next result, so that traceback is noise.
        if not (_RECEIVED and isinstance(unraisable.exc_value, KeyboardInterrupt | Terminated)):
            hook(unraisable)
        elif abandon is not None:
            abandon(_RECEIVED[0])

    global _DEPTH
    if _DEPTH == 0:
        _RECEIVED.clear()
    # A signal the caller ignores (SIGINT in a background job of a shell
    # script) stays ignored, as Python leaves it.
    previous = {s: signal.signal(s, handler) for s in signals
                if signal.getsignal(s) != signal.SIG_IGN}
    sys.unraisablehook = quiet
    _DEPTH += 1
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
        sys.unraisablehook = hook
        _DEPTH -= 1
        if _DEPTH == 0:
            _RECEIVED.clear()
