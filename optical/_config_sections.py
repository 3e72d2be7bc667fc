"""The sections of an :class:`~optical.config.OpticalConfig`: one frozen
dataclass per part of the machine (sources, DAC, mask, optics, detectors, ADC,
encoding, core, mapping, outliers, calibration, energy), each field built
with its kind, range, default and unit (:mod:`optical._config_fields`).

Import them from :mod:`optical.config`, their public home; this module only
keeps that one readable. Units are SI (m, s, Hz, W, J) or counts (photons,
electrons); each field's docstring entry gives its unit after the type.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from optical._config_fields import Section, boolean, choice, integer, real
from optical.physics import noise

MAX_BITS = 24
#: Largest finite ``source.photons_per_mac``; ``inf`` means no shot noise.
MAX_FINITE_PHOTONS_PER_MAC = 1e30
#: Smallest ``source.photons_per_mac``: below, the read and dark noise in
#: full-scale units (``~ 1 / photons_per_mac**2``) overflow float32 at
#: ~1e-40 and float64 (``p * p`` underflows to 0) at ~1e-162.
MIN_PHOTONS_PER_MAC = 1e-30


@dataclasses.dataclass(frozen=True)
class SourceConfig(Section):
    """The light sources that encode the input vector as intensity.

    Attributes
    ----------
    wavelength : float, m
        Vacuum wavelength of the sources (default 850 nm, the near-infrared
        VCSELs of ideal and iris-like; wang-2022's is 532 nm). It sets the
        lens optics' diffraction and each photon's energy.
    photons_per_mac : float, photons
        Mean *detected* photons per multiply-accumulate at full-scale input and
        full transmission: a detector readout of ``k`` MACs at inputs ``a``
        and transmissions ``t`` collects ``photons_per_mac * sum(a * t)``
        photoelectrons on average, so the light follows the inputs, as at a
        fixed source power. (Papers that quote photons per multiplication
        averaged over the data, as Wang et al., Nat. Commun. 13, 123, 2022,
        do, mean ``photons_per_mac * mean(a)`` at full transmission: divide
        their figure by the inputs' mean fill to get this one.) ``inf`` is
        the shot-noise-free limit, and removes dark and read noise too
        (fixed electron counts against an infinite signal): to see shot
        noise alone, keep the photons finite
        and set ``detector.dark_electrons`` and ``read_noise_electrons`` to 0
        (the read noise's share is then the difference it makes;
        ``examples/noise_budget.py`` does this for every source). Finite
        values are at most ``1e30`` (beyond, photon counts overflow float64)
        and at least ``1e-30`` (below, the read and dark noise in full-scale
        units, which grow as ``1 / photons_per_mac**2``, overflow float32 and
        float64).
    rin_db_per_hz : float, dB/Hz
        Relative intensity noise of each source; ``-inf`` for none.
    rin_bandwidth : float, Hz
        Detection bandwidth over which the RIN density is integrated: the
        relative intensity fluctuation has variance ``10**(rin/10) * bandwidth``
        (sigma**2; a fluctuation below -1 leaves the source dark, so near the
        limit sigma = 1 the light's spread is less and its mean more: the
        intensity is ``max(1 + sigma z, 0)`` times its level, whose mean,
        ``Phi(1/sigma) + sigma phi(1/sigma)``, is 1.083 at sigma = 1 and 1.004
        at 0.5, a gain the decoder does not undo, and whose variance is 0.75
        sigma**2 at sigma = 1). Set it to the
        readout rate, as :func:`optical.physics.noise.tia_noise_electrons`
        takes its bandwidth: 3 dB of variance above an integrate-and-dump
        window's ``1 / (2 tau)``, against which the Poisson shot noise is
        exact. Each source draws its own fluctuation (independent lasers; a
        shared laser split over modulators would make it common to all).
        Neither this nor the detector's electron counts follow
        ``energy.input_rate``: a sweep of the rate alone changes time and
        energy, not noise.
    """

    _name: ClassVar[str] = "source"
    wavelength: float = real(850e-9, 100e-9, 100e-6)
    photons_per_mac: float = real(math.inf, MIN_PHOTONS_PER_MAC, math.inf)
    rin_db_per_hz: float = real(-math.inf, -math.inf, 0.0, hi_open=True)
    rin_bandwidth: float = real(1e9, 0.0, math.inf, lo_open=True, hi_open=True)

    @property
    def rin_sigma(self) -> float:
        """Standard deviation of the relative intensity of one source in one pass
        (:func:`optical.physics.noise.rin_sigma`, the one place it is converted
        on the host; the JAX pass traces the same formula)."""
        return noise.rin_sigma(self.rin_db_per_hz, self.rin_bandwidth)

    def _check_consistency(self) -> None:
        # Near float64's maximum, mean * photons_per_mac overflows to NaN; at
        # 1e30 the relative shot noise, ~1e-15, is already float64's resolution.
        if MAX_FINITE_PHOTONS_PER_MAC < self.photons_per_mac < math.inf:
            raise ValueError(f"source.photons_per_mac: {self.photons_per_mac} is out of range; "
                             f"finite values must be at most {MAX_FINITE_PHOTONS_PER_MAC:g}: "
                             "use inf for no shot noise")
        # Gaussian RIN multiplies the intensity by max(1 + sigma z, 0): beyond sigma = 1
        # the model is meaningless (and at 1e150 it overflows float32 to NaN).
        if not self.rin_sigma <= 1.0:
            raise ValueError(f"source.rin_db_per_hz = {self.rin_db_per_hz} dB/Hz over "
                             f"source.rin_bandwidth = {self.rin_bandwidth} Hz gives a relative "
                             f"intensity noise of {self.rin_sigma:.3g}; the RIN model needs "
                             "at most 1")


@dataclasses.dataclass(frozen=True)
class DACConfig(Section):
    """Digital-to-analogue conversion of the inputs into source drive levels.

    Attributes
    ----------
    bits : int or None
        Resolution; ``2**bits`` intensity levels over [0, 1]. ``None``: exact.
    scaling : {"per_token", "per_tensor", "static"}
        How inputs are scaled into the DAC range: by the absolute maximum of
        each token's row (dynamic, per token), of the whole input tensor
        (dynamic, per call: with offset inputs, a token far smaller than the
        tensor's largest sits within the rounding of the offset light, so even
        the ideal preset is exact to the tensor's scale, not the token's), or
        by a static range
        fixed when the weights are programmed from calibration inputs
        (``percentile``), with clipping.
        "static" needs ``optical.program(w, config, calibration=x)``.
    percentile : float, percent
        With "static" scaling: the input full scale is this percentile of the
        calibration inputs' absolute values, without the channels the outlier
        rule picks on those calibration inputs (under either policy: the
        dynamic one's later choices per call do not move it); larger inputs
        clip. Where it is 0 (more
        zeros than the percentile leaves out), the largest absolute value.
    """

    _name: ClassVar[str] = "dac"
    bits: int | None = integer(None, 1, MAX_BITS, optional=True)
    scaling: str = choice("per_token", ("per_token", "per_tensor", "static"))
    percentile: float = real(99.99, 0.0, 100.0, lo_open=True)


@dataclasses.dataclass(frozen=True)
class MaskConfig(Section):
    """The programmable transmission mask that holds the weights.

    Attributes
    ----------
    bits : int or None
        Resolution; ``2**bits`` transmission levels over
        [min_transmission, 1]. ``None``: continuous.
    contrast_ratio : float, dimensionless
        Ratio of full to minimum transmission (``inf``: a fully dark pixel).
    scaling : {"per_column", "per_tensor", "per_tile", "per_tile_column"}
        Weights are divided by an absolute maximum before they are mapped to
        transmissions; the scale is restored digitally. Over each output
        column, the whole matrix, each core-sized tile (K-tile x N-tile), or
        each column of each K-tile.
    compensate : bool
        Pre-distort the mask so that the transmissions the light sees (after
        the illumination envelope and crosstalk of the optics) are closest to
        the intended ones within [min_transmission, 1]. No effect with ideal
        optics.
    """

    _name: ClassVar[str] = "mask"
    bits: int | None = integer(None, 1, MAX_BITS, optional=True)
    contrast_ratio: float = real(math.inf, 1.0, math.inf, lo_open=True)
    scaling: str = choice("per_column", ("per_column", "per_tensor", "per_tile",
                                          "per_tile_column"))
    compensate: bool = boolean(False)

    @property
    def min_transmission(self) -> float:
        """Transmission of a fully "off" pixel, ``1 / contrast_ratio``."""
        return 1.0 / self.contrast_ratio


@dataclasses.dataclass(frozen=True)
class OpticsConfig(Section):
    """Lens geometry between sources, mask and detectors.

    With ``model = "ideal"`` (the default) the optics are ideal: each source
    illuminates exactly its mask row, uniformly, and each mask column reaches
    exactly its detector; the geometry fields are then unused. With
    ``"diffraction"`` the geometry sets, by scalar diffraction, the coupling of
    each source into neighbouring mask rows, of each mask column onto
    neighbouring detectors, and the illumination across the mask (see
    :mod:`optical.physics.crosstalk` for the optical train). The geometry
    defaults are those of the "iris-like" preset.

    Attributes
    ----------
    model : {"ideal", "diffraction"}
    pixel_pitch : float, m
        Mask pixel pitch; sources and detectors are relayed 1:1 onto it.
    fill_factor : float, dimensionless
        Transmitting area fraction of a mask pixel (square aperture of side
        ``sqrt(fill_factor) * pixel_pitch``; the gaps are opaque).
    fan_out_focal_length, fan_out_aperture : float, m
        Focal length and clear aperture (pupil width) of the fan-out optics.
    fan_in_focal_length, fan_in_aperture : float, m
        The same for the fan-in optics.
    defocus_waves, spherical_waves : float, waves RMS
        Defocus and primary spherical aberration (Zernike coefficients; their
        1-D Legendre counterparts on the cylindrical pupils) of both relays.
    beam_profile : {"flat_top", "gaussian"}
        Fan-out beam along a row: "flat_top" fills the fan-out aperture
        uniformly (a line generator); "gaussian" is the far field of the
        source mode, of 1/e**2 radius ``wavelength * f / (pi * beam_waist)``.
    beam_waist : float, m
        1/e**2 intensity radius of each source's Gaussian mode.
    kernel_radius : int, pixels
        Neighbours kept on each side by the kernels applied to a programmed
        tile; coupling further out is neglected (cost grows as its square).
    """

    _name: ClassVar[str] = "optics"
    model: str = choice("ideal", ("ideal", "diffraction"))
    pixel_pitch: float = real(10e-6, 0.0, 1e-2, lo_open=True)
    fill_factor: float = real(0.9, 0.0, 1.0, lo_open=True)
    fan_out_focal_length: float = real(50e-3, 0.0, 10.0, lo_open=True)
    fan_out_aperture: float = real(50.8e-3, 0.0, 10.0, lo_open=True)
    fan_in_focal_length: float = real(50e-3, 0.0, 10.0, lo_open=True)
    fan_in_aperture: float = real(25.4e-3, 0.0, 10.0, lo_open=True)
    defocus_waves: float = real(0.0, -100.0, 100.0)
    spherical_waves: float = real(0.0, -100.0, 100.0)
    beam_profile: str = choice("flat_top", ("flat_top", "gaussian"))
    beam_waist: float = real(1.5e-6, 0.0, 1e-2, lo_open=True)
    kernel_radius: int = integer(1, 0, 64)

    def _check_consistency(self) -> None:
        for side in ("fan_out", "fan_in"):
            aperture = getattr(self, f"{side}_aperture")
            focal = getattr(self, f"{side}_focal_length")
            if aperture >= 2 * focal:
                raise ValueError(
                    f"optics.{side}_aperture: {aperture} m gives a numerical aperture "
                    f"{aperture / (2 * focal):.3g} >= 1 with optics.{side}_focal_length = "
                    f"{focal} m; valid: aperture < 2 * focal length")


@dataclasses.dataclass(frozen=True)
class DetectorConfig(Section):
    """Photodetectors and their transimpedance amplifiers.

    Attributes
    ----------
    quantum_efficiency : float, dimensionless
        Detected photoelectrons per incident photon; converts detected into
        emitted photons for energy accounting (it does not enter the noise,
        which ``photons_per_mac`` already counts in detected photons).
    dark_electrons : float, electrons
        Mean dark counts per photodiode readout (``MatmulStats.detector_readouts``:
        both photodiodes of a balanced pair count; Poisson, or Gaussian following
        ``detector.shot_noise``); the mean is subtracted digitally, its shot
        noise remains.
    read_noise_electrons : float, electrons
        RMS input-referred read/TIA noise per ADC conversion (Gaussian; none
        at ``source.photons_per_mac = inf``, whose signal it is referred to): a
        balanced pair, subtracted in analogue, has one TIA and draws it once
        (``MatmulStats.adc_conversions``, not ``detector_readouts``). This and
        ``dark_electrons`` are at most 1e30. Noise that large keeps its law on
        every backend, in float32 too (a variance past its range included), as
        long as the output fits its dtype.
    shot_noise : {"poisson", "gaussian"}
        Poisson counts (exact up to a mean of 2**32, 2**16 on the JAX backend;
        the normal law, skewness ``1 / sqrt(mean)``, above), or their Gaussian
        approximation.
    balanced : bool
        With split weights: subtract the two rails in analogue before one ADC
        (True), or digitise each rail and subtract digitally (False).
    """

    _name: ClassVar[str] = "detector"
    quantum_efficiency: float = real(1.0, 0.0, 1.0, lo_open=True)
    dark_electrons: float = real(0.0, 0.0, 1e30)
    read_noise_electrons: float = real(0.0, 0.0, 1e30)
    shot_noise: str = choice("poisson", ("poisson", "gaussian"))
    balanced: bool = boolean(True)


@dataclasses.dataclass(frozen=True)
class ADCConfig(Section):
    """Analogue-to-digital conversion of each detector readout.

    Attributes
    ----------
    bits : int or None
        Resolution; ``2**bits`` codes over the full-scale window. ``None``:
        exact (no quantisation, no clipping).
    enob_loss : float, bits
        ``bits`` minus the effective number of bits (ENOB): the converter adds
        Gaussian noise so that its total error variance is
        ``(step * 2**enob_loss)**2 / 12``, ``step`` being the code step of its
        ``bits``-bit window (close to, not exactly, that of an ideal
        ``bits - enob_loss``-bit converter over the window). Given as a loss
        so that sweeping ``adc.bits`` keeps the converter's quality. Ignored
        when ``bits`` is None.
    full_scale : {"max", "rms", "calibrated"}
        How each column's window is set when the tile is programmed: "max"
        spans every noise-free readout the programmed weights can produce (no
        clipping without noise; noise at the extremes can still clip; at 23-24
        bits in float32 a step falls below the readout's own rounding, and
        ``clipped_fraction`` counts readouts that rounding takes past an end);
        "rms" spans the mean +- ``headroom`` standard deviations of the readout
        for normalised inputs uniform on [-1, 1], noise included, capped at
        the smallest and largest noise-free readouts the weights can produce
        widened by ``headroom`` noise standard deviations;
        "calibrated" minimises the converter's expected squared error,
        quantisation and clipping together, over the noisy readouts of
        calibration inputs (its error against the readout it converts, not
        against the noise-free product; needs ``optical.program(w, config,
        calibration=x)``).
    headroom : float, standard deviations
        Half-width of the "rms" window (at most 1e6).
    window : {"per_column", "per_tile"}
        One window per column of each tile, or one shared by all the columns
        of a tile (a common reference for the tile's converters): for "max"
        and "rms" the union of its columns' own windows, for "calibrated" the
        window of least expected squared error over the tile's readouts
        pooled.
    """

    _name: ClassVar[str] = "adc"
    bits: int | None = integer(None, 1, MAX_BITS, optional=True)
    enob_loss: float = real(0.0, 0.0, MAX_BITS, hi_open=True)
    full_scale: str = choice("rms", ("max", "rms", "calibrated"))
    headroom: float = real(4.0, 0.0, 1e6, lo_open=True)
    window: str = choice("per_column", ("per_column", "per_tile"))

    def _check_consistency(self) -> None:
        if self.bits is not None and self.enob_loss >= self.bits:
            raise ValueError(
                f"adc.enob_loss: {self.enob_loss} leaves no effective bits of adc.bits = "
                f"{self.bits}; valid: a number in [0, adc.bits)"
            )

    @property
    def enob(self) -> float | None:
        """Effective number of bits, ``bits - enob_loss`` (None: ideal)."""
        return None if self.bits is None else self.bits - self.enob_loss


@dataclasses.dataclass(frozen=True)
class EncodingConfig(Section):
    """How signed values become non-negative light intensities.

    Attributes
    ----------
    inputs : {"offset", "split"}
        "offset": one pass with intensities ``(x + 1) / 2``, corrected digitally;
        "split": positive and negative parts on two separate passes.
    weights : {"offset", "split"}
        "offset": one mask column per output, transmissions centred on the
        middle of the range, corrected digitally; "split": positive and
        negative parts on two mask columns (detector rails).

    At ``b`` bits an offset value has ``2**b`` levels over its signed range
    and none at 0 (an exact zero, input or weight, reads half a step high);
    a split one has ``2**(b+1) - 1``, 0 among them: one more bit of signed
    resolution (6 dB of SQNR) besides offset's shot noise.
    """

    _name: ClassVar[str] = "encoding"
    inputs: str = choice("split", ("offset", "split"))
    weights: str = choice("split", ("offset", "split"))


@dataclasses.dataclass(frozen=True)
class CoreConfig(Section):
    """Size of the optical core: one pass multiplies ``inputs`` by ``outputs``.

    Attributes
    ----------
    inputs : int
        Sources (mask rows) per pass: the K-tile size.
    outputs : int
        Output columns (detectors or balanced detector pairs) per pass: the
        N-tile size.
    """

    _name: ClassVar[str] = "core"
    inputs: int = integer(1024, 1, 1 << 20)
    outputs: int = integer(1024, 1, 1 << 20)


@dataclasses.dataclass(frozen=True)
class MappingConfig(Section):
    """How a transformer layer's products are mapped onto the optical core.

    Attributes
    ----------
    attention : {"digital", "optical"}
        Where the attention products ``Q K^T`` and ``P V`` run. Their operands
        are activations, so running them optically loads new masks (K^T and V,
        one per core-sized tile of each) for every layer, request and head
        group (counted in the schedule's weight loads).
        The causal mask's zeros in ``P`` go through the DAC like any input.
        With offset inputs (``encoding.inputs = "offset"``) an even number of
        DAC levels cannot show 0: from 2 bits on each zero reads as half a
        step of its row's range above it (at 1 bit, as the bottom of the
        range), always with the same sign, and their sum biases the
        earliest tokens' outputs. Llama-3.2-1B's layer 1 (synthetic weights,
        64 tokens) with an 8-bit DAC as the only error: ``P V``'s own error
        (``optical validate --local``) is 32 dB with offset inputs, 47 dB
        with split ones, whose zeros are dark.
        Optical attention is not causal once quantised: V's mask column
        scales and the attention products' ADC windows are set over all of
        a prompt's tokens, so an early token's output depends on later ones
        (a 10-token prefix of a 24-token prompt moved 0.2 % with an 8-bit
        mask as the only error). With digital attention and a fixed held-out
        calibration (``layer.optical(..., calibration=...)``) a prefix's
        outputs are the whole prompt's first rows up to float rounding (GEMMs
        are blocked by token count); ``transformer.validate`` draws its
        held-out prompts as long as the scored ones, so a shorter prompt is
        calibrated on other prompts too.
    """

    _name: ClassVar[str] = "mapping"
    attention: str = choice("digital", ("digital", "optical"))


@dataclasses.dataclass(frozen=True)
class OutliersConfig(Section):
    """Input channels that bypass the optics and are multiplied digitally
    (an LLM.int8-style decomposition: ``x @ w = x[:, D] @ w[D] + x[:, O] @ w[O]``).

    A channel's magnitude is its absolute maximum over the tokens considered;
    it is an outlier when that exceeds ``threshold`` times the median channel
    magnitude (nonzero channels), at most ``top_k`` of them, largest first.
    (Relative, unlike LLM.int8's absolute ``|x| >= 6``: on synthetic
    Llama-3.2-1B residual streams the rule at 6 picks 0-8 channels a product
    where the absolute one picks up to ~5000 of down_proj's.) Both are
    maxima, so the ratio depends on how many tokens are considered: the
    bulk channels' maxima grow with the tokens while an outlier's stays, so
    a channel's ratio falls as the set grows (MiniLM layer 2's query input:
    9.7 at 8 tokens, 5.2 at 512), and which channels go digital depends on
    the calibration set's size as well as its data. ``transformer.validate``
    keeps that size at ``calibration.max_tokens`` whatever the prompt; a
    matmul workload calibrates on the tokens it scores.

    Attributes
    ----------
    policy : {"none", "static", "dynamic"}
        "static": the channels are chosen once from calibration inputs when
        the weights are programmed, and their mask rows are not programmed (the
        hardware choice). "dynamic": chosen in every call from that call's
        inputs (all its tokens: the choice does not depend on chunking, but a
        token's output depends on the batch it comes in); the whole matrix
        stays on the mask and the outlier channels' inputs are zeroed (dark
        sources with split inputs, half lit at the offset level with offset
        inputs).
    threshold : float or None, dimensionless
        Ratio to the median channel magnitude; ``None``: rank only (``top_k``).
    top_k : int or None
        At most this many channels go digital; ``None``: no cap.
    """

    _name: ClassVar[str] = "outliers"
    policy: str = choice("none", ("none", "static", "dynamic"))
    threshold: float | None = real(6.0, 1.0, math.inf, hi_open=True, optional=True)
    top_k: int | None = integer(None, 0, 1 << 30, optional=True)

    def _check_consistency(self) -> None:
        if self.policy != "none" and self.threshold is None and self.top_k is None:
            raise ValueError(
                f"outliers.policy: {self.policy!r} needs outliers.threshold or outliers.top_k "
                "(both are None)")


@dataclasses.dataclass(frozen=True)
class CalibrationConfig(Section):
    """How calibration inputs are used when weights are programmed.

    Attributes
    ----------
    max_tokens : int
        At most this many calibration tokens (rows, evenly spaced) are pushed
        through the noise-free optical readouts that set calibrated ADC
        windows; input ranges and outlier channels use every token. The
        default 256 costs 0.05 dB of SQNR against 512 on a Llama-3.1-8B
        layer with per-column windows (1024: the same as 512), and halves the
        readouts' GEMMs of a 512-token validation (docs/quantisation.md).
        It is also the default number of held-out tokens that
        ``transformer.validate`` calibrates on (at most the model's
        ``max_position_embeddings``), drawn as prompts as long as the scored
        ones (as many rows of them, evenly spaced).
    """

    _name: ClassVar[str] = "calibration"
    max_tokens: int = integer(256, 1, 1 << 24)


@dataclasses.dataclass(frozen=True)
class EnergyConfig(Section):
    """Energy and latency of the machine around the optics (read by
    :mod:`optical.energy`; the emulated arithmetic does not depend on it).

    Photon energy comes from ``source.wavelength``, photons per MAC from
    ``source.photons_per_mac``, the quantum efficiency from
    ``detector.quantum_efficiency`` and converter resolutions from ``dac.bits``
    and ``adc.enob``. The defaults and their sources are listed in
    docs/energy.md. Energies are in joules, and bounded far above any device
    (1 uJ per conversion, readout, byte or operation; 1 nJ per
    conversion-step; 1 J per mask load), so that a figure typed in pJ or fJ
    (``dram_energy_per_byte=31``) is refused rather than priced.

    Attributes
    ----------
    laser_efficiency : float, W/W
        Wall-plug efficiency of the sources: emitted optical power per
        electrical power drawn.
    optical_efficiency : float, W/W
        Fraction of the emitted light that reaches the detectors through a
        fully open mask pixel (lens, fill-factor and coupling losses).
    source_mean_level : float, dimensionless
        Mean emitted power relative to full scale during a pass: 1 for an
        always-on source behind an intensity modulator; the mean drive level
        (e.g. 0.5 for offset-encoded uniform inputs) for a directly modulated one.
    walden_fom : float, J per conversion-step
        Walden figure of merit ``P / (2**ENOB f_s)`` of the converters, used
        for any converter whose energy is not given explicitly.
    dac_energy : float or None, J per conversion
        Energy of one DAC conversion; ``None``: ``walden_fom * 2**dac.bits``.
    adc_energy : float or None, J per conversion
        Energy of one ADC conversion; ``None``: ``walden_fom * 2**adc.enob``.
    detector_energy : float, J per readout
        Photodetector bias and transimpedance amplifier, per detector readout.
    input_rate : float, Hz
        Optical passes per second per core (the source modulation rate).
    mask_refresh_rate : float, Hz
        Weight-mask loads per second per core: a load takes ``1 / rate`` s.
    mask_load_energy : float, J per load
        Energy to write one core-sized tile onto the mask.
    double_buffered_mask : bool
        Whether a core can load its next mask while streaming through the
        current one (the load time then hides behind streaming, and vice versa).
    cores : int
        Optical cores working in parallel. When there are at least as many
        cores as weight tiles in the model, the weights stay resident: they
        are loaded once, not per prefill.
    dram_energy_per_byte : float, J/byte
        Off-chip memory (DRAM/HBM) read energy: weights into the mask driver,
        embeddings, the LM head.
    sram_energy_per_byte : float, J/byte
        On-chip memory access energy: activations, partial sums.
    digital_energy_per_op : float, J/op
        Energy of one digital arithmetic operation (add, multiply, compare,
        exponential counted as one).
    digital_ops_per_s : float, op/s
        Throughput of the digital engine beside the optics.
    static_power : float, W
        Power each core draws whether or not it computes (controllers, mask
        hold, thermal control), charged over the time to first token.
    link_energy_per_byte : float, J/byte
        Moving the KV cache from the optical prefill machine to a decode GPU.
    """

    _name: ClassVar[str] = "energy"
    laser_efficiency: float = real(0.3, 0.0, 1.0, lo_open=True)
    optical_efficiency: float = real(1.0, 0.0, 1.0, lo_open=True)
    source_mean_level: float = real(1.0, 0.0, 1.0, lo_open=True)
    walden_fom: float = real(25e-15, 0.0, 1e-9)
    dac_energy: float | None = real(None, 0.0, 1e-6, optional=True)
    adc_energy: float | None = real(None, 0.0, 1e-6, optional=True)
    detector_energy: float = real(1e-12, 0.0, 1e-6)
    input_rate: float = real(1e9, 0.0, math.inf, lo_open=True, hi_open=True)
    mask_refresh_rate: float = real(1e3, 0.0, math.inf, lo_open=True, hi_open=True)
    mask_load_energy: float = real(1e-3, 0.0, 1.0)
    double_buffered_mask: bool = boolean(False)
    cores: int = integer(1, 1, 1 << 30)
    dram_energy_per_byte: float = real(31e-12, 0.0, 1e-6)
    sram_energy_per_byte: float = real(1.25e-12, 0.0, 1e-6)
    digital_energy_per_op: float = real(0.71e-12, 0.0, 1e-6)
    digital_ops_per_s: float = real(989e12, 0.0, math.inf, lo_open=True, hi_open=True)
    static_power: float = real(0.0, 0.0, math.inf, hi_open=True)
    link_energy_per_byte: float = real(8e-12, 0.0, 1e-6)
