"""Benchmarks report ratios against the plain matmul measured in the same run.

Each benchmark records its minimum time under a case name; the baseline of a
case is the fastest plain matmul recorded for it. Interleaved benchmarks also
record the median of their per-round ratios (each round's time over the
fastest baseline of the same round), which a drift of the load between rounds
cannot skew. The table is printed at the end of the run and written to
``.benchmarks/ratios.json``.

Every benchmark test starts after a short pause: OpenBLAS's worker threads
keep spinning for ~50-90 ms after a numpy GEMM returns (measured here), and
that CPU would otherwise land in whatever is timed next.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

_TIMES: dict[str, dict[str, float]] = {}
_ROUND_RATIOS: dict[str, dict[str, float]] = {}
_NOTES: list[str] = []

# Longer than OpenBLAS's spin after a call (its THREAD_TIMEOUT, 2**28 cycles by
# default: ~0.1 s) and than the 50-90 ms of CPU measured after a 512 x 4096 @
# 4096 x 4096 GEMM on this machine.
QUIESCE_S = 0.25


def quiesce() -> None:
    """Wait until the thread pools of the last call have stopped spinning."""
    time.sleep(QUIESCE_S)


@pytest.fixture(autouse=True)
def _quiet_start():
    quiesce()


@pytest.fixture(scope="session")
def operands():
    """The 512 x 4096 @ 4096 x 4096 case: standard normal float32 x and w, seed 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4096), dtype=np.float32)
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    return x, w


def _keep_min(case: str, name: str, seconds: float) -> None:
    # Two files may time the same case and method (e.g. numpy's x @ w at 512 x
    # 4096 @ 4096 x 4096): keep the faster, as for the rounds of one benchmark.
    times = _TIMES.setdefault(case, {})
    times[name] = min(seconds, times.get(name, float("inf")))


@pytest.fixture(scope="session")
def record():
    def _record(case: str, name: str, benchmark) -> None:
        if benchmark.stats is None:  # --benchmark-disable: nothing was timed
            return
        _keep_min(case, name, benchmark.stats.stats.min)
    return _record


@pytest.fixture(scope="session")
def record_seconds():
    """Record a minimum time measured by hand (e.g. in interleaved rounds)."""
    return _keep_min


@pytest.fixture(scope="session")
def record_round_ratio():
    """Record the median of per-round ratios to the same round's fastest baseline."""
    def _record(case: str, name: str, median_ratio: float) -> None:
        _ROUND_RATIOS.setdefault(case, {})[name] = median_ratio
    return _record


@pytest.fixture(scope="session")
def record_note():
    """Record a line for the end-of-run summary (pytest captures a test's own
    prints, so without -s they would never show)."""
    return _NOTES.append


def _ratios():
    table = {}
    for case, times in _TIMES.items():
        baselines = {k: v for k, v in times.items() if k.startswith("baseline")}
        if not baselines:
            continue
        best = min(baselines.values())
        table[case] = {name: {"min_s": t, "ratio": t / best} for name, t in times.items()}
        for name, median in _ROUND_RATIOS.get(case, {}).items():
            table[case].setdefault(name, {})["median_round_ratio"] = median
    return table


def pytest_terminal_summary(terminalreporter):
    if _NOTES:
        terminalreporter.section("measured beside the ratios")
        for line in _NOTES:
            terminalreporter.write_line(line)
    table = _ratios()
    if not table:
        return
    terminalreporter.section("ratios to each case's fastest baseline of the same run")
    cores = os.cpu_count()
    terminalreporter.write_line(f"cores: {cores}; OPENBLAS_CORETYPE="
                                f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; "
                                f"load average {os.getloadavg()[0]:.1f}")
    terminalreporter.write_line("ratio: min over min; per round: median of each round's "
                                "ratio to that round's fastest baseline (interleaved only)")
    case_width = max(map(len, table))
    name_width = max(len(name) for rows in table.values() for name in rows)
    for case, rows in table.items():
        for name, row in sorted(rows.items(), key=lambda kv: kv[1].get("ratio", 0.0)):
            line = f"{case:{case_width}s} {name:{name_width}s}"
            if "min_s" in row:
                line += f" {row['min_s'] * 1e3:9.1f} ms {row['ratio']:6.2f}x"
            if "median_round_ratio" in row:
                line += f"   per round {row['median_round_ratio']:5.2f}x"
            terminalreporter.write_line(line)
    out = Path(".benchmarks")
    out.mkdir(exist_ok=True)
    (out / "ratios.json").write_text(json.dumps(table, indent=2))
