"""Ratio of the emulator to the plain matmul on a shared machine: wall time
and CPU time, in interleaved rounds.

On a machine that other processes share, a multi-threaded timing partly
measures them. Here each round times the two baselines and the emulator back
to back (a change of load hits all three), and besides the wall time it
records the process's CPU time (``time.process_time``, all threads), whose
ratio is the ratio of work done and barely depends on the load. The minimum
over the rounds is kept. ``python benchmarks/interleaved_ratio.py [tokens k n rounds]``;
``NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`` pins those libraries to one thread.
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
    pw = optical.program(w, cfg, calibration=x[:256])
    mm = jax.jit(lambda a, b: a @ b)
    xj, wj = jnp.asarray(x), jnp.asarray(w)
    methods = {
        "numpy x @ w": lambda: x @ w,
        "jax jit x @ w": lambda: mm(xj, wj).block_until_ready(),
        "optical numba, iris-like": lambda: optical.matmul(x, pw, cfg, seed=0, backend="numba"),
    }
    wall = dict.fromkeys(methods, float("inf"))
    cpu = dict.fromkeys(methods, float("inf"))
    for run in methods.values():
        run()  # compile and warm up
    for _ in range(rounds):
        for label, run in methods.items():
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            wall[label] = min(wall[label], time.perf_counter() - t0)
            cpu[label] = min(cpu[label], time.process_time() - c0)
    base_wall = min(wall["numpy x @ w"], wall["jax jit x @ w"])
    base_cpu = min(cpu["numpy x @ w"], cpu["jax jit x @ w"])
    print(f"{tokens}x{k}@{k}x{n}, threads: numba {os.environ.get('NUMBA_NUM_THREADS', 'all')}, "
          f"OpenBLAS {os.environ.get('OPENBLAS_NUM_THREADS', 'all')}, "
          f"load {os.getloadavg()[0]:.1f}")
    for label in methods:
        print(f"  {label:28s} wall {wall[label] * 1e3:8.1f} ms {wall[label] / base_wall:5.2f}x"
              f"   cpu {cpu[label] * 1e3:8.1f} ms {cpu[label] / base_cpu:5.2f}x")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
