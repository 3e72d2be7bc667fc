"""Ratio of the emulator to the plain matmul on a shared machine: wall time
and CPU time, in interleaved rounds.

On a machine that other processes share, a multi-threaded timing partly
measures them. Here each round times the two baselines and the emulator one
after the other (a change of load hits all three), and besides the wall time
it records the process's CPU time (``time.process_time``, all threads), whose
ratio is the ratio of work done and depends less on the load.

Two things would otherwise bias the ratio. OpenBLAS's worker threads keep
spinning for ~50-90 ms after numpy's GEMM returns, and in a fixed order that
CPU landed in the JAX call timed next (up to ~35 % of it at 512 tokens),
flattering the emulator: so every call is followed by an idle pause, outside
its wall time but inside its CPU time (a pool's spin is charged to the
library that spun), and the order rotates from round to round. And the
minimum of each method over the rounds may come from different rounds: so
besides min over min, each round's ratio to the fastest baseline of the same
round is kept, and their median reported.

``python benchmarks/interleaved_ratio.py [tokens k n rounds]``;
``NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`` pins those libraries to one thread.
"""

import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

# Longer than OpenBLAS's spin after a call (~0.1 s: THREAD_TIMEOUT's 2**28 cycles).
PAUSE_S = 0.25


def time_round(methods: dict[str, Callable[[], object]], index: int,
               wall: dict[str, list[float]], cpu: dict[str, list[float]],
               pause_s: float = PAUSE_S) -> None:
    """Time each method once, in the order rotated by ``index``, appending
    its wall and CPU seconds to ``wall`` and ``cpu``."""
    labels = list(methods)
    shift = index % len(labels)
    for label in labels[shift:] + labels[:shift]:
        t0, c0 = time.perf_counter(), time.process_time()
        methods[label]()
        t1 = time.perf_counter()
        time.sleep(pause_s)  # let the pools stop spinning before the next call
        wall.setdefault(label, []).append(t1 - t0)
        cpu.setdefault(label, []).append(time.process_time() - c0)


def summary(times: dict[str, list[float]], baselines: list[str]) -> dict[str, dict[str, float]]:
    """Per method: the minimum over the rounds, min over the baselines' min,
    and the median over rounds of its time over the same round's fastest baseline."""
    best = min(min(times[b]) for b in baselines)
    per_round = [min(times[b][r] for b in baselines) for r in range(len(times[baselines[0]]))]
    return {label: {"min_s": min(ts), "ratio": min(ts) / best,
                    "median_round_ratio": statistics.median(
                        t / base for t, base in zip(ts, per_round, strict=True))}
            for label, ts in times.items()}


def main(tokens: int = 512, k: int = 4096, n: int = 4096, rounds: int = 7) -> None:
    from baselines import jax_matmul

    import optical

    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    cfg = optical.presets.get("iris-like")
    pw = optical.program(w, cfg, calibration=x[:256])
    methods = {
        "numpy x @ w": lambda: x @ w,
        "jax jit x @ w": jax_matmul(x, w),
        "optical numba, iris-like": lambda: optical.matmul(x, pw, cfg, seed=0, backend="numba"),
    }
    time_round(methods, 0, {}, {})  # compile and warm up
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for index in range(rounds):
        time_round(methods, index, wall, cpu)
    baselines = ["numpy x @ w", "jax jit x @ w"]
    wall_rows, cpu_rows = summary(wall, baselines), summary(cpu, baselines)
    print(f"{tokens}x{k}@{k}x{n}, {rounds} rounds, threads: numba "
          f"{os.environ.get('NUMBA_NUM_THREADS', 'all')}, OpenBLAS "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'all')}, load {os.getloadavg()[0]:.1f}; "
          "ratio: min/min, per-round median")
    for label in methods:
        w_row, c_row = wall_rows[label], cpu_rows[label]
        print(f"  {label:26s} wall {w_row['min_s'] * 1e3:8.1f} ms {w_row['ratio']:5.2f}x "
              f"{w_row['median_round_ratio']:5.2f}x   cpu {c_row['min_s'] * 1e3:8.1f} ms "
              f"{c_row['ratio']:5.2f}x {c_row['median_round_ratio']:5.2f}x")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
