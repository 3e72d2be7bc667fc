"""Benchmarks report ratios against the plain matmul measured in the same run.

Each benchmark records its minimum time under a case name; the baseline of a
case is the fastest plain matmul recorded for it. The table is printed at the
end of the run and written to ``.benchmarks/ratios.json``.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

_TIMES: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="session")
def operands():
    """The 512 x 4096 @ 4096 x 4096 case: standard normal float32 x and w, seed 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4096), dtype=np.float32)
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    return x, w


@pytest.fixture(scope="session")
def record():
    def _record(case: str, name: str, benchmark) -> None:
        _TIMES.setdefault(case, {})[name] = benchmark.stats.stats.min
    return _record


@pytest.fixture(scope="session")
def record_seconds():
    """Record a minimum time measured by hand (e.g. in interleaved rounds)."""
    def _record(case: str, name: str, seconds: float) -> None:
        _TIMES.setdefault(case, {})[name] = seconds
    return _record


def _ratios():
    table = {}
    for case, times in _TIMES.items():
        baselines = {k: v for k, v in times.items() if k.startswith("baseline")}
        if not baselines:
            continue
        best = min(baselines.values())
        table[case] = {name: {"min_s": t, "ratio": t / best} for name, t in times.items()}
    return table


def pytest_terminal_summary(terminalreporter):
    table = _ratios()
    if not table:
        return
    terminalreporter.section("ratios to the fastest plain matmul of the same run")
    cores = os.cpu_count()
    terminalreporter.write_line(f"cores: {cores}; OPENBLAS_CORETYPE="
                                f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    for case, rows in table.items():
        for name, row in sorted(rows.items(), key=lambda kv: kv[1]["ratio"]):
            terminalreporter.write_line(f"{case:32s} {name:36s} {row['min_s'] * 1e3:9.1f} ms "
                                        f"{row['ratio']:6.2f}x")
    out = Path(".benchmarks")
    out.mkdir(exist_ok=True)
    (out / "ratios.json").write_text(json.dumps(table, indent=2))
