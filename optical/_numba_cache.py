"""Whether numba can keep its compiled kernels on disk (``cache=True``).

numba caches a kernel next to its source (``__pycache__``) or, where that
directory cannot be written, in the user's cache directory
(``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba``), or in ``NUMBA_CACHE_DIR``.
With none writable -- a read-only install in a container started with
``--read-only``, a service user without a home -- numba refuses
``cache=True`` when the kernel is defined, which would make importing the
kernels, and so every matmul (``backend="numpy"`` included: programming
uses them), fail. The kernels then compile in memory at each start, with
one warning per kernel module (in each process) that says how to keep them.
"""

import functools
import warnings

import numba


@functools.cache
def can_cache(source: str) -> bool:
    """Whether numba can cache kernels defined in the file ``source`` (a
    module's ``__file__``); warns once per file when it cannot."""
    namespace: dict = {}
    exec(compile("def _probe():\n    return 0\n", source, "exec"), namespace)
    try:
        numba.njit(cache=True)(namespace["_probe"])  # numba looks for a cache directory here
    except RuntimeError as err:
        if "cannot cache" not in str(err):
            raise
        warnings.warn(f"numba finds no writable directory to cache the kernels of {source} "
                      "in; they compile at each start instead (seconds). Set "
                      "NUMBA_CACHE_DIR to a writable directory to keep them.",
                      RuntimeWarning, stacklevel=2)
        return False
    return True
