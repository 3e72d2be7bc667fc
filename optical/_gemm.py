"""Matrix products whose rows are bit-reproducible, whatever the chunking or
the number of threads.

An optimised BLAS does not promise that row ``i`` of ``a @ b`` comes out the
same bits for every number of rows in ``a`` or of BLAS threads: OpenBLAS picks
its blocking and its split of work by shape and thread count (measured here:
most row counts and 1 vs 2 threads change the last bits). Downstream of an
ADC a last-bit change can flip a code, so the emulator would depend on how its
caller chunked the tokens.

:func:`rows_matmul` therefore runs every product as independent GEMMs of
exactly ``block`` rows (the last block zero-padded), each on one BLAS thread;
blocks run concurrently on a small thread pool. A row's result then depends
only on its own values, ``b``, ``block`` and its position inside its block,
which callers fix by starting every chunk at a multiple of ``block``. (The
position counts: OpenBLAS's Haswell kernels, as on an AMD EPYC, round a row
by its lane in a 24-row micro-kernel, so a prompt's rows in a batch, or a
prefix's under another block, can differ in the last bit from the prompt
alone.)
``block`` itself depends only on the total number of tokens
(:func:`row_block`).

The digital references need only thread-count independence (they have no
chunking), and keep both cores busy for any number of rows:
:func:`cols_matmul` cuts ``b`` into fixed blocks of :data:`COL_BLOCK`
columns, :func:`stack_matmul` a stack of products into its matrices; each
piece runs on one BLAS thread, concurrently.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["COL_BLOCK", "cols_matmul", "row_block", "rows_matmul", "stack_matmul"]

#: Largest row block: big enough that packing the weight tile is amortised.
ROW_BLOCK_MAX = 256
#: Column block of :func:`cols_matmul`.
COL_BLOCK = 512
_ALIGN = 16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def row_block(tokens: int) -> int:
    """The GEMM row block for a call with ``tokens`` rows in all."""
    return min(ROW_BLOCK_MAX, max(_ALIGN, -(-tokens // _ALIGN) * _ALIGN))


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_workers(), thread_name_prefix="optical-gemm")
        return _pool


class _OneBlasThread:
    """Holds every BLAS library at one thread while any emulator call is inside.

    Reference-counted, so concurrent calls (a Dask worker's threads, say)
    never restore the thread count under one another. threadpoolctl's own
    ``limit`` is not used: for a pthreads OpenBLAS it silently ignores every
    Python thread but the first that set a limit, which let concurrent calls
    run multi-threaded (and change their last bits). With a pthreads BLAS
    (one count per process) BLAS calls made by other code of the process
    meanwhile also run on one thread; an OpenMP BLAS keeps a count per
    thread, which is set on the GEMM pool's threads alone. The libraries are
    listed again when modules were imported since the last list (scipy's
    linear algebra, say, loads its own OpenBLAS after numpy's): one loaded
    later was left at its own count (a test-order audit).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._libs: list = []
        self._listed_at = -1  # len(sys.modules) when _libs was listed
        self._original: list[int | None] = []

    @staticmethod
    def _setter(lib):
        # The OpenBLAS controller's plain setter skips the controlling-thread check.
        return getattr(lib, "_real_set_num_threads", lib.set_num_threads)

    def this_thread(self) -> None:
        """Also limit the calling thread (per-thread OpenMP settings)."""
        for lib in self._libs:
            self._setter(lib)(1)

    @property
    def per_thread(self) -> bool:
        """Whether some BLAS keeps its thread count per thread (OpenMP builds)."""
        return any(getattr(lib, "threading_layer", None) == "openmp" for lib in self._libs)

    @staticmethod
    def _process_wide(lib) -> bool:
        """Whether ``lib``'s thread count is one for the whole process (pthreads
        builds); an OpenMP build keeps one per thread."""
        return getattr(lib, "threading_layer", None) != "openmp"

    def __enter__(self) -> _OneBlasThread:
        with self._lock:
            if self._depth == 0:
                if len(sys.modules) != self._listed_at:  # 0.3-3 ms a listing
                    self._listed_at = len(sys.modules)
                    self._libs = _blas_controllers()
                # Only process-wide counts are limited here (and restored by the last
                # call out). A per-thread count is set on the pool's own threads
                # alone (_concurrently runs every task there): the caller's thread,
                # whose count the last call out could not restore, is left alone.
                self._original = [lib.get_num_threads() if self._process_wide(lib) else None
                                  for lib in self._libs]
                for lib in self._libs:
                    if self._process_wide(lib):
                        self._setter(lib)(1)
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for lib, threads in zip(self._libs, self._original, strict=True):
                    if threads is not None:
                        self._setter(lib)(threads)


def _blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded now."""
    from threadpoolctl import ThreadpoolController

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


_ONE_BLAS_THREAD = _OneBlasThread()


def _after_fork_in_child() -> None:
    # A forked child has none of the parent's pool threads (a call waited on
    # them forever) and may inherit a lock another thread held: fresh ones.
    # A child forked mid-call keeps that call's BLAS limit of one thread.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()
    _ONE_BLAS_THREAD._lock = threading.Lock()
    _ONE_BLAS_THREAD._depth = 0


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def rows_matmul(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` (M, k) and ``b`` (k, n), row-reproducible.

    Rows are cut into blocks of ``block`` rows from the first row of ``a``;
    the caller makes block boundaries fall at fixed global positions.
    """
    m = a.shape[0]
    out = np.empty((m, b.shape[1]), dtype=np.result_type(a, b))

    def rows_from(start: int):
        def run() -> None:
            rows = a[start:start + block]
            if rows.shape[0] < block:
                padded = np.zeros((block, a.shape[1]), dtype=a.dtype)
                padded[:rows.shape[0]] = rows
                rows = padded
            out[start:start + block] = (rows @ b)[:min(block, m - start)]
        return run

    _concurrently([rows_from(start) for start in range(0, m, block)])
    return out


def _concurrently(tasks: list) -> None:
    """Run ``tasks`` (callables) with every BLAS library on one thread, on
    the pool (in the caller's thread when there is one task and BLAS keeps
    no per-thread settings: per-thread settings, of OpenMP builds, are
    changed only on the pool's own threads, never on the caller's)."""
    def one(task) -> None:
        _ONE_BLAS_THREAD.this_thread()
        task()

    with _ONE_BLAS_THREAD:
        if len(tasks) == 1 and not _ONE_BLAS_THREAD.per_thread:
            one(tasks[0])
        else:
            for future in [_get_pool().submit(one, t) for t in tasks]:
                future.result()


def cols_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` (M, k) and ``b`` (k, n), the same bits whatever
    the number of threads: blocks of :data:`COL_BLOCK` columns of ``b``, each
    one GEMM of all M rows on one BLAS thread."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))

    def block(c0: int):
        def run() -> None:
            out[:, c0:c0 + COL_BLOCK] = a @ b[:, c0:c0 + COL_BLOCK]
        return run

    _concurrently([block(c0) for c0 in range(0, b.shape[1], COL_BLOCK)])
    return out


def stack_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for stacks ``a`` (..., M, k) and ``b`` (..., k, n) (leading
    axes broadcast), the same bits whatever the number of threads: each
    matrix of the stack is one product on one BLAS thread."""
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, (*lead, *a.shape[-2:]))
    b = np.broadcast_to(b, (*lead, *b.shape[-2:]))
    out = np.empty((*lead, a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))

    def matrix(index: tuple):
        def run() -> None:
            np.matmul(a[index], b[index], out=out[index])
        return run

    _concurrently([matrix(index) for index in np.ndindex(*lead)])
    return out
