"""The fast backends against the fastest plain fp32 matmul of the same run.

Cases: the 4096 x 4096 layer at 512 tokens, and Llama-3.1-8B's MLP shapes
(4096 -> 14336, 14336 -> 4096) at 2048 tokens, all on the iris-like preset
with the weights programmed once (a weight load is not part of a matmul).
Baselines: numpy's ``x @ w`` and a jitted JAX ``x @ w``. Also: the counter
RNG's draws per second against numpy's Generator, and peak memory.

Run with ``make bench`` (or ``pytest benchmarks``); the ratios table is
printed at the end and written to ``.benchmarks/ratios.json``.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optical
from optical import _rng
from optical.kernels import _rng_numba

jax = pytest.importorskip("jax")
jnp = jax.numpy
from baselines import jax_matmul  # noqa: E402
from interleaved_ratio import summary, time_round  # noqa: E402

from optical.kernels import jax_backend  # noqa: E402

SHAPES = {
    "512x4096@4096x4096": (512, 4096, 4096),
    "llama8b up 2048x4096@4096x14336": (2048, 4096, 14336),
    "llama8b down 2048x14336@14336x4096": (2048, 14336, 4096),
}
CFG = optical.presets.get("iris-like")


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request):
    tokens, k, n = SHAPES[request.param]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    # iris-like as deployed: ADC windows and outlier channels calibrated on inputs.
    return request.param, x, w, optical.program(w, CFG, calibration=x[:256])


def _rounds(x):
    return 5 if x.shape[0] <= 512 else 3


def test_baseline_numpy(benchmark, case, record):
    name, x, w, _ = case
    benchmark.pedantic(lambda: x @ w, rounds=_rounds(x), warmup_rounds=1)
    record(name, "baseline numpy x @ w", benchmark)


def test_baseline_jax(benchmark, case, record):
    name, x, w, _ = case
    benchmark.pedantic(jax_matmul(x, w), rounds=_rounds(x), warmup_rounds=1)
    record(name, "baseline jax jit x @ w", benchmark)


def test_numba_iris_like(benchmark, case, record):
    name, x, _, pw = case
    benchmark.pedantic(lambda: optical.matmul(x, pw, CFG, seed=0, backend="numba"),
                       rounds=_rounds(x), warmup_rounds=1)
    record(name, "optical numba, iris-like", benchmark)


def test_numba_iris_like_exact(benchmark, case, record):
    name, x, _, pw = case
    if x.shape[0] > 512:
        pytest.skip("exact mode measured on the first case only")
    benchmark.pedantic(lambda: optical.matmul(x, pw, CFG, seed=0, backend="numba", exact=True),
                       rounds=2, warmup_rounds=1)
    record(name, "optical numba exact, iris-like", benchmark)


def test_jax_iris_like(benchmark, case, record):
    name, x, w, _ = case
    device = jax.default_backend()  # where this runs: a GPU when JAX has one
    if x.shape[0] > 512 and device == "cpu":
        pytest.skip("the JAX backend is the GPU path; on this CPU, measured on the first case")
    pw = optical.program(w, CFG, calibration=x[:256])
    xj = jnp.asarray(x)
    benchmark.pedantic(lambda: jax_backend.matmul(xj, pw, CFG, seed=0).block_until_ready(),
                       rounds=2, warmup_rounds=1)
    record(name, f"optical jax ({device.upper()}), iris-like", benchmark)


def test_interleaved_ratio(benchmark, case, record_seconds, record_round_ratio):
    """The headline ratio, robust to a shared machine: each round times the
    two baselines and the emulator one after the other, so a change of load
    hits all three; the order rotates from round to round and every call is
    followed by an idle pause (``interleaved_ratio.time_round``: OpenBLAS's
    threads spin after numpy returns). Recorded: each method's minimum over
    the rounds, and the median of the emulator's per-round ratios to the
    same round's fastest baseline, for wall time and for CPU time."""
    name, x, w, pw = case
    methods = {
        "baseline numpy x @ w": lambda: x @ w,
        "baseline jax jit x @ w": jax_matmul(x, w),
        "optical numba, iris-like":
            lambda: optical.matmul(x, pw, CFG, seed=0, backend="numba"),
    }
    time_round(methods, 0, {}, {})  # warm-up, not kept
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    rounds = iter(range(2 * _rounds(x)))
    benchmark.pedantic(lambda: time_round(methods, next(rounds), wall, cpu),
                       rounds=2 * _rounds(x), warmup_rounds=0)
    baselines = [label for label in methods if label.startswith("baseline")]
    for suffix, times in ((" (interleaved)", wall), (" (interleaved, CPU time)", cpu)):
        for label, row in summary(times, baselines).items():
            record_seconds(name + suffix, label, row["min_s"])
            if not label.startswith("baseline"):
                record_round_ratio(name + suffix, label, row["median_round_ratio"])


# --------------------------------------------------------------------------- #
# The random numbers
# --------------------------------------------------------------------------- #

RNG_CASE = "8M standard normals"
_N = 8 * 1024 * 1024


def test_rng_numpy_generator(benchmark, record):
    # Into a buffer allocated outside the timing, as the counter RNG's cases
    # (a fresh 32 MiB output each round cost numpy ~14 % more).
    gen = np.random.default_rng(0)
    out = np.empty(_N, dtype=np.float32)
    benchmark.pedantic(lambda: gen.standard_normal(dtype=np.float32, out=out), rounds=5,
                       warmup_rounds=1)
    record(RNG_CASE, "baseline numpy Generator", benchmark)


def test_rng_counter_fast_pairs(benchmark, record):
    out = np.empty(_N, dtype=np.float32)
    key = _rng.stream_key(0, 6)
    benchmark.pedantic(lambda: _rng_numba.normal_pairs_range(key, np.uint64(0), out), rounds=5,
                       warmup_rounds=1)
    record(RNG_CASE, "counter RNG, fast pairs (numba)", benchmark)


def test_rng_counter_poisson(benchmark, record):
    """Exact Poisson draws at the counts of the wang-2022 preset (mean 3.1), serial."""
    n = 1 << 20
    idx = np.arange(n, dtype=np.uint64)
    lam = np.full(n, 3.1)
    out = np.empty(n)
    benchmark.pedantic(lambda: _rng_numba.poisson_array(np.uint64(0), np.uint64(1), idx, lam, out),
                       rounds=5, warmup_rounds=1)
    record("1M Poisson draws, mean 3.1", "counter RNG, exact Poisson (numba, 1 thread)",
           benchmark)


def test_rng_numpy_poisson(benchmark, record):
    # Generator.poisson has no out=: numpy also allocates its 8 MiB output.
    gen = np.random.default_rng(0)
    benchmark.pedantic(lambda: gen.poisson(3.1, 1 << 20), rounds=5, warmup_rounds=1)
    record("1M Poisson draws, mean 3.1", "baseline numpy Generator", benchmark)


def test_rng_counter_reference_normals(benchmark, record):
    out = np.empty(_N)
    key = _rng.stream_key(0, 6)
    benchmark.pedantic(lambda: _rng_numba.normal_range(key, np.uint64(0), out), rounds=3,
                       warmup_rounds=1)
    record(RNG_CASE, "counter RNG, reference normals (numba)", benchmark)


# --------------------------------------------------------------------------- #
# Peak memory
# --------------------------------------------------------------------------- #

_MEMORY_SCRIPT = """
import sys, numpy as np, optical, jax, jax.numpy as jnp
tokens, k, n = map(int, sys.argv[1:4])
rng = np.random.default_rng(0)
x = rng.standard_normal((tokens, k), dtype=np.float32)
w = rng.standard_normal((k, n), dtype=np.float32)
cfg = optical.presets.get("iris-like")
pw = optical.program(w, cfg, calibration=x[:256])
small = optical.program(w[:64, :64].copy(), cfg, calibration=x[:16, :64])  # warm up
optical.matmul(x[:4, :64].copy(), small, cfg, seed=0, backend="numba")
jnp.ones(2).block_until_ready()
def status(field):  # bytes
    with open("/proc/self/status") as f:
        line = next(l for l in f if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident set
before = status("VmRSS")
y = optical.matmul(x, pw, cfg, seed=0, backend="numba")
print(status("VmHWM") - before, x.nbytes + w.nbytes + y.nbytes)
"""


@pytest.mark.parametrize("name", list(SHAPES)[:2])
def test_peak_memory(name, record_note):
    """Peak resident memory added by the first matmul on programmed weights
    (its per-weight-load plan included), against the bytes of x, w and y."""
    tokens, k, n = SHAPES[name]
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tokens), str(k), str(n)],
                         capture_output=True, text=True, check=True)
    added, operands = map(int, out.stdout.split())
    ratio = added / operands
    path = Path(".benchmarks")
    path.mkdir(exist_ok=True)
    table = json.loads((path / "memory.json").read_text()) if (path / "memory.json").exists() \
        else {}
    table[name] = {"added_bytes": added, "operand_bytes": operands, "ratio": ratio}
    (path / "memory.json").write_text(json.dumps(table, indent=2))
    record_note(f"{name}: peak added {added / 2**20:.0f} MiB = {ratio:.2f} x (x + w + y)")
    assert ratio <= 2.0
