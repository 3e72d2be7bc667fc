"""The large arrays of a layer's products, recycled instead of mapped afresh.

Why: glibc maps every allocation above its mmap threshold (32 MiB at most)
afresh and unmaps it on free, and the kernel zeroes each fresh page when it is
first touched. On a virtual machine that reports free memory back to its host
(virtio-balloon free page reporting, as on this project's 2-core machines),
memory freed for more than about 2 s costs far more to touch again: measured
0.85-1.7 s per GiB, against 0.05 s for memory freed a moment ago. A layer on
the optical core allocates and frees the same few large arrays for every
weight matrix (normalised weights, mask transmissions, the balanced rails'
differences; the fp16 reference its rounded weights), 784 MB at once for a
Llama-3.1-8B layer's gate_proj, and every validation paid for them afresh:
with ``perf``, zeroing pages took 17 % of a validation's CPU time.

:func:`empty` is ``numpy.empty``, except inside ``with recycling():`` for
arrays of :data:`MIN_BYTES` or more: those are views of buffers kept in one
process-wide pool. A buffer is handed out again once nothing refers to it any
more (no array, view or other object holds it: its reference count is back to
the pool's own), so an array is never shared. Values never depend on the pool:
the arrays are uninitialised either way, and every caller writes them in full.
Only the engines of :mod:`optical.transformer` open the scope, around each of
their products, so nothing handed to a user is ever pooled.

Memory held: what the arrays alive need, plus free buffers. A request that no
free buffer fits first drops the free buffers (back to the system), then maps
a new one, so the peak stays that of the largest product. Free buffers are let
go :data:`HOLD_SECONDS` after the last scope closes (a timer thread), or at
once with :func:`release`: back-to-back validations and sweeps reuse warm
memory, and an idle process gives it back.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from collections.abc import Iterator

import numpy as np

__all__ = ["HOLD_SECONDS", "MIN_BYTES", "empty", "empty_like", "held_bytes", "recycling",
           "release"]

#: Arrays below this size come from numpy as usual (glibc's heap recycles them).
MIN_BYTES = 16 << 20

#: Free buffers are released this long after the last scope closes.
HOLD_SECONDS = 20.0

_lock = threading.RLock()
_buffers: list[np.ndarray] = []
_state = threading.local()  # .depth: open scopes of this thread
_open = 0  # open scopes, all threads
_timer: threading.Timer | None = None


def _after_fork_in_child() -> None:
    # A fork taken while another thread held the lock or ran the timer must
    # not leave the child with a held lock or a timer it does not have.
    global _lock, _timer
    _lock = threading.RLock()
    _timer = None


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _refs(buffers: list[np.ndarray], i: int) -> int:
    # One call shape for the baseline below and every check, so the
    # references the interpreter itself counts cancel out.
    return sys.getrefcount(buffers[i])


#: A pooled buffer's reference count when only the pool's list holds it.
_IDLE = _refs([np.empty(0)], 0)


def _free(i: int) -> bool:
    return _refs(_buffers, i) == _IDLE


@contextlib.contextmanager
def recycling() -> Iterator[None]:
    """A scope in which :func:`empty` draws large arrays from the pool."""
    global _open, _timer
    with _lock:
        _open += 1
        if _timer is not None:
            _timer.cancel()
            _timer = None
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
        with _lock:
            _open -= 1
            if _open == 0 and _buffers:
                _timer = threading.Timer(HOLD_SECONDS, release)
                _timer.daemon = True
                _timer.start()


def release() -> int:
    """Let go of every free buffer now; return how many bytes were freed
    (buffers still in use stay with their arrays)."""
    freed = 0
    with _lock:
        for i in reversed(range(len(_buffers))):
            if _free(i):
                freed += _buffers[i].nbytes
                del _buffers[i]
    return freed


def held_bytes() -> int:
    """Bytes held by the pool, in use or free."""
    with _lock:
        return sum(b.nbytes for b in _buffers)


def _pooled(nbytes: int) -> np.ndarray:
    """A free pooled buffer of at least ``nbytes`` (the smallest), else a new one."""
    with _lock:
        free = [i for i in range(len(_buffers)) if _free(i)]
        fits = [i for i in free if _buffers[i].nbytes >= nbytes]
        if fits:
            return _buffers[min(fits, key=lambda i: _buffers[i].nbytes)]
        for i in reversed(free):  # too small: back to the system before mapping more
            del _buffers[i]
        _buffers.append(np.empty(nbytes, dtype=np.uint8))
        return _buffers[-1]


def empty(shape: int | tuple[int, ...], dtype: object = np.float64) -> np.ndarray:
    """``numpy.empty(shape, dtype)``; inside :func:`recycling`, from the pool
    when it takes :data:`MIN_BYTES` or more."""
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(map(int, shape))
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if not getattr(_state, "depth", 0) or nbytes < MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    with _lock:  # the view exists before another thread can see the buffer free
        return _pooled(nbytes)[:nbytes].view(dtype).reshape(shape)


def empty_like(a: np.ndarray) -> np.ndarray:
    """:func:`empty` of ``a``'s shape and dtype, in its memory order (C or Fortran)."""
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        return empty(a.shape[::-1], a.dtype).T
    return empty(a.shape, a.dtype)
