"""The fast paths of programming against their numpy references.

``optical.program`` loads the weights (``quant._load``), pre-distorts and
loads the mask through the lens physics (``optical.kernels._program``) and
calibrates ADC windows (``calibration.mse_windows``, numba backend) in
compiled kernels; the references are the readable numpy code they replace
(``_weight_scale`` here, ``compensation.pre_distort`` with
``crosstalk.effective_transmissions``, ``mse_windows(backend="numpy")``).
They do the same float operations in the same order, so everything
``program`` returns must agree to the bit -- whatever the layout of ``w``,
the number of threads, or the rest of the matrix around a tile. The
references' rounding (``numerics.round_to``) is checked the same way.
"""

import contextlib

import numba
import numpy as np
import pytest

import optical
from optical import calibration, compensation, quant, transformer
from optical.transformer import numerics
from tests.transformer_helpers import TINY_LLAMA, write_model

FIELDS = ("transmissions", "weights", "scale", "weight_sums", "adc_lo", "adc_hi")

#: A small iris-like machine: several tiles, partial ones at the edges.
SMALL = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
#: Optics with a strong row coupling (6 um sources: 4% per neighbouring row,
#: kept in float32 too), a falling envelope and 1.5% output crosstalk.
STRONG = {"optics.fan_in_aperture": 10e-3, "optics.beam_profile": "gaussian",
          "optics.beam_waist": 6e-6}


class _Reference:
    """The lens physics as an optics object that is not ``quant._LensOptics``:
    program() then takes the numpy path (``compensation.pre_distort``)."""

    def __init__(self, optics):
        self.optics = optics

    def apply(self, t, tiling):
        return self.optics.apply(t, tiling)

    def diagonal(self, tiling):
        return self.optics.diagonal(tiling)

    def leak_parts(self, tiling):  # the optics' leak bounds: physics, not the fast path
        return self.optics.leak_parts(tiling)


def _weight_scale(w, tiling, policy):
    """The readable reference of ``quant._load``'s scale: the abs-max of
    every column of every K-tile, shape (k_tiles, N); 0 where the column is
    all zero (the mask divides by 1, the readouts are multiplied by 0, so
    such a column's output is exactly 0)."""
    def absmax(a):
        return np.maximum(a.max(axis=0), -a.min(axis=0))

    if policy in ("per_column", "per_tensor"):
        per = absmax(w)[None, :]
        if policy == "per_tensor":
            per = np.full_like(per, per.max())
        per = np.repeat(per, tiling.k_tiles, axis=0)
    else:
        per = np.stack([absmax(w[tiling.k_slice(i)]) for i in range(tiling.k_tiles)])
        if policy == "per_tile":
            for j in range(tiling.n_tiles):
                ns = tiling.n_slice(j)
                per[:, ns] = per[:, ns].max(axis=1, keepdims=True)
    return per.astype(w.dtype)


def _reference_load(w, rows, tiling, policy):
    wr = w if rows is None else w[rows]
    scale = _weight_scale(wr, tiling, policy)
    v = np.empty_like(wr)
    for i in range(tiling.k_tiles):
        v[tiling.k_slice(i)] = wr[tiling.k_slice(i)] / np.where(scale[i] > 0, scale[i], 1)
    return scale, v


@contextlib.contextmanager
def _numpy_references(monkeypatch):
    """program() as the numpy references compute it."""
    with monkeypatch.context() as m:
        lens = quant._optics_map
        mse = calibration.mse_windows
        m.setattr(quant, "_optics_map",
                  lambda config: None if lens(config) is None else _Reference(lens(config)))
        m.setattr(quant, "_load", _reference_load)
        m.setattr(calibration, "mse_windows", lambda *a, **k: mse(*a, **k, backend="numpy"))
        yield


def _assert_same(a, b):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize(("changes", "dtype"), [
    ({}, np.float32),
    ({}, np.float64),
    ({"mask.compensate": False}, np.float32),
    ({"encoding.weights": "offset", "detector.balanced": False}, np.float32),
    ({"encoding.weights": "offset", "detector.balanced": False, "mask.compensate": False},
     np.float64),
    (STRONG, np.float32),
    ({**STRONG, "optics.kernel_radius": 2, "mask.scaling": "per_tile"}, np.float64),
    ({**STRONG, "optics.kernel_radius": 0, "mask.bits": None}, np.float32),
    ({**STRONG, "mask.contrast_ratio": float("inf"), "encoding.weights": "offset",
      "detector.balanced": False}, np.float32),
])
def test_program_matches_the_numpy_references_to_the_bit(monkeypatch, rng, changes, dtype):
    cfg = SMALL.replace(changes)
    w = (rng.standard_normal((130, 95)) * 0.02).astype(dtype)
    w[:, 7] *= 30  # a loud column
    cal = rng.standard_normal((40, 130)).astype(dtype)
    cal[:, 3] *= 50  # an outlier channel: bypassed, its mask row gone
    fast = optical.program(w, cfg, calibration=cal)
    assert fast.bypass is not None and fast.bypass.channels.size > 0
    with _numpy_references(monkeypatch):
        reference = optical.program(w, cfg, calibration=cal)
    _assert_same(fast, reference)


def test_a_transposed_weight_is_read_in_place(rng):
    """HF stores [out, in]; program(W.T) reads it without a copy, and with
    the same result as a row-major copy (and a strided view)."""
    weight = (rng.standard_normal((95, 130)) * 0.02).astype(np.float32)
    cal = rng.standard_normal((40, 130)).astype(np.float32)
    a = optical.program(weight.T, SMALL, calibration=cal)
    b = optical.program(np.ascontiguousarray(weight.T), SMALL, calibration=cal)
    _assert_same(a, b)
    wide = np.zeros((130, 190), dtype=np.float32)
    wide[:, ::2] = weight.T
    _assert_same(a, optical.program(wide[:, ::2], SMALL, calibration=cal))


@pytest.mark.parametrize("policy", ["per_column", "per_tensor", "per_tile", "per_tile_column"])
@pytest.mark.parametrize("layout", ["C", "T", "strided"])
def test_load_matches_weight_scale_and_division(rng, policy, layout):
    weight = (rng.standard_normal((77, 150)) * 0.02).astype(np.float32)
    weight[5] = 0  # an all-zero column of w: scale 0, divided by 1
    w = {"C": np.ascontiguousarray(weight.T), "T": weight.T,
         "strided": np.ascontiguousarray(weight.T)[:, ::2]}[layout]
    for rows in (None, np.sort(rng.choice(w.shape[0], 131, replace=False))):
        tiling = quant.Tiling(w.shape[0] if rows is None else rows.size, w.shape[1], 32, 24)
        scale, v = quant._load(w, rows, tiling, policy)
        ref_scale, ref_v = _reference_load(w, rows, tiling, policy)
        np.testing.assert_array_equal(scale, ref_scale)
        np.testing.assert_array_equal(v, ref_v)
        assert v.flags.c_contiguous and v.dtype == w.dtype


@pytest.mark.parametrize("policy", ["per_column", "per_tile_column"])
def test_load_of_a_matrix_wider_than_a_column_chunk(rng, policy):
    """Column maxima are taken 2048 columns at a time: a 40 x 4100 matrix
    (every Llama layer is wider than a chunk) against the reference, so the
    last column of each chunk gets its own scale (a column left at scale 0
    would come out all zero)."""
    w = (rng.standard_normal((40, 4100)) * 0.02).astype(np.float32)
    tiling = quant.Tiling(40, 4100, 32, 1024)
    scale, v = quant._load(w, None, tiling, policy)
    ref_scale, ref_v = _reference_load(w, None, tiling, policy)
    np.testing.assert_array_equal(scale, ref_scale)
    np.testing.assert_array_equal(v, ref_v)
    assert (scale > 0).all()


def test_a_tile_is_programmed_by_its_own_weights_alone(rng):
    """Light does not cross tile edges and each tile converges on its own: a
    matrix cut along tile edges programs to the same tiles, bit for bit
    (fast path and numpy reference)."""
    cfg = SMALL.replace({**STRONG, "adc.full_scale": "rms", "outliers.policy": "none",
                         "mask.scaling": "per_tile_column"})
    w = rng.standard_normal((96, 120)).astype(np.float32)
    w[:48, :40] *= 1e-3  # a quiet tile next to loud ones
    whole = optical.program(w, cfg)
    part = optical.program(w[48:, 40:], cfg)
    np.testing.assert_array_equal(whole.transmissions[:, 48:, 40:], part.transmissions)
    np.testing.assert_array_equal(whole.weights[48:, 40:], part.weights)
    optics = quant._optics_map(cfg)
    tiling = quant.Tiling(96, 120, 48, 40)
    gain = compensation.gain(optics, tiling, cfg.mask.min_transmission, "split", 2)
    rows = quant._per_row(gain.astype(np.float32), tiling)
    v = w / np.abs(w).max(axis=0)
    ref = compensation.pre_distort(v, rows, optics, tiling, cfg.mask.min_transmission, "split")
    sub = quant.Tiling(48, 80, 48, 40)
    ref_part = compensation.pre_distort(v[48:, 40:], rows[48:, 40:], optics, sub,
                                        cfg.mask.min_transmission, "split")
    np.testing.assert_array_equal(ref[:, 48:, 40:], ref_part)


def test_programming_does_not_depend_on_the_thread_count(rng):
    w = rng.standard_normal((200, 170)).astype(np.float32)
    cal = rng.standard_normal((64, 200)).astype(np.float32)
    first = optical.program(w, SMALL, calibration=cal)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = optical.program(w, SMALL, calibration=cal)
    finally:
        numba.set_num_threads(threads)
    _assert_same(first, one)


def _window_cases(rng):
    for case in range(24):
        dtype = (np.float32, np.float64)[case % 2]
        n_samples, n_cols = int(rng.integers(20, 400)), int(rng.integers(1, 40))
        samples = rng.standard_normal((n_samples, n_cols)) * rng.uniform(0.1, 5, n_cols)
        if case % 3 == 0:
            samples = rng.gamma(2.0, 1.0, (n_samples, n_cols))
        sigma = rng.uniform(0, 0.5, n_cols) if case % 4 == 0 else np.zeros(n_cols)
        groups = None
        if case % 5 == 0 and n_cols >= 3:
            groups = rng.integers(0, 3, n_cols)
            groups[:3] = [0, 1, 2]
        yield (samples.astype(dtype), sigma, int(rng.integers(3, 9)),
               float(rng.uniform(0, 2)), groups)


@pytest.mark.parametrize("tails", [False, True])
def test_mse_windows_numba_matches_numpy(rng, tails):
    """Without tails the arithmetic is the same: every window to the bit.
    The tails' exp is libm's in the kernel and numpy's SIMD routine in the
    reference (they differ in the last place for a few percent of
    arguments): a window may move by one bin where two edges cost the same
    to the last bits, never more, and rarely (measured: never here)."""
    moved = total = 0
    for samples, sigma, bits, loss, groups in _window_cases(rng):
        args = (samples, sigma, bits, loss)
        lo, hi = calibration.mse_windows(*args, groups=groups, tails=tails, backend="numba")
        ref_lo, ref_hi = calibration.mse_windows(*args, groups=groups, tails=tails,
                                                 backend="numpy")
        if not tails:
            np.testing.assert_array_equal(lo, ref_lo)
            np.testing.assert_array_equal(hi, ref_hi)
        bin_width = (np.maximum(hi, ref_hi) - np.minimum(lo, ref_lo)) / calibration.N_BINS
        assert np.all(np.abs(lo - ref_lo) <= 1.0001 * bin_width)
        assert np.all(np.abs(hi - ref_hi) <= 1.0001 * bin_width)
        moved += np.count_nonzero(lo != ref_lo) + np.count_nonzero(hi != ref_hi)
        total += 2 * lo.size
    assert moved <= 0.01 * total, (moved, total)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rails", [[[1.0, -1.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0]]])
def test_readout_tile_matches_numpy(rng, dtype, rails):
    """The calibration's one pass over a tile: each ADC rail's transmissions
    (to the bit), the mean detected light and the RIN variance (float64)."""
    from optical.kernels import _windows

    rails = np.array(rails)
    t = rng.uniform(0.01, 1, (rails.shape[1], 90, 700)).astype(dtype)
    k0, k1, n0, n1 = 17, 80, 30, 650  # an inner tile: offsets in both axes
    a = rng.uniform(0, 1, (25, k1 - k0))
    a_mean, a_sq = a.mean(axis=0), np.square(a).mean(axis=0)
    combined = np.empty((rails.shape[0], k1 - k0, n1 - n0), dtype=dtype)
    detected = np.zeros((rails.shape[1], n1 - n0))
    rin = np.zeros((rails.shape[0], n1 - n0))
    _windows.readout_tile(t, k0, k1, n0, n1, rails, a_mean, a_sq, combined, detected, rin)
    tile = t[:, k0:k1, n0:n1]
    for e, row in enumerate(rails):
        expected = sum(tile[r] if g == 1 else dtype(g) * tile[r] for r, g in enumerate(row)
                       if g != 0)
        np.testing.assert_array_equal(combined[e], expected)
        np.testing.assert_allclose(rin[e], a_sq @ np.square(expected.astype(np.float64)),
                                   rtol=1e-12)
    np.testing.assert_allclose(detected, np.stack([a_mean @ r.astype(np.float64) for r in tile]),
                               rtol=1e-12)


def test_mse_windows_with_noise_wider_than_the_samples(rng):
    """Readout noise far wider than the samples' spread: each Gauss-Hermite
    node pushes whole columns past the ends of the bin range, where the
    kernel's split loops must still add bins in the reference's order."""
    samples = rng.standard_normal((300, 12)) * 0.01
    sigma = np.geomspace(0.05, 5.0, 12)
    for groups in (None, np.repeat(np.arange(4), 3)):
        lo, hi = calibration.mse_windows(samples, sigma, 6, 1.0, groups=groups, tails=False,
                                         backend="numba")
        ref = calibration.mse_windows(samples, sigma, 6, 1.0, groups=groups, tails=False,
                                      backend="numpy")
        np.testing.assert_array_equal(lo, ref[0])
        np.testing.assert_array_equal(hi, ref[1])


#: 56 samples in quarters (times 4): their bin moments and clipping costs are
#: exact binary fractions, and two upper edges cost the same to the last bit.
_TIED = [3, 2, 3, -1, 1, 0, 3, 4, -6, 6, -8, -6, 1, -4, -2, 6, -5, 4, 1, -1, 5, -7, -5, 0, 6, 3,
         -5, 0, 6, 1, 0, 1, 3, 8, 2, 3, -7, 4, -2, 0, 6, 3, 7, 3, 1, 1, -5, 5, -2, 4, -3, -5, 0, -4,
         -13, -1]


def test_mse_windows_take_the_first_of_equally_good_edges():
    """Where two edges cost exactly the same, the reference takes the first
    (numpy's argmin): so must the kernel, to stay bit for bit."""
    samples = np.array(_TIED, dtype=np.float64)[:, None] / 4
    lo, hi = calibration.mse_windows(samples, np.zeros(1), 3, 0.0, tails=False, backend="numba")
    ref_lo, ref_hi = calibration.mse_windows(samples, np.zeros(1), 3, 0.0, tails=False,
                                             backend="numpy")
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)


def test_pre_distortion_stops_at_the_references_step(monkeypatch, rng):
    """A continuous mask (no mask levels to round a difference away) and a
    stopping tolerance between two Jacobi steps' largest moves (the map
    contracts ~10x per step on these strong optics): the fast path must stop
    at the reference's step, the first that moves no value by tol or more
    (here the fourth), and give the same mask to the bit."""
    cfg = SMALL.replace({**STRONG, "mask.bits": None, "adc.full_scale": "rms",
                         "outliers.policy": "none"})
    w = rng.standard_normal((48, 40))  # one tile
    optics = quant._optics_map(cfg)
    tiling = quant.Tiling(48, 40, 48, 40)
    t_min = cfg.mask.min_transmission
    rows = quant._per_row(compensation.gain(optics, tiling, t_min, "split", 2), tiling)
    v = w / np.abs(w).max(axis=0)

    def iterate(steps):
        levels = compensation.pre_distort(v, rows, optics, tiling, t_min, "split", tol=0.0,
                                          max_iter=steps)
        return (levels[0] - levels[1]) * (1 - t_min)

    third, fourth = (np.abs(iterate(k + 1) - iterate(k)).max() for k in (2, 3))
    assert fourth < 0.5 * third
    tol = 0.75 * third
    monkeypatch.setattr(compensation, "tolerance", lambda bits, min_transmission: tol)
    fast = optical.program(w, cfg)
    with _numpy_references(monkeypatch):
        reference = optical.program(w, cfg)
    _assert_same(fast, reference)


@pytest.mark.parametrize("steps", [1, 3])
def test_pre_distortion_stopped_by_max_iter_matches_the_references_step(monkeypatch, rng,
                                                                        steps):
    """The other way out of the Jacobi loop (a coverage audit found it
    untested): with a tolerance no step meets, the fast path runs exactly
    ``MAX_ITERATIONS`` steps as the reference does, and gives its mask to
    the bit. ``pre_distort`` binds ``max_iter`` when defined, so both sides
    are set."""
    cfg = SMALL.replace({**STRONG, "mask.bits": None, "adc.full_scale": "rms",
                         "outliers.policy": "none"})
    w = rng.standard_normal((130, 95))
    monkeypatch.setattr(compensation, "MAX_ITERATIONS", steps)
    monkeypatch.setitem(compensation.pre_distort.__kwdefaults__, "max_iter", steps)
    monkeypatch.setattr(compensation, "tolerance", lambda bits, min_transmission: 0.0)
    fast = optical.program(w, cfg)
    with _numpy_references(monkeypatch):
        reference = optical.program(w, cfg)
    _assert_same(fast, reference)
    monkeypatch.setattr(compensation, "MAX_ITERATIONS", steps + 1)
    assert not np.array_equal(optical.program(w, cfg).transmissions, fast.transmissions)


def test_mse_windows_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="backend: 'gpu'"):
        calibration.mse_windows(np.ones((10, 2)), np.zeros(2), 4, backend="gpu")


def _rounding_inputs(rng):
    """Every fp16 boundary: the largest finite value and the overflow
    threshold, normal and subnormal limits, ties at both ends of the
    subnormal range; signed zeros, infinities, NaN; float32 subnormals;
    then random values over many binades."""
    half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    half = half[np.isfinite(half)].astype(np.float32)
    between = np.nextafter(half, np.float32(np.inf), dtype=np.float32)
    steps = np.unique(np.abs(half)).astype(np.float64)
    ties = ((steps[:-1] + steps[1:]) / 2).astype(np.float32)  # exact in float32
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, 65536,
                        2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-26, 1e-45, -1e-45,
                        3.4e38, -3.4e38], dtype=np.float32)
    spread = (rng.standard_normal(200_000) * np.exp(rng.uniform(-30, 30, 200_000)))
    return np.concatenate([half, -half, between, -between, ties, -ties, special,
                           spread.astype(np.float32)])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_round_to_kernels_give_numpys_bits(rng, dtype):
    """The numba kernels (contiguous float32 arrays from 2**14 elements on)
    against the numpy code they replace; exhaustively checked once over all
    2**32 float32 bit patterns (docs/performance.md)."""
    x = _rounding_inputs(rng)
    fast = numerics.round_to(x, dtype)
    with np.errstate(over="ignore"):
        ref = (x.astype(np.float16).astype(np.float32) if dtype == "float16"
               else numerics._round_bfloat16(x))
    assert x.size >= numerics._KERNEL_MIN
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(fast.view(np.uint32)[finite], ref.view(np.uint32)[finite])
    assert np.isnan(fast[~finite]).all()
    matrix = np.asfortranarray(x[:60_000].reshape(300, 200))
    out = numerics.round_to(matrix, dtype)
    assert out.flags.f_contiguous
    np.testing.assert_array_equal(out, numerics.round_to(np.ascontiguousarray(matrix), dtype))
    # In place, on the kernels' path and numpy's (a strided view), NaNs included.
    for a in (x.copy(), x.copy()[::2]):
        expected = numerics.round_to(a, dtype)
        assert numerics.round_to(a, dtype, out=a) is a
        np.testing.assert_array_equal(a.view(np.uint32)[~np.isnan(a)],
                                      expected.view(np.uint32)[~np.isnan(expected)])
        assert np.isnan(a).sum() == np.isnan(expected).sum()
    # Into another array of x's layout (a recycled buffer): the same bits, x untouched.
    for a in (x, matrix, x[::2]):
        before = a.copy()
        # (a strided x takes an out of the same strides)
        out = np.empty_like(a) if a.flags.forc else np.empty(2 * a.size, np.float32)[::2]
        assert numerics.round_to(a, dtype, out=out) is out
        np.testing.assert_array_equal(out, numerics.round_to(a, dtype))
        np.testing.assert_array_equal(a, before)
    for bad in (np.empty_like(x, dtype=np.float64), np.empty(x.size - 1, np.float32),
                np.empty_like(matrix, order="C")):
        target = matrix if bad.ndim == 2 else x
        with pytest.raises(ValueError, match="out: expected x itself or a float32 array"):
            numerics.round_to(target, dtype, out=bad)


def test_every_nan_stays_nan_whatever_its_payload():
    """A NaN whose payload sits only in the low 16 bits (0x7F800001) is
    truncated by bf16's bit arithmetic to inf, and 0xFFFFFFFF wraps to 0:
    on numpy's path (small arrays) and the kernels' alike, every NaN comes
    back NaN and every other value is rounded as usual."""
    payloads = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF, 0x7F80FFFF],
                        dtype=np.uint32).view(np.float32)
    assert np.isnan(payloads).all()
    small = np.concatenate([payloads, np.array([1.0, 3.0e38, -2.5], np.float32)])
    big = np.resize(small, numerics._KERNEL_MIN)
    for dtype in ("float16", "bfloat16"):
        for x in (small, big, big[::2]):
            out = numerics.round_to(x, dtype)
            nan = np.isnan(x)
            assert np.isnan(out[nan]).all(), (dtype, x.size)
            np.testing.assert_array_equal(out[~nan], numerics.round_to(x[~nan].copy(), dtype))


def test_float32_into_a_buffer_is_a_copy_of_x(rng):
    """round_to(x, "float32", out=buf) writes x into buf and returns buf (x
    itself is returned as it is)."""
    x = rng.standard_normal((3, 5)).astype(np.float32)
    buf = np.full_like(x, np.nan)
    assert numerics.round_to(x, "float32", out=buf) is buf
    np.testing.assert_array_equal(buf, x)
    assert numerics.round_to(x, "float32") is x


def test_validate_on_the_fast_paths_matches_the_references(monkeypatch, tmp_path):
    """A whole layer, calibrated on a held-out run, end to end: every
    product of the fast paths equals the numpy references' bit for bit."""
    model = transformer.load(write_model(tmp_path / "tiny", TINY_LLAMA))
    cfg = SMALL.replace({"core.inputs": 32, "core.outputs": 24})
    fast = transformer.validate(model, layer=1, tokens=20, config=cfg, seed=5)
    with _numpy_references(monkeypatch):
        reference = transformer.validate(model, layer=1, tokens=20, config=cfg, seed=5)
    for row, ref_row in zip(fast.products, reference.products, strict=True):
        assert row.sqnr_db == ref_row.sqnr_db, row.name
    assert fast.output.sqnr_db == reference.output.sqnr_db


@pytest.mark.parametrize("n_bins", [1, 4])
@pytest.mark.parametrize("crowded", ["top", "bottom"])
def test_a_zero_width_window_at_either_end(n_bins, crowded):
    """99 readouts at one end of the range, one at the other, 1 bit with 0.9
    bits of ENOB loss: a window closed on the crowded end costs 1 (the lone
    readout clipped), any open one 100 * 4**0.9 / 12 = 29, so the best window
    is lo == hi there, at the top edge as at the bottom one (a kernel that
    could not close the window on the last edge, or on edge 0, passed)."""
    samples = np.array([0.0] + [1.0] * 99 if crowded == "top" else [0.0] * 99 + [1.0])[:, None]
    end = 1.0 if crowded == "top" else 0.0
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(samples, 0.0, 1, 0.9, tails=False, n_bins=n_bins,
                                         backend=backend)
        assert (lo[0], hi[0]) == (end, end), backend


@pytest.mark.parametrize("contrast", [50.0, 11.0])
def test_pruned_weights_and_odd_contrasts_match_the_references_to_the_bit(monkeypatch, rng,
                                                                         contrast):
    """Exact zeros (pruned weights) take pre_distort's `d >= 0` branch, and at
    contrast 11 (also 3, 31, 251, ...) 1 - 1/contrast in float32 differs from
    the float64 value rounded: both to the bit (the other cases have neither)."""
    cfg = SMALL.replace({**STRONG, "optics.kernel_radius": 0, "mask.bits": None,
                         "mask.contrast_ratio": contrast, "adc.full_scale": "rms",
                         "outliers.policy": "none"})
    w = (rng.standard_normal((96, 80)) * 0.02).astype(np.float32)
    w[rng.random(w.shape) < 0.3] = 0.0
    fast = optical.program(w, cfg)
    with _numpy_references(monkeypatch):
        reference = optical.program(w, cfg)
    _assert_same(fast, reference)
