"""Sweep overhead: 24 runs of a 64x512x256 matmul through optical.sweep (this
process; 2 local worker processes, start-up included) against the same runs
called directly in a loop."""

import itertools
import tempfile
from pathlib import Path

import pytest

import optical

pytest.importorskip("pandas")

CASE = "sweep 24 runs of 64x512@512x256"
WL = optical.MatmulWorkload(64, 512, 256)
PARAMS = {"adc.bits": [4, 6, 8], "source.photons_per_mac": [1e3, 1e4, 1e5, 1e6]}
SEEDS = 2
_counter = itertools.count()


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as path:
        yield Path(path)


def _fresh(workdir):
    return (), {"out": workdir / f"s{next(_counter)}"}


def test_baseline_direct_runs(benchmark, record):
    base = optical.presets.get("iris-like")
    configs = [base.replace(dict(zip(PARAMS, values, strict=True)))
               for values in itertools.product(*PARAMS.values())]

    def direct():
        for cfg in configs:
            for seed in range(SEEDS):
                WL.run(cfg, seed)

    benchmark.pedantic(direct, rounds=3, warmup_rounds=1)
    record(CASE, "baseline direct workload.run loop", benchmark)


@pytest.mark.parametrize("executor", ["serial", 2])
def test_sweep(benchmark, record, workdir, executor):
    def run(out):
        optical.sweep(WL, PARAMS, seeds=SEEDS, out=out, executor=executor, progress=False)

    benchmark.pedantic(run, setup=lambda: _fresh(workdir), rounds=3, warmup_rounds=1)
    record(CASE, f"optical.sweep executor={executor}", benchmark)
