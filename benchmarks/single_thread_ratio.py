"""Work ratio of the emulator to the plain matmul with everything on one thread.

On a shared machine, multi-threaded timings mostly measure the other
processes; with one thread each (numba, XLA, OpenBLAS), interleaved rounds and
the minimum over them, the ratio is the ratio of work. Run as
``OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1" python benchmarks/single_thread_ratio.py``.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import optical


def main(tokens: int = 512, k: int = 4096, n: int = 4096, rounds: int = 5) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    cfg = optical.presets.get("iris-like")
    pw = optical.program(w, cfg)
    mm = jax.jit(lambda a, b: a @ b)
    xj, wj = jnp.asarray(x), jnp.asarray(w)
    methods = {
        "numpy x @ w": lambda: x @ w,
        "jax jit x @ w": lambda: mm(xj, wj).block_until_ready(),
        "optical numba, iris-like": lambda: optical.matmul(x, pw, cfg, seed=0, backend="numba"),
    }
    best = dict.fromkeys(methods, float("inf"))
    for run in methods.values():
        run()  # compile and warm up
    for _ in range(rounds):
        for label, run in methods.items():
            t0 = time.perf_counter()
            run()
            best[label] = min(best[label], time.perf_counter() - t0)
    base = min(best["numpy x @ w"], best["jax jit x @ w"])
    print(f"{tokens}x{k}@{k}x{n}, threads: numba {os.environ.get('NUMBA_NUM_THREADS')}, "
          f"OpenBLAS {os.environ.get('OPENBLAS_NUM_THREADS')}, load {os.getloadavg()[0]:.1f}")
    for label, seconds in best.items():
        print(f"  {label:28s} {seconds * 1e3:8.1f} ms  {seconds / base:5.2f}x")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
