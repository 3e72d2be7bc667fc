"""Whether numba can keep its compiled kernels on disk (``cache=True``).

numba caches a kernel next to its source (``__pycache__``) or, where that
directory cannot be written, in the user's cache directory
(``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba``), or in ``NUMBA_CACHE_DIR``.
With none writable -- a read-only install in a container started with
``--read-only``, a service user without a home -- numba refuses
``cache=True`` when the kernel is defined, which would make importing the
kernels, and so every matmul (``backend="numpy"`` included: programming
uses them), fail. The kernels then compile in memory at each start, with
one warning (in each process) that says how to keep them.

Two processes filling one cache at once (a ``--jobs 2`` sweep of float32 and
float64 workloads, a job array sharing ``NUMBA_CACHE_DIR``) could break it
for good: numba rewrites a kernel's index (signature -> data file) without a
lock, so interleaved writes can leave the float64 entry naming the float32
code, and every later process then fails with "can't unbox array" (numba
issues #4807, #10128). :func:`serialise` puts each kernel's cache reads and
writes under an ``flock`` of a file in its cache directory, and turns an
OSError of theirs (a full disk, an exceeded quota: numba lets it through,
failing the call whose kernel had just compiled) into a warning.
"""

import contextlib
import functools
import hashlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numba


def warn_outside(message: str) -> None:
    """A RuntimeWarning attributed to the first frame outside optical, numba
    and the import machinery: the user's line that imported or ran the
    kernels (a fixed ``stacklevel`` pointed into numba's dispatcher or at
    the kernel module's import), so that filters by module see it there."""
    inside = tuple(os.path.dirname(m.__file__) + os.sep for m in (sys.modules["optical"], numba))
    frame = sys._getframe(1)
    while frame.f_back is not None and (
            frame.f_code.co_filename.startswith(inside)
            or ("importlib" in frame.f_code.co_filename
                and "_bootstrap" in frame.f_code.co_filename)):
        frame = frame.f_back
    warnings.warn_explicit(message, RuntimeWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__", "<string>"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


#: The kernel source whose cache was refused first: the warning is given once
#: per process (every kernel module of an install shares the cause).
_no_cache: list[str] = []


@functools.cache
def can_cache(source: str) -> bool:
    """Whether numba can cache kernels defined in the file ``source`` (a
    module's ``__file__``); warns, once per process, when it cannot."""
    namespace: dict = {}
    exec(compile("def _probe():\n    return 0\n", source, "exec"), namespace)
    try:
        numba.njit(cache=True)(namespace["_probe"])  # numba looks for a cache directory here
    except RuntimeError as err:
        if "cannot cache" not in str(err):
            raise
        if not _no_cache:
            _no_cache.append(source)
            warn_outside(f"numba finds no writable directory to cache the kernels of {source} "
                         "(or of optical's other kernel modules) in; they compile at each "
                         "start instead (about a minute for a matmul's kernels). Set "
                         "NUMBA_CACHE_DIR to a writable directory to keep them.")
        return False
    return True


def source_digest(data: bytes) -> str:
    """The first 16 hex digits of the SHA-256 of a module's source, its line
    endings as LF (a Windows checkout's CRLF is the same source)."""
    return hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest()[:16]


def dependencies_current(source: str, recorded: Mapping[str, str], loader: Any = None) -> bool:
    """Whether each module beside ``source`` named in ``recorded`` (file name
    -> :func:`source_digest`: a kernel module's ``DEPENDENCY_SHA256``) still
    has that digest, read through ``loader`` (the kernel module's
    ``__loader__``: a zip import has no files to open). numba checks a
    cached kernel against its own file only, so after an edit of a module
    whose numba functions it compiles in (``_rng_numba.py``), the cache would
    run the old code: where a digest differs, this warns and returns False,
    and the caller compiles without the disk cache. A source that cannot be
    read is not checked (nothing there can have been edited in place).
    ~50 us per import."""
    directory = os.path.dirname(source)
    changed = {}
    for name, digest in recorded.items():
        path = os.path.join(directory, name)
        try:
            if hasattr(loader, "get_data"):
                data = loader.get_data(path)
            else:
                with open(path, "rb") as handle:
                    data = handle.read()
        except OSError:
            continue
        now = source_digest(data)
        if now != digest:
            changed[name] = now
    if changed:
        warn_outside(f"{', '.join(changed)} changed since {os.path.basename(source)} recorded "
                     "its digest (DEPENDENCY_SHA256): its kernels compile without the disk "
                     "cache, whose copies would run the old code (numba checks a kernel's own "
                     f"file only). Record the new digests ({changed}) to cache them again.")
    return not changed


_LOCK_NAME = ".optical-numba.lock"
_held = threading.local()  # this thread's depth of cache locks (re-entrant)


@contextlib.contextmanager
def _cache_lock(directory: str) -> Iterator[None]:
    """An exclusive ``flock`` of ``directory``'s lock file while the block
    runs; nothing where there is no flock (Windows, a file system without
    it) or the directory cannot be written (numba then writes nothing)."""
    if getattr(_held, "depth", 0):
        yield
        return
    try:
        import fcntl

        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):  # no flock here: as numba alone
            fcntl.flock(fd, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
    finally:
        os.close(fd)  # releases the lock


def _locked(method: Callable[..., Any], directory: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _cache_lock(directory):
            return method(*args, **kwargs)
    return call


def _tolerant(method: Callable[..., Any], directory: str, doing: str) -> Callable[..., Any]:
    """``method`` (a cache's load or save), with an OSError -- a full disk,
    an exceeded quota, an I/O error -- turned into one warning per cache
    directory: the kernel is compiled in memory by then (a failed load is a
    cache miss), so it runs; only the copy on disk is missed."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError as err:
            _warn_cache_failed(directory, doing, err.strerror or str(err))
            return None
    return call


@functools.cache
def _warn_cache_failed(directory: str, doing: str, why: str) -> None:
    warn_outside(f"numba could not {doing} its kernel cache in {directory} ({why}); the "
                 "kernels run from memory and compile again in each new process "
                 "(about a minute for a matmul's kernels). Free the disk, or set "
                 "NUMBA_CACHE_DIR to a writable directory with space.")


def serialise(namespace: dict[str, Any]) -> None:
    """Put the on-disk cache reads and writes of every cached numba kernel in
    ``namespace`` (a module's globals; a parallel kernel behind
    ``_numba_threads.guarded`` by its ``.kernel``) under a lock of its cache
    directory, so that processes compiling the same kernels at once keep a
    consistent cache."""
    for value in list(namespace.values()):
        value = getattr(value, "kernel", value)  # a guarded parallel kernel's dispatcher
        cache = getattr(value, "_cache", None)
        directory = getattr(cache, "cache_path", None)
        if not isinstance(directory, str) or getattr(cache, "_optical_locked", False):
            continue  # not a cached kernel (numba's NullCache), or done already
        cache.load_overload = _tolerant(_locked(cache.load_overload, directory), directory,
                                        "read")
        cache.save_overload = _tolerant(_locked(cache.save_overload, directory), directory,
                                        "write")
        cache._optical_locked = True
