"""numba's thread pool, set up once for every module with parallel kernels.

- OpenMP workers wait passively. numba's OpenMP workers busy-wait between
  kernels by default, taking the cores from the GEMM that runs between them
  (and from any other process): measured on a loaded 2-core machine, a kernel
  ran 10-20x slower with 2 threads than with 1, and a programmed matmul after
  programming's parallel kernels ran 1.5x slower. Passive waiting costs
  nothing measurable. The setting must be made before numba starts its
  thread pool (the first parallel kernel call), so it lives here rather than
  in one backend. A user's own setting wins.
- :func:`guarded` launches a parallel kernel under a process-wide lock while
  numba's threading layer is "workqueue" (the one layer every install has,
  used when neither OpenMP nor TBB loads): it aborts the whole process when
  two threads launch kernels at once. The omp and tbb layers are thread-safe
  and run unlocked, so concurrent calls from a user's threads or a threaded
  Dask worker give the same bits on every layer.
"""

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

# Lower case: libgomp folds the value by the locale, and in a Turkish one "PASSIVE"
# is no known value (its I folds to a dotless i): the threads then spin.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

_LOCK = threading.Lock()
_LAYER: list[str] = []  # the threading layer, once numba has chosen it


def _serialised() -> bool:
    """Whether parallel launches must take turns: the layer is workqueue, or
    not yet chosen (no parallel kernel has run in this process)."""
    if not _LAYER:
        import numba

        try:
            _LAYER.append(numba.threading_layer())
        except ValueError:  # chosen at the first parallel launch
            return True
    return _LAYER[0] == "workqueue"


def guarded(kernel: Any) -> Callable[..., Any]:
    """``kernel`` (a parallel numba dispatcher, called from Python) launched
    under the process-wide lock while :func:`_serialised`; ``.kernel`` is the
    dispatcher itself."""
    if not hasattr(kernel, "py_func"):  # numba returned the plain function
        raise ImportError(  # (the CLI's one line for an environment that lacks something)
            "NUMBA_DISABLE_JIT is set: optical's kernels need numba's compiler (their bit "
            "casts are llvmlite intrinsics, which run compiled only); unset NUMBA_DISABLE_JIT "
            "to use optical")

    @functools.wraps(kernel.py_func)
    def launch(*args: Any, **kwargs: Any) -> Any:
        if _serialised():
            with _LOCK:
                return kernel(*args, **kwargs)
        return kernel(*args, **kwargs)

    launch.kernel = kernel  # type: ignore[attr-defined]
    return launch
