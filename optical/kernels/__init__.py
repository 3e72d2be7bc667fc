"""The hot path of :func:`optical.matmul`: backends chosen by argument or array type.

- ``"numpy"``: the readable reference, ``optical.core``.
- ``"numba"``: the CPU fast path (:mod:`optical.kernels.numba_backend`); its
  GEMMs run in JAX's XLA when JAX is installed (float32), else in BLAS.
- ``"jax"``: the same physics under ``jax.jit`` (:mod:`optical.kernels.jax_backend`):
  CPU or GPU, ``vmap`` over seeds and noise parameters, straight-through gradients.
- ``"auto"``: ``"jax"`` for JAX arrays, else ``"numba"`` (``"numpy"`` for
  cores smaller than :data:`MIN_FAST_TILE` weights, where the fast path's
  per-tile overhead outweighs its speed).

Importing this package imports neither numba nor JAX.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import sys
from typing import TYPE_CHECKING

from optical._version import source_commit

if TYPE_CHECKING:
    from optical.config import OpticalConfig

__all__ = ["BACKENDS", "MIN_FAST_TILE", "available", "environment", "is_jax_array", "resolve"]

BACKENDS = ("auto", "numpy", "numba", "jax")

#: Smallest core (inputs x outputs) for which "auto" takes the numba backend.
MIN_FAST_TILE = 32 * 32


def is_jax_array(x: object) -> bool:
    """True for a JAX array or tracer (without importing JAX). While another
    thread imports JAX, ``sys.modules`` holds the module without its ``Array``
    yet (and no JAX array can exist)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, getattr(jax, "Array", ()))


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str | None], ...]:
    from importlib import metadata

    found = []
    for name in ("numpy", "numba", "jax", "jaxlib"):
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, None))
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _hardware() -> tuple[tuple[str, str | None], ...]:
    """The CPU's model name (None where the system does not say) and numpy's
    BLAS: its library, version and the kernel it picked for this CPU
    (OpenBLAS's core type, which ``OPENBLAS_CORETYPE`` overrides)."""
    cpu = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name")), None)
    except OSError:  # not Linux
        pass
    cpu = cpu or platform.processor() or None
    blas = None
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - a base dependency
        pass
    else:
        found = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        ours = [i for i in found if "numpy" in str(i.get("filepath", ""))] or found
        if ours:
            parts = (ours[0].get(k) for k in ("internal_api", "version", "architecture"))
            blas = " ".join(str(part) for part in parts if part) or None
    return (("cpu", cpu), ("blas", blas))


def environment() -> dict[str, str | bool | None]:
    """The versions of numpy, numba, jax and jaxlib in this process (None:
    not installed), Python's version and the machine's architecture
    (``platform.python_version()``, ``platform.machine()``), the git commit
    optical was imported from (``optical_commit``; None outside a git
    checkout, uncommitted changes unseen: ``optical_version`` is the same
    for every commit), the CPU's model name (``cpu``) and numpy's BLAS
    (``blas``: library, version and the kernel it picked, ``"openblas
    0.3.31.188.0 SkylakeX"``, as threadpoolctl finds it: the first BLAS
    loaded where none lies in numpy's own package, as for a conda or
    distribution numpy; None where it finds none, as for Apple's
    Accelerate), ``jax_device``: the device an unplaced JAX run (the JAX
    backend's, as sweeps and ``validate`` run it) computes on
    (:func:`_jax_device`; None: no JAX), whose GEMMs round as its own (a
    GPU's are not a CPU's), and ``jax_cpu``: whether JAX's CPU backend is
    there for the numba backend (None: no JAX), which a run's last bits
    depend on besides its inputs, config and seed: the numba backend runs its float32
    GEMMs in JAX's XLA where it is, else in numpy's BLAS (a
    ``JAX_PLATFORMS`` without ``cpu``, as GPU nodes set, leaves it out),
    which round differently (0.017 dB on a Llama-3.2-1B layer's SQNR). Sweep
    run records (from the worker that ran the run) and ``optical validate
    --json`` keep it. The CPU and the BLAS kernel move a run's last bits
    too (another CPU generation, or ``OPENBLAS_CORETYPE``; where Poisson
    counts or an ADC follow, a few outputs by up to a noise standard
    deviation: 0.004 dB on a small layer's output SQNR, measured;
    docs/ARCHITECTURE.md, "Across machines"); XLA's code follows the CPU's
    features, which the model name stands for, so identical records make
    identical bits likely, not certain."""
    versions = dict(_versions()) | {"python": platform.python_version(),
                                    "machine": platform.machine(),
                                    "optical_commit": source_commit(), **dict(_hardware())}
    if versions["jax"] is None:
        return {**versions, "jax_cpu": None, "jax_device": None}
    from optical.kernels.numba_backend import xla_available

    return {**versions, "jax_cpu": xla_available(), "jax_device": _jax_device()}


def _jax_device() -> str | None:
    """The device a JAX run whose arrays are not placed runs on, as
    ``"platform: kind"`` (``"gpu: NVIDIA H100 80GB HBM3"``; ``"cpu"`` where
    the kind is the platform's name): ``jax.default_device``'s, else the
    default backend's first. None where JAX starts no backend."""
    import jax

    try:
        device = jax.config.jax_default_device
        if device is None or isinstance(device, str):  # None: the default backend
            device = jax.devices(device)[0]
    except Exception:  # noqa: BLE001 - a JAX_PLATFORMS naming no usable backend
        return None
    kind = str(device.device_kind)
    return device.platform if kind.lower() == device.platform else f"{device.platform}: {kind}"


def available() -> list[str]:
    """The backends that can run here (``"numpy"`` always)."""
    names = ["numpy"]
    for name in ("numba", "jax"):
        if importlib.util.find_spec(name) is not None:
            names.append(name)
    return names


def resolve(backend: str, x: object, config: OpticalConfig | None = None) -> str:
    """The concrete backend for ``backend``, an input ``x`` and (optionally)
    the config it will run on.

    Raises
    ------
    ValueError
        For an unknown or unavailable backend, or a JAX array on a numpy-only one.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not valid; valid: "
                         + ", ".join(repr(b) for b in BACKENDS))
    jax_input = is_jax_array(x)
    if backend == "auto":
        if jax_input:
            return "jax"
        small = config is not None and config.core.inputs * config.core.outputs < MIN_FAST_TILE
        return "numba" if "numba" in available() and not small else "numpy"
    if backend not in available():
        # numba is a base dependency (missing only from a broken install); JAX an extra.
        hint = "pip install 'optical[jax]'" if backend == "jax" else "pip install numba"
        raise ValueError(f"backend: {backend!r} is not installed; {hint}")
    if jax_input and backend != "jax":
        raise ValueError(f"backend: {backend!r} takes numpy arrays, x is a JAX array; "
                         "use backend='jax' or convert with numpy.asarray(x)")
    return backend
