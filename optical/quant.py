"""Programming the mask: what is loaded on the hardware once per weight load.

:func:`program` turns a weight matrix into :class:`ProgrammedWeights`: the
weight scales (per tensor, column, tile or column of each K-tile), the
quantised mask transmissions of every rail (the physical, effective ones that
the light sees, pre-distorted for the optics' envelope and crosstalk if
``mask.compensate``), the weights the digital side believes the light applies,
the ADC window of every column of every K-tile, and -- from calibration inputs
-- a static input range, calibrated ADC windows and the input channels that
bypass the optics. :func:`optical.matmul` streams inputs through it and does
no weight work.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref
from typing import Any

import numpy as np

from optical import _memory, compensation, outliers
from optical import calibration as _calibration
from optical._validation import check_bool, check_float_array, check_plain_array, read_only
from optical.config import OpticalConfig, check_config
from optical.physics import _mask_apply, converters, crosstalk, encoding

__all__ = ["ProgrammedWeights", "Tiling", "adc_rails", "calibration_needs",
           "check_programmable", "program"]

#: Config paths that programming does not depend on: a programmed matrix may
#: be used with configs that differ only in these. Not with calibrated ADC
#: windows (set from DAC-quantised, scaled calibration readouts); not
#: ``dac.scaling`` when either side uses a static input range.
PROGRAM_INDEPENDENT = ("dac.bits", "dac.scaling")

# Mean and variance of one pass's source levels when the normalised input is
# uniform on [-1, 1]: the assumption of the "rms" ADC window.
_UNIFORM_INPUT_MOMENTS = {"offset": (1 / 2, 1 / 12), "split": (1 / 4, 5 / 48)}


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How a (K, N) matrix is cut into core-sized tiles."""

    k: int
    n: int
    tile_k: int
    tile_n: int

    @property
    def k_tiles(self) -> int:
        """Tiles along K (the last may be partial)."""
        return -(-self.k // self.tile_k)

    @property
    def n_tiles(self) -> int:
        """Tiles along N (the last may be partial)."""
        return -(-self.n // self.tile_n)

    def k_slice(self, i: int) -> slice:
        """The rows of K-tile ``i``."""
        return slice(i * self.tile_k, min((i + 1) * self.tile_k, self.k))

    def n_slice(self, i: int) -> slice:
        """The columns of N-tile ``i``."""
        return slice(i * self.tile_n, min((i + 1) * self.tile_n, self.n))


def adc_rails(config: OpticalConfig) -> np.ndarray:
    """How detector rails combine into ADC readouts: a (n_adc, n_detector) matrix.

    Split weights on balanced detectors are subtracted in analogue before one
    ADC; otherwise every detector rail has its own ADC.
    """
    n_det = encoding.n_rails(config.encoding.weights)
    if n_det == 2 and config.detector.balanced:
        return np.array([[1.0, -1.0]])
    return np.eye(n_det)


#: The array fields of :class:`ProgrammedWeights`, read-only once constructed.
_ARRAYS = ("scale", "weights", "weight_sums", "transmissions", "adc_lo", "adc_hi")

#: The arrays program() made, read-only, by id (weakly: an entry goes with its
#: array): a ProgrammedWeights keeps them as they are, in a dataclasses.replace
#: of another field too.
_OWN_ARRAYS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@dataclasses.dataclass(frozen=True, eq=False)
class ProgrammedWeights:
    """A weight matrix as loaded on the mask, with everything derived from it
    once per weight load.

    Attributes
    ----------
    config : OpticalConfig
        The configuration it was programmed for.
    tiling : Tiling
    scale : ndarray, shape (k_tiles, N)
        Weight scale of every column of every K-tile: the rows of K-tile ``i``
        hold ``w[rows, n] ~ scale[i, n] * weights[rows, n]``. Restored
        digitally before the K-tiles' partial sums are added. It is 0 where
        every weight sharing it is zero (``mask.scaling``: the whole tensor,
        the column, the tile, or with "per_tile_column" the column within the
        K-tile), and those readouts (noise alone) are then dropped; under
        the other scalings a column zero in one K-tile only keeps its
        scale and its readouts' noise.
    weights : ndarray, shape (K, N)
        Normalised, quantised weights in [-1, 1] as the digital side believes
        they are programmed (used to undo the encoding); with
        ``mask.compensate``, the effective weights the light applies.
    weight_sums : ndarray, shape (k_tiles, N)
        Column sums of ``weights`` over each K-tile.
    transmissions : ndarray, shape (rails, K, N)
        Physical transmission of each mask rail as the light sees it.
    adc_lo, adc_hi : ndarray, shape (k_tiles, adc_rails, N)
        ADC window of every column of every K-tile, in units of full-scale
        MACs (photoelectrons divided by ``photons_per_mac``).
    input_range : float or None
        A static input full scale (e.g. from calibration): inputs are divided
        by it and clipped to [-1, 1]. ``None``: ``dac.scaling`` decides
        (dynamic abs-max).
    bypass : optical.outliers.DigitalBypass or None
        Input channels multiplied digitally (``outliers.policy``). With a
        static bypass the mask holds only the other rows: ``tiling`` and the
        arrays above describe those, ``shape`` the whole matrix.

    The arrays are read-only (from :func:`program`, ``dataclasses.replace``,
    pickle or ``copy.deepcopy`` alike): the fast backends derive their plans
    from them once and find them again by identity. To try other values
    (windows, say), ``dataclasses.replace`` the field with a new array (an
    array given is made read-only in place; a view of a writeable array is
    copied first, as is a read-only view of a writeable array): the kinds
    (plain ndarrays, the weights' float dtype, native byte order: TypeError)
    and shapes of every array, and the windows' and input range's values
    (finite, ``adc_lo <= adc_hi``, a positive range), are checked on
    construction, so every backend refuses the same bad values (ValueError
    naming the field).
    """

    config: OpticalConfig
    tiling: Tiling
    scale: np.ndarray
    weights: np.ndarray
    weight_sums: np.ndarray
    transmissions: np.ndarray
    adc_lo: np.ndarray
    adc_hi: np.ndarray
    input_range: float | None = None
    bypass: outliers.DigitalBypass | None = None

    def __post_init__(self) -> None:
        dtype = getattr(self.weights, "dtype", None)
        for name in _ARRAYS:
            got = getattr(self, name)
            if not isinstance(got, np.ndarray):
                raise TypeError(f"{name}: expected a numpy.ndarray, got {type(got).__name__}")
            check_plain_array(got, name)  # a masked array's NaN would pass the checks below
            if got.dtype not in (np.float32, np.float64) or not got.dtype.isnative:
                raise TypeError(f"{name}: expected float32 or float64 in native byte order, "
                                f"got {got.dtype} ({got.dtype.str})")
            if got.dtype != dtype:
                raise TypeError(f"{name}: {got.dtype}, but weights are {dtype}: every array "
                                "of one ProgrammedWeights has the weights' dtype")
        for name in _ARRAYS:  # replaced or unpickled arrays too (class docstring)
            got = getattr(self, name)
            if _OWN_ARRAYS.get(id(got)) is not got:  # (program()'s own: as they are)
                object.__setattr__(self, name, read_only(got))
        t = self.tiling
        core = (self.config.core.inputs, self.config.core.outputs)
        if not isinstance(t, Tiling):
            raise TypeError(f"tiling: expected a Tiling, got {type(t).__name__}")
        if (t.tile_k, t.tile_n) != core:
            # The kernels cut the matrix by the tiling and plan by the config:
            # the two must agree (another tiling read other tiles, or others
            # than a cached plan's).
            raise ValueError(f"tiling: expected a Tiling of the config's core {core[0]} x "
                             f"{core[1]} (tile_k, tile_n), got {t!r}")
        n_rails = adc_rails(self.config).shape[0]
        expected = {"scale": (t.k_tiles, t.n), "weights": (t.k, t.n),
                    "weight_sums": (t.k_tiles, t.n), "adc_lo": (t.k_tiles, n_rails, t.n),
                    "adc_hi": (t.k_tiles, n_rails, t.n)}
        for name, shape in expected.items():
            got = getattr(self, name)
            if not isinstance(got, np.ndarray) or got.shape != shape:
                raise ValueError(f"{name}: expected an array of shape {shape}, got "
                                 f"{getattr(got, 'shape', type(got).__name__)}")
        trans = self.transmissions
        rails = encoding.n_rails(self.config.encoding.weights)  # the kernels read this many
        if not isinstance(trans, np.ndarray) or trans.shape != (rails, t.k, t.n):
            raise ValueError(f"transmissions: expected an array of shape ({rails}, {t.k}, {t.n}) "
                             f"(encoding.weights = {self.config.encoding.weights!r}: {rails} "
                             f"rail(s)), got {getattr(trans, 'shape', type(trans).__name__)}")
        lo, hi = self.adc_lo, self.adc_hi
        for name, ends in (("adc_lo", lo), ("adc_hi", hi)):
            if ends.dtype.kind != "f" or not np.isfinite(ends).all():
                raise ValueError(f"{name}: expected finite float window ends")
        if np.any(lo > hi):
            first = np.unravel_index(np.argmax(lo > hi), lo.shape)
            raise ValueError(f"adc_lo, adc_hi: every ADC window needs adc_lo <= adc_hi; got "
                             f"{lo[first]} > {hi[first]} at (k_tile, rail, column) {first}")
        r = self.input_range
        if r is not None and (isinstance(r, bool) or not isinstance(r, numbers.Real)
                              or not 0 < r < math.inf):
            raise ValueError(f"input_range: {r!r} is not valid; valid: None (dynamic, "
                             "dac.scaling) or a finite number > 0")
        if r is not None:
            with np.errstate(over="ignore", under="ignore"):
                as_dtype = self.weights.dtype.type(r)  # the matmul divides in this dtype
            if not 0 < as_dtype < np.inf:
                raise ValueError(f"input_range: {r!r} is {as_dtype} in the weights' dtype "
                                 f"{self.weights.dtype} (calibration inputs of a wider dtype "
                                 "than the weights?); give calibration inputs within its range")

    def __reduce__(self) -> tuple[Any, ...]:
        # Through the constructor: a pickled or deep-copied copy is checked and
        # read-only as the original (pickle's default restores a writeable
        # __dict__ behind __post_init__'s back).
        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    def __repr__(self) -> str:  # not the arrays: a summary fit for an error message
        bypass = "" if self.bypass is None else ", bypass"
        return (f"ProgrammedWeights(shape={self.shape}, dtype={self.dtype}, "
                f"tiles={self.tiling.k_tiles}x{self.tiling.n_tiles}{bypass})")

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the whole weight matrix, bypassed rows included."""
        return (self.bypass.k if self.bypass is not None else self.tiling.k, self.tiling.n)

    @property
    def dtype(self) -> np.dtype:
        """The working dtype (float32 or float64): the weights' as given."""
        return self.weights.dtype

    def check_compatible(self, config: OpticalConfig) -> None:
        """Raise ValueError if ``config`` differs from the programming config in
        any path but the free ones (:data:`PROGRAM_INDEPENDENT` where the
        windows and range allow, and ``energy.*``), naming the differing
        paths. Paths that programming does not read are refused too: it errs
        on the side of re-programming."""
        free = set(PROGRAM_INDEPENDENT)
        static = "static" in (self.config.dac.scaling, config.dac.scaling)
        if self.config.adc.full_scale == "calibrated":
            free.clear()
        elif static:
            free.discard("dac.scaling")
        if not static:
            free.add("dac.percentile")
        # The energy section prices the machine; it does not change the arithmetic.
        differing = [p for p in self.config.diff(config)
                     if p not in free and not p.startswith("energy.")]
        if differing:
            raise ValueError(
                "programmed weights do not match this config (re-program them): "
                + ", ".join(f"{p} = {self.config.get(p)!r} when programmed, "
                            f"{config.get(p)!r} now" for p in differing)
            )


def _load(w: np.ndarray, rows: np.ndarray | None, tiling: Tiling,
          policy: str) -> tuple[np.ndarray, np.ndarray]:
    """The weight scale (k_tiles, N) and the normalised weights ``v`` (K, N)
    of the mask rows ``rows`` of ``w`` (all if None). The scale is the
    abs-max of every column of every K-tile under ``policy`` (per K-tile and
    column; per tile: the max over the tile's columns; per column or per
    tensor: over all K), 0 for an all-zero column (divided by 1, its readout
    multiplied by 0: an exact 0); ``v`` is ``w[rows] / where(scale > 0,
    scale, 1)`` tile by tile. Computed in numba
    kernels that gather the rows and read ``w`` in place, row-major or
    transposed (a weight stored [out, in] and passed as its ``.T``), so
    that neither the gathered nor the transposed matrix is ever copied."""
    from optical.kernels import _program

    dtype = w.dtype
    rows = np.arange(w.shape[0], dtype=np.int64) if rows is None else rows.astype(np.int64)
    k_bounds = np.array([(s.start, s.stop) for s in map(tiling.k_slice, range(tiling.k_tiles))],
                        dtype=np.int64)
    transposed = w.flags.f_contiguous and not w.flags.c_contiguous
    src = w.T if transposed else np.ascontiguousarray(w)
    per = np.empty((tiling.k_tiles, tiling.n), dtype=dtype)
    (_program.absmax_t if transposed else _program.absmax_c)(src, rows, k_bounds, per)
    if policy in ("per_column", "per_tensor"):
        per = per.max(axis=0, keepdims=True)
        if policy == "per_tensor":
            per = np.full_like(per, per.max())
        per = np.repeat(per, tiling.k_tiles, axis=0)
    elif policy == "per_tile":
        for j in range(tiling.n_tiles):
            ns = tiling.n_slice(j)
            per[:, ns] = per[:, ns].max(axis=1, keepdims=True)
    divisor = np.where(per > 0, per, 1).astype(dtype)
    v = _memory.empty((rows.size, tiling.n), dtype)
    tile_of_row = np.repeat(np.arange(tiling.k_tiles, dtype=np.int64),
                            k_bounds[:, 1] - k_bounds[:, 0])
    (_program.divide_t if transposed else _program.divide_c)(src, rows, tile_of_row, divisor, v)
    return per.astype(dtype, copy=False), v


def _per_row(values: np.ndarray, tiling: Tiling) -> np.ndarray:
    """A (k_tiles, N) field expanded to the (K, N) rows of its K-tiles."""
    return np.repeat(values, [tiling.k_slice(i).stop - tiling.k_slice(i).start
                              for i in range(tiling.k_tiles)], axis=0)


def _optics_map(config: OpticalConfig) -> _LensOptics | None:
    """The envelope and crosstalk of the configured optics -- an object with
    ``apply(t, tiling)`` and ``diagonal(tiling)`` (see
    :mod:`optical.compensation`) -- or ``None`` for ideal optics (each source
    lights exactly its row, each column reaches exactly its detector)."""
    kern = crosstalk.kernels(config)
    return None if kern.ideal else _LensOptics(config, kern)


@dataclasses.dataclass(frozen=True, eq=False)
class _LensOptics:
    """The lens physics (:mod:`optical.physics.crosstalk`) as the forward map
    that compensation inverts."""

    config: OpticalConfig
    kernels: crosstalk.Kernels

    def apply(self, t: np.ndarray, tiling: Tiling) -> np.ndarray:
        return crosstalk.effective_transmissions(t, tiling, self.config)

    def leak_parts(self, tiling: Tiling) -> tuple[np.ndarray, np.ndarray]:
        """The light neighbours put on each pixel of an open mask through the
        coupling's positive terms and (as a magnitude) its negative ones, each
        shape (rails, K, N) per unit of full transmission, the pixel's own
        light left out (see :func:`optical.compensation.gain`). The iris-like
        relay has negative interference terms between neighbouring columns
        (``M[0, +-1] < 0``): an open mask is then not the pattern that leaks
        the most."""
        kern = self.kernels
        mutual = np.real(kern.output_mutual)
        coupling = np.abs(kern.input_coupling)  # intensities: >= 0 up to rounding
        open_mask = np.ones((kern.rails, tiling.k, tiling.n))

        def lit(part: np.ndarray) -> np.ndarray:
            terms = dataclasses.replace(kern, input_coupling=coupling,
                                        output_mutual=part.astype(kern.output_mutual.dtype))
            return _mask_apply.apply_tiled(open_mask, terms, tiling)

        positive = np.maximum(lit(np.maximum(mutual, 0.0)) - self.diagonal(tiling), 0.0)
        # (M's centre is positive: without negative terms there is nothing to apply)
        negative = lit(np.maximum(-mutual, 0.0)) if np.any(mutual < 0) else np.zeros_like(positive)
        return positive, negative

    def diagonal(self, tiling: Tiling) -> np.ndarray:
        """Each pixel's self-coupling, shape (rails, 1, N): the centre of the
        input kernel, times the centre of the output mutual intensity, times
        the illumination of the pixel's physical column (rails interleaved,
        every tile placed from the core's first output)."""
        kern = self.kernels
        centre = kern.radius
        own = kern.input_coupling[centre] * np.real(kern.output_mutual[centre, centre])
        local = np.concatenate([np.arange(s.stop - s.start)
                                for s in map(tiling.n_slice, range(tiling.n_tiles))])
        columns = kern.rails * local[None, :] + np.arange(kern.rails)[:, None]
        return (own * kern.envelope[columns])[:, None, :]


def _mask(v: np.ndarray, tiling: Tiling,
          config: OpticalConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Physical transmissions (rails, K, N) of normalised weights ``v``, the
    weights the digital side believes the light applies, and the gain per
    (K-tile, column) that compensation divided the weights by (or None).

    The lens physics takes the fused numba kernels of
    :mod:`optical.kernels._program` (the same arithmetic, tile by tile); any
    other optics the numpy code below, which those kernels reproduce."""
    t_min = config.mask.min_transmission
    scheme = config.encoding.weights
    optics = _optics_map(config)
    compensate = optics is not None and config.mask.compensate
    gain = _gain(optics, tiling, config) if compensate else None
    if isinstance(optics, _LensOptics):
        from optical.kernels import _program

        transmissions, weights, _ = _program.lens_mask(
            v, None if gain is None else gain.astype(v.dtype),
            None if gain is None else optics.diagonal(tiling), tiling, optics.kernels, t_min,
            scheme, config.mask.bits, tol=compensation.tolerance(config.mask.bits, t_min),
            max_iter=compensation.MAX_ITERATIONS)
        return transmissions, weights, gain
    if not compensate:
        levels = converters.quantize_levels(encoding.encode(v, scheme), config.mask.bits)
        transmissions = converters.transmission(levels, t_min)
        if optics is not None:  # uncompensated: the digital side is unaware of the optics
            transmissions = optics.apply(transmissions, tiling)
        return transmissions, encoding.decode(levels, scheme), None
    levels = converters.quantize_levels(compensation.pre_distort(
        v, _per_row(gain.astype(v.dtype), tiling), optics, tiling, t_min, scheme,
        tol=compensation.tolerance(config.mask.bits, t_min)), config.mask.bits)
    transmissions = optics.apply(converters.transmission(levels, t_min), tiling)
    # The light applies the effective tile: the digital side knows it exactly.
    weights = encoding.decode((transmissions - t_min) / (1 - t_min), scheme)
    return transmissions, weights, gain


def calibration_needs(config: OpticalConfig) -> list[str]:
    """The settings of ``config`` that need calibration inputs when weights are
    programmed (``"adc.full_scale = 'calibrated'"``, ...); empty if none does."""
    return [f"{path} = {config.get(path)!r}" for path, value in
            (("dac.scaling", "static"), ("adc.full_scale", "calibrated"),
             ("outliers.policy", "static")) if config.get(path) == value]


def _calibration_inputs(calibration: object, k: int, config: OpticalConfig) -> np.ndarray | None:
    needs = calibration_needs(config)
    if calibration is None:
        if needs:
            raise ValueError(f"{' and '.join(needs)} needs calibration inputs: program the "
                             "weights with optical.program(w, config, calibration=x) and pass "
                             "the result to optical.matmul")
        return None
    cal = _calibration.check_inputs(calibration, k)
    signal = cal.any(axis=1)  # all-zero rows (padding) carry none: left out
    # (an all-zero set is kept whole, for program's refusal by name)
    return cal[signal] if signal.any() and not signal.all() else cal


def check_programmable(k: int, n: int, config: OpticalConfig) -> None:
    """The refusals of :func:`program` that the shape ``(k, n)`` and
    ``config`` decide before any weight or calibration input is seen:
    optics the lens model cannot build (a pixel pitch at or below the
    wavelength, say), compensation with no gain left in a tile, and static
    or dynamic outlier channels that take every input channel (``top_k >=
    k`` without a threshold). The gain is checked on the fewest rows static
    outliers could leave on the mask (``k - top_k``; one, by a threshold
    alone): a point is not refused for rows its calibration inputs might
    take off the mask. A sweep runs these for every point before its first
    run.

    Raises
    ------
    ValueError
        Naming the setting, as :func:`program` would.
    """
    check_config(config)
    rules = config.outliers
    rows = k  # the fewest rows static outliers can leave on the mask
    if _rank_takes_every_channel(config, k):
        raise ValueError(_all_channels_digital(config, k))
    if rules.policy == "static":
        # top_k channels at most (exactly, without a threshold); a threshold
        # alone could take all but one
        rows = k - rules.top_k if rules.top_k is not None and rules.top_k < k else 1
    optics = _optics_map(config)  # builds the lens kernels (checks their geometry)
    if optics is not None and config.mask.compensate:
        # Fewer rows, fewer neighbours to leak light: the gain on the fewest
        # rows is the most any calibration could leave.
        _gain(optics, Tiling(rows, n, config.core.inputs, config.core.outputs), config)


def _gain(optics, tiling: Tiling, config: OpticalConfig) -> np.ndarray:
    """:func:`optical.compensation.gain` of ``config``'s mask on ``tiling``."""
    scheme = config.encoding.weights
    return compensation.gain(optics, tiling, config.mask.min_transmission, scheme,
                             encoding.n_rails(scheme))


def _rank_takes_every_channel(config: OpticalConfig, k: int) -> bool:
    """Whether an outlier policy's rank alone (``top_k >= k``, no threshold)
    sends all ``k`` input channels to the digital side, whatever the inputs."""
    rules = config.outliers
    return rules.policy != "none" and rules.threshold is None and rules.top_k is not None \
        and rules.top_k >= k


def _all_channels_digital(config: OpticalConfig, k: int) -> str:
    return (f"outliers: outliers.threshold = {config.outliers.threshold}, outliers.top_k = "
            f"{config.outliers.top_k} send all {k} input channels to the digital side; "
            "nothing is left for the mask")


def program(w: np.ndarray, config: OpticalConfig, *,
            calibration: np.ndarray | None = None, oracle: bool = False) -> ProgrammedWeights:
    """Program a weight matrix onto the mask.

    Parameters
    ----------
    w : ndarray, shape (K, N), float32 or float64
        The weights, ``y = x @ w``.
    config : OpticalConfig
    calibration : ndarray, shape (..., K), float32 or float64, optional
        Representative inputs. Needed by a static input range
        (``dac.scaling = "static"``), calibrated ADC windows
        (``adc.full_scale = "calibrated"``) and static outlier channels
        (``outliers.policy = "static"``); otherwise checked (width, values)
        but unused. Nothing depends on a noise seed. Rows that are all zero
        (padding) are left out of every statistic: they carry no signal, and
        kept they narrowed a static range's percentile and pulled calibrated
        windows toward zero (1024 zero rows beside 128 real ones: 31.2 ->
        28.6 dB, clipping 0.03 -> 0.57 %).
    oracle : bool
        True when ``calibration`` is the very inputs the weights will then
        multiply (the oracle, as :func:`optical.matmul` calibrates raw
        weights). Calibrated ADC windows that collapse to points because the
        rows are all one row (a single row) are then exact for that input and
        kept; from held-out rows (False, the default) they would read every
        other input as that row without counting a clip, and are refused.

    Returns
    -------
    ProgrammedWeights

    Raises
    ------
    TypeError
        ``config`` not an OpticalConfig; ``w`` or the calibration inputs not
        a float32/float64 numpy array.
    ValueError
        Bad ``w`` or calibration inputs (wrong width, empty, NaN), calibration
        inputs that are all zero (an all-zero ``w`` is fine: its outputs are
        0), calibration inputs missing where the config needs them, an outlier
        rule that leaves no channel on the mask, or one that leaves only
        all-zero channels there to fit a static range or calibrated windows to,
        and calibrated windows collapsed to a point on a readout that varies
        because the calibration rows used are all one row (a single row, on a
        config whose noise does not widen them; under ``oracle`` only where
        ``calibration.max_tokens`` subsampled several to one). Where only a
        K-tile is constant in them at the DAC's levels (dark or within half a
        step of it, a bias column), its point windows
        are widened upward by 1e-5 of the readout's span (and, in float32,
        downward by a readout's rounding): the constant reads to its
        rounding, a shift from it counts as clipping.
    """
    check_config(config)
    oracle = check_bool(oracle, "oracle")
    w = check_float_array(w, "w", ndim=2)
    if 0 in w.shape:
        raise ValueError(f"w: shape {w.shape} has an empty dimension")
    cal = _calibration_inputs(calibration, w.shape[0], config)
    bypass = rows = None
    optical_cal = None  # the calibration inputs of the channels the optics carry
    if config.outliers.policy == "static":
        channels = outliers.select_channels(outliers.channel_magnitude(cal), config.outliers)
        if channels.size == w.shape[0]:
            raise ValueError(_all_channels_digital(config, w.shape[0]))
        bypass = outliers.DigitalBypass.static(w, channels)
        rows = bypass.optical_channels
        cal = cal[:, bypass.optical_channels]
    elif config.outliers.policy == "dynamic":
        if _rank_takes_every_channel(config, w.shape[0]):
            # Every call's every channel: an exact digital matmul scored as optical.
            raise ValueError(_all_channels_digital(config, w.shape[0]))
        bypass = outliers.DigitalBypass.dynamic(w)
        if cal is not None:
            # Zeroed, as a call zeroes them on the mask (the readout windows
            # see their light); excluded from the static input range, as the
            # static bypass's rows are.
            selected = outliers.select_channels(outliers.channel_magnitude(cal), config.outliers)
            optical_cal = np.delete(cal, selected, axis=1)
            cal = cal.copy()
            cal[:, selected] = 0
    fitted = config.dac.scaling == "static" or config.adc.full_scale == "calibrated"
    if fitted and cal is not None and not (cal if optical_cal is None else optical_cal).any():
        raise ValueError("calibration: every channel left on the optics is zero (its nonzero "
                         "channels bypass the optics as outliers), so the input range and ADC "
                         "windows have nothing to fit; give calibration inputs with signal on "
                         "the optical channels, or raise outliers.threshold / lower "
                         "outliers.top_k")
    tiling = Tiling(w.shape[0] if rows is None else rows.size, w.shape[1], config.core.inputs,
                    config.core.outputs)
    scale, v = _load(w, rows, tiling, config.mask.scaling)
    transmissions, weights, gain = _mask(v, tiling, config)
    if gain is not None:
        scale = (scale / gain).astype(w.dtype)
    weight_sums = np.stack([weights[tiling.k_slice(i)].sum(axis=0)
                            for i in range(tiling.k_tiles)])
    static_range = None
    if config.dac.scaling == "static":
        static_range = _calibration.input_range(cal if optical_cal is None else optical_cal,
                                                config.dac.percentile)
    if config.adc.full_scale == "calibrated":
        xn = _calibration.normalise(_calibration.subsample(cal, config.calibration.max_tokens),
                                    config, static_range, tensor_absmax=float(np.max(np.abs(cal))))
        lo, hi = _calibration.readout_windows(xn, transmissions, tiling, adc_rails(config),
                                              config)
        lo, hi = _point_windows(lo, hi, transmissions, tiling, config, xn,
                                rows=cal.shape[0], oracle=oracle)
    else:
        lo, hi = _adc_windows(transmissions, tiling, config)
    if config.adc.window == "per_tile":  # (after the widening: one window a tile again)
        lo, hi = _share_windows(lo, hi, tiling)
    for array in (scale, weights, weight_sums, transmissions, lo, hi):
        # Read-only in place (the fast backends cache by identity): these are
        # program()'s own, views included (of the engines' recycled buffers,
        # which hand a buffer out again only once no view holds it): kept as
        # they are, where a read-only view of another's writeable array is
        # copied (2.6 GB of copies for a Llama-3.1-8B layer otherwise).
        array.flags.writeable = False
        _OWN_ARRAYS[id(array)] = array
    return ProgrammedWeights(config, tiling, scale, weights, weight_sums, transmissions, lo, hi,
                             input_range=static_range, bypass=bypass)


#: A calibrated window narrower than this fraction of its readout's span (the
#: noise-free range, "max"'s window) holds one calibration value, to rounding;
#: such a window on a K-tile the calibration holds constant is given this
#: width above its value.
_COLLAPSED = 1e-5


def _point_windows(lo: np.ndarray, hi: np.ndarray, transmissions: np.ndarray,
                   tiling: Tiling, config: OpticalConfig, xn: np.ndarray, *,
                   rows: int, oracle: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` with the calibrated windows that collapsed to a point, on
    readouts that vary with the input, widened: upward by ``_COLLAPSED`` of
    the readout's noise-free span, and downward by the rounding of a readout
    in the programmed dtype (``k eps`` of the light the ADC rail sees, over
    the K-tile's ``k`` inputs) where that could pass half an ADC step
    (float32, as a rule: float64 keeps the value as the low end); or
    ValueError where every calibration row used is one row.

    Such windows come from a K-tile the calibration rows ``xn`` (normalised;
    ``calibration.max_tokens`` of the ``rows`` given) hold constant at the
    DAC's levels (:func:`_one_row`): dark, or within half a DAC step of dark, a
    bias column, scaled copies of one row, or a single row. Read as a point,
    the ADC gave that one value whatever came and counted nothing clipped (a 40
    x 11 product programmed from one noise-free row: relative error 1.37,
    clipping 0; a tile dark in 256 rows and lit at run time: 0.57, clipping
    ~0). Widened, the constant still reads to its dtype's rounding (exactly,
    code 0, where the low end stays) and a shift from it is counted as
    clipping; the margin below keeps the constant computed in another order
    from counting (float32 readouts an ulp under a low end that was the value:
    0.3 of a one-token product's conversions counted clipped on the numpy
    backend). A single row gives nothing to programme from but itself: refused,
    unless ``oracle`` (the very input to be multiplied, which reads exactly)
    and no subsample made it one of several. Kept as they are: points on
    readouts with no light to vary (zero weights on balanced rails) and points
    fitted to varied rows that drown in noise (the least-squares window there).
    Only windows far narrower than the widest, or than their own ends, are
    examined (none, as a rule)."""
    width = hi.astype(np.float64) - lo
    near = np.maximum(np.maximum(np.abs(lo), np.abs(hi)), width.max())
    candidates = np.argwhere(width <= _COLLAPSED * near)  # (K-tile, ADC rail, column)
    if candidates.size == 0:
        return lo, hi
    rails = adc_rails(config)
    constant = {i: _one_row(xn[:, tiling.k_slice(i)], config)
                for i in {int(c[0]) for c in candidates}}
    points = []
    for i, e, n in candidates:
        if not constant[int(i)]:
            continue
        t = transmissions[:, tiling.k_slice(i), n]
        span = float(np.abs(rails[e] @ t).sum())
        if span > 0 and width[i, e, n] <= _COLLAPSED * span:
            light = float(np.abs(rails[e]) @ np.abs(t).sum(axis=1))
            points.append((i, e, n, span, light, t.shape[1]))
    if not points:
        return lo, hi
    subsampled = xn.shape[0] < rows
    if _one_row(xn, config) and (subsampled or not oracle):
        if subsampled:
            why = (f"calibration.max_tokens = {config.calibration.max_tokens} kept "
                   f"{xn.shape[0]} of the {rows} calibration rows, all one row once "
                   "normalised; raise it")
        else:
            why = (("there is one calibration row" if rows == 1 else
                    f"the {rows} calibration rows are all one row once normalised")
                   + "; give rows that vary (held-out tokens: validate's calibration_tokens, "
                   "encode's calibration_ids), or use adc.full_scale 'max' or 'rms'")
        raise ValueError(
            f"calibration: {len(points)} of {lo.size} calibrated ADC windows collapsed to a "
            "point, each holding its readout of that one row, so the ADC would read it "
            f"whatever the input, without counting a clip: {why}")
    lo, hi = lo.copy(), hi.copy()
    eps = float(np.finfo(transmissions.dtype).eps)
    top = max(converters.top_code(config.adc.bits), 1)
    for i, e, n, span, light, k in points:
        value, rounding = float(lo[i, e, n]), k * eps * light
        hi[i, e, n] = value + _COLLAPSED * span
        # A readout within half a step under the low end reads code 0 uncounted.
        if rounding >= 0.5 * _COLLAPSED * span / top:
            lo[i, e, n] = value - rounding
    return lo, hi


def _one_row(xn: np.ndarray, config: OpticalConfig) -> bool:
    """Whether the normalised rows ``xn`` drive the sources with one row's
    levels: every DAC level of every rail within ``_COLLAPSED`` (of full
    scale) of the first row's, so their readouts agree to ``_COLLAPSED`` of
    the readout's span. Not ``xn`` itself: rows under half a DAC step from
    dark, or a row and its copy scaled by 3 (an ulp apart once normalised
    per token), differed there, and their point windows were neither
    widened nor refused (an audit: relative error 0.6-1.5, nothing counted
    clipped)."""
    levels = converters.quantize_levels(encoding.encode(xn, config.encoding.inputs),
                                        config.dac.bits)
    return bool(np.all(np.abs(levels - levels[:, :1]) <= _COLLAPSED))


def _share_windows(lo: np.ndarray, hi: np.ndarray,
                   tiling: Tiling) -> tuple[np.ndarray, np.ndarray]:
    """One window per tile: the union of its columns' windows."""
    lo, hi = lo.copy(), hi.copy()
    for j in range(tiling.n_tiles):
        ns = tiling.n_slice(j)
        lo[..., ns] = lo[..., ns].min(axis=-1, keepdims=True)
        hi[..., ns] = hi[..., ns].max(axis=-1, keepdims=True)
    return lo, hi


def _adc_windows(transmissions: np.ndarray, tiling: Tiling,
                 config: OpticalConfig) -> tuple[np.ndarray, np.ndarray]:
    """ADC window per (K-tile, ADC rail, column), in full-scale-MAC units."""
    g = adc_rails(config)
    p = config.source.photons_per_mac
    mean_a, var_a = _UNIFORM_INPUT_MOMENTS[config.encoding.inputs]
    lo = np.empty((tiling.k_tiles, g.shape[0], tiling.n), dtype=transmissions.dtype)
    hi = np.empty_like(lo)
    for i in range(tiling.k_tiles):
        t = transmissions[:, tiling.k_slice(i)].astype(np.float64)  # (rails, k, N)
        combined = np.einsum("er,rkn->ekn", g, t)
        floor = np.minimum(combined, 0).sum(axis=1)
        ceiling = np.maximum(combined, 0).sum(axis=1)
        if config.adc.full_scale == "max":
            lo[i], hi[i] = floor, ceiling
            continue
        mean = mean_a * combined.sum(axis=1)
        square = np.square(combined).sum(axis=1)
        signal_var = var_a * square
        noise_var = config.source.rin_sigma ** 2 * (var_a + mean_a ** 2) * square
        if math.isfinite(p):
            detected = mean_a * t.sum(axis=1)  # (rails, N)
            noise_var += (np.square(g) @ detected) / p
            det = config.detector
            noise_var += np.square(g).sum(axis=1)[:, None] * det.dark_electrons / (p * p)
            noise_var += det.read_noise_electrons ** 2 / (p * p)
        # The window covers the signal's spread plus the noise; the signal part
        # never needs more than the noise-free extremes, the noise part may.
        half = config.adc.headroom * np.sqrt(signal_var + noise_var)
        noise_half = config.adc.headroom * np.sqrt(noise_var)
        window_lo = np.maximum(mean - half, floor - noise_half)
        window_hi = np.minimum(mean + half, ceiling + noise_half)
        top = float(np.finfo(lo.dtype).max)
        if not (np.all(np.abs(window_lo) <= top) and np.all(np.abs(window_hi) <= top)):
            raise ValueError(
                f"adc.full_scale 'rms': the noise makes a window wider than {lo.dtype} holds "
                f"(read noise {config.detector.read_noise_electrons:g} electrons over "
                f"{p:g} photons per MAC, headroom {config.adc.headroom:g}: a readout "
                f"deviation of {float(np.max(noise_half)):.3g} full-scale MACs); raise "
                "source.photons_per_mac, lower the detector noise, or compute in float64")
        lo[i], hi[i] = window_lo, window_hi
    return lo, hi
