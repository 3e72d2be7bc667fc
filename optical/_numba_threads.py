"""Set numba's OpenMP workers to wait passively; imported by
every module with parallel numba kernels.

numba's OpenMP workers busy-wait between kernels by default, taking the cores
from the GEMM that runs between them (and from any other process): measured
on a loaded 2-core machine, a kernel ran 10-20x slower with 2 threads than
with 1, and a programmed matmul after programming's parallel kernels ran
1.5x slower. Passive waiting costs nothing measurable. The setting must be
made before numba starts its thread pool (the first parallel kernel call),
so it lives here rather than in one backend. A user's own setting wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
