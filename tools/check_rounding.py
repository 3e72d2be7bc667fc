"""Exhaustive check of the fp16/bf16 rounding kernels against numpy.

Runs ``optical.transformer.numerics.round_to`` (its numba kernels) on every
one of the 2**32 float32 bit patterns, in chunks, and compares the bits with
the numpy code the kernels replace (fp16: ``astype(float16).astype(float32)``;
bf16: ``numerics._round_bfloat16``); NaN inputs must give NaN. Prints the
number of mismatches per dtype (expected: 0) and exits non-zero on any.

    python tools/check_rounding.py   # ~7 min on 2 cores (numpy's fp16 cast dominates)
"""

import sys
import time

import numpy as np

from optical.transformer import numerics

CHUNK = 1 << 26


def main() -> int:
    bad = 0
    for dtype in ("float16", "bfloat16"):
        start, mismatches = time.perf_counter(), 0
        for lo in range(0, 1 << 32, CHUNK):
            x = np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
            fast = numerics.round_to(x, dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                ref = (x.astype(np.float16).astype(np.float32) if dtype == "float16"
                       else numerics._round_bfloat16(x))
            nan = np.isnan(x)
            same = fast.view(np.uint32) == ref.view(np.uint32)
            mismatches += np.count_nonzero(~same & ~nan) + np.count_nonzero(~np.isnan(fast[nan]))
        print(f"{dtype}: {mismatches} mismatches over 2**32 float32 patterns "
              f"({time.perf_counter() - start:.0f} s)")
        bad += mismatches
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
