"""Named hardware configurations, each citing where its numbers come from
(the functions' docstrings give every number and its source):

- ``"ideal"``: the exact limit (no noise, exact converters, infinite mask
  contrast); what any deviation is measured from.
- ``"iris-like"``: a 1024 x 1024 free-space core in the spirit of Lumai's
  Iris, programmed as deployed (calibrated ADC windows and outlier channels,
  lens pre-distortion), with the reference sheet's precisions and noise.
- ``"wang-2022"``: the sub-photon regime of Wang et al., Nat. Commun. 13, 123
  (2022): 3.1 photons per multiplication on MNIST-like inputs (23.7 at full
  scale), Poisson counts, non-negative inputs sent as they are, offset-encoded
  weights, no balanced detection. Built for a network that tolerates it:
  zero-mean sums at Llama widths need ~900 photons per MAC for 20 dB
  (docs/energy.md), so a random 4096-wide matmul scores below 0 dB here
  (-6 dB; -1 to -2 dB on 711-wide MNIST-like inputs, by seed).

>>> import optical
>>> optical.presets.names()
['ideal', 'iris-like', 'wang-2022']
>>> cfg = optical.presets.get("iris-like").replace({"adc.bits": 6})
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

from optical.config import (
    ADCConfig,
    CoreConfig,
    DACConfig,
    DetectorConfig,
    EncodingConfig,
    EnergyConfig,
    MaskConfig,
    OpticalConfig,
    OpticsConfig,
    OutliersConfig,
    SourceConfig,
    check_config,
)
from optical.physics.noise import ELEMENTARY_CHARGE, LIGHT_SPEED, PLANCK, tia_noise_electrons

__all__ = ["describe", "get", "name_of", "names"]

def _quantum_efficiency(responsivity: float, wavelength: float) -> float:
    """Quantum efficiency from responsivity, ``eta = R h c / (q lambda)``."""
    return responsivity * PLANCK * LIGHT_SPEED / (ELEMENTARY_CHARGE * wavelength)


def ideal() -> OpticalConfig:
    """The ideal machine: the limit of the physics in which the optical matmul
    is exact to float rounding (of the light's full pedestal, with offset
    inputs: inputs whose largest value is R times those that carry an output
    lose about 20 log10(R) dB, 9e-3 relative error in float32 at R = 1000;
    docs/ARCHITECTURE.md, Dtypes).

    Infinite photons per MAC (no shot noise), no RIN, no dark or read noise,
    infinite mask contrast, and exact converters (``bits = None``). Encodings
    and core size are those of "iris-like", so tiling is exercised as on the
    realistic machine.
    """
    return OpticalConfig(
        encoding=EncodingConfig(inputs="offset", weights="split"),
        core=CoreConfig(inputs=1024, outputs=1024),
    )


def iris_like() -> OpticalConfig:
    """A 1024 x 1024 free-space core in the spirit of Lumai's Iris (press, 2026:
    1024 laser sources encode the input vector; no published precision), with
    the defaults of the project's reference sheet where no number is public.

    - source: 850 nm; RIN -150 dB/Hz (the reference sheet's figure; DFB lasers
      reach -150 to -160 dB/Hz, 850 nm VCSELs, whose efficiency the energy
      figures below assume, -130 to -145 dB/Hz: sweep ``source.rin_db_per_hz``)
      over a 1 GHz detection bandwidth (input rate 1 GS/s); 10**5 detected
      photons per MAC (an assumption: on a 4096-wide Gaussian layer the shot
      and TIA noise then cost about 4 dB against the converters' limit of 30 dB
      -- 26 dB at 1e5, 29 dB at 3e5, 13 dB at 1e4; a Llama-3.2-1B layer
      loses more, 7-9 dB, and needs about 1e6: docs/energy.md; sweep
      ``source.photons_per_mac`` for others).
    - DAC 8 bits, per-token dynamic scaling.
    - mask 8 bits, contrast 50:1 (min transmission 0.02), per-column scaling.
    - detector: Si at 850 nm, responsivity 0.55 A/W (quantum efficiency 0.80);
      TIA noise 10 pA/sqrt(Hz) read once per ns (about 1974 electrons RMS);
      dark current 1 nA over 1 ns (6.2 electrons); Gaussian shot noise (counts
      are far above the Poisson regime); balanced detection of split weights.
    - ADC 8 bits, ENOB 6.5 (1.5 bits lost).
    - offset-encoded inputs (one pass, as laser intensities), split weights.
    - programmed as a deployed machine would be: each column's ADC window
      calibrated on example inputs (``optical.program(w, cfg, calibration=x)``;
      raw weights given to ``optical.matmul`` calibrate on the call's own
      inputs), input channels above 6x the median channel magnitude bypass
      the optics digitally (LLM.int8-style decomposition, chosen on the
      calibration inputs), and the mask pre-distorted for the lens crosstalk
      (``mask.compensate``). ``adc.full_scale="rms"``,
      ``outliers.policy="none"`` and ``mask.compensate=False`` give the naive
      mapping (see docs/quantisation.md for what each choice buys).
    - optics (scalar diffraction, see ``optical.physics.crosstalk``): the
      reference sheet's 850 nm, 10 um mask pixels at fill factor 0.9 and
      f = 50 mm fan-out and fan-in lenses. Assumed here: a 2-inch (50.8 mm,
      f/1) fan-out lens, filled uniformly by a flat-top line generator, so that
      the 2 x 1024 interleaved rail columns (20.5 mm) sit far from its edge (a
      1-inch lens leaves a 2.6% Fresnel ripple at the pixel scale on the outer
      columns); a 1-inch (25.4 mm, NA 0.25) fan-in pupil; single-mode sources
      of 1.5 um waist; no aberrations; kernels cut at 1 pixel. This gives a
      nearest-column output coupling of 3.4e-3 (-25 dB) with -8e-4
      interference between neighbours, a negligible (2e-9) row coupling of
      the well-resolved sources, a flat illumination, and 37% of each
      source's light detected.
    - energy (docs/energy.md lists every source): laser wall-plug efficiency
      0.3 (VCSELs: 17-25% at 0.1-0.5 mW at 850 nm, 40-48% at ~10 mW at
      940 nm; streaming at 1e5 photons per MAC asks ~0.12 W of light per
      source, far above those devices' measured range, see docs/energy.md);
      half the emitted light reaches the detectors (an assumption: fill
      factor 0.9, lens and coupling losses; the diffraction model of these
      optics detects 37%, ``crosstalk.kernels(cfg).throughput``, and
      ``energy.optical_efficiency=0.37`` prices that: 1.35x the laser energy);
      converters at a Walden FOM of 25 fJ per conversion-step (median of the
      Nyquist ADCs at 0.5-5 GS/s and ENOB 5-8 published at ISSCC/VLSI
      2015-2025, Murmann's ADC survey), i.e. 6.4 pJ per 8-bit DAC and 2.3 pJ
      per ADC conversion; 1 pJ per detector readout (optical-link receivers:
      0.17-2.3 pJ/bit); one core, 1 GS/s input rate, 1 kHz mask refresh (8-bit
      DMD patterns reach 1.9 kHz, but a DMD makes grey levels by switching its
      mirrors within the frame, so a pass of a nanosecond sees binary mirrors;
      LCoS SLMs, analogue, 100-200 Hz) at 1 mJ per load (a DMD dissipates
      0.25-1.3 W: TI DLP4710, DLP470TP); 31 pJ/byte off-chip (HBM2, ~3.9
      pJ/bit), 1.25 pJ/byte on-chip (Horowitz, ISSCC 2014: 10 pJ per 64-bit 8
      kB SRAM access); 0.71 pJ and 1/989e12 s per digital operation (an H100's
      700 W at 989 TFLOP/s dense BF16, i.e. at its peak rate: an optimistic
      bound for the digital side, since the GPU baseline itself is charged at
      50% utilisation, 1.42 pJ per FLOP); no static power; 1 pJ/bit for the
      KV-cache link.

    Sources: Lumai Iris Nova press release (2026); RIN and responsivity
    ranges from vendor data; Walden-FOM converter range (see docs/energy.md).
    """
    wavelength = 850e-9
    bandwidth = 1e9
    return OpticalConfig(
        source=SourceConfig(wavelength=wavelength, photons_per_mac=1e5,
                            rin_db_per_hz=-150.0, rin_bandwidth=bandwidth),
        dac=DACConfig(bits=8, scaling="per_token"),
        mask=MaskConfig(bits=8, contrast_ratio=50.0, scaling="per_column", compensate=True),
        detector=DetectorConfig(
            quantum_efficiency=_quantum_efficiency(0.55, wavelength),
            dark_electrons=1e-9 / bandwidth / ELEMENTARY_CHARGE,
            read_noise_electrons=tia_noise_electrons(10e-12, bandwidth),
            shot_noise="gaussian", balanced=True),
        adc=ADCConfig(bits=8, enob_loss=1.5, full_scale="calibrated", window="per_column"),
        encoding=EncodingConfig(inputs="offset", weights="split"),
        core=CoreConfig(inputs=1024, outputs=1024),
        outliers=OutliersConfig(policy="static", threshold=6.0),
        optics=OpticsConfig(
            model="diffraction", pixel_pitch=10e-6, fill_factor=0.9,
            fan_out_focal_length=50e-3, fan_out_aperture=50.8e-3,
            fan_in_focal_length=50e-3, fan_in_aperture=25.4e-3,
            defocus_waves=0.0, spherical_waves=0.0, beam_profile="flat_top",
            beam_waist=1.5e-6, kernel_radius=1),
        energy=EnergyConfig(
            laser_efficiency=0.3, optical_efficiency=0.5, source_mean_level=1.0,
            walden_fom=25e-15, dac_energy=None, adc_energy=None, detector_energy=1e-12,
            input_rate=bandwidth, mask_refresh_rate=1e3, mask_load_energy=1e-3,
            double_buffered_mask=False, cores=1, dram_energy_per_byte=31e-12,
            sram_energy_per_byte=1.25e-12, digital_energy_per_op=0.71e-12,
            digital_ops_per_s=989e12, static_power=0.0, link_energy_per_byte=8e-12),
    )


#: MNIST's mean pixel over its largest (1.0): the mean of ``x / max(x)`` of a
#: typical input image, the data behind wang-2022's photon budget.
MNIST_MEAN_FILL = 0.1307


def wang_2022() -> OpticalConfig:
    """The low-photon regime of Wang et al., "An optical neural network using
    less than 1 photon per multiplication", Nat. Commun. 13, 123 (2022).

    711-wide dot products; 99% MNIST accuracy at about 3.1 photons per
    multiplication (about 90% at 0.65). Their figure is an average over the
    data: their shot-noise simulation (mcmahon-lab/ONN-QAT-SQL, ``shot_noise``)
    gives each sample the full-scale count ``n_max = 3.1 * K / sum(x / max
    x)``, so that the light reaching the weights averages 3.1 photons per
    input element. ``photons_per_mac`` here is the full-scale count (see
    :class:`optical.config.SourceConfig`): ``3.1 / 0.1307`` (about 23.7),
    ``n_max`` for an input of MNIST's mean fill (mean pixel / max 0.1307);
    sparser inputs see fewer photons, as at a fixed source power. Their inputs
    (images, ReLU activations) are non-negative and sent as they are, with only
    the weights shifted to non-negative transmissions: inputs are split here
    (a non-negative input's negative pass is dark, so it is the same light;
    signed ones take the positive and negative passes of the group's optical
    transformer simulation) and weights offset-encoded; the energy and time
    estimates count the dark pass too, twice the DAC and ADC conversions of
    the paper's one pass of non-negative light. The photon counts are
    Poisson; detector read noise and converter error are negligible next to
    shot noise at these counts, so they are off here. 8-bit input display and
    weight SLM levels; the SLM contrast (100:1) and the 532 nm wavelength are
    assumptions (neither enters the noise at these counts).
    """
    return OpticalConfig(
        source=SourceConfig(wavelength=532e-9, photons_per_mac=3.1 / MNIST_MEAN_FILL),
        dac=DACConfig(bits=8, scaling="per_token"),
        mask=MaskConfig(bits=8, contrast_ratio=100.0, scaling="per_column"),
        detector=DetectorConfig(shot_noise="poisson", balanced=False),
        encoding=EncodingConfig(inputs="split", weights="offset"),
        core=CoreConfig(inputs=711, outputs=711),
    )


_PRESETS: dict[str, Callable[[], OpticalConfig]] = {
    "ideal": ideal,
    "iris-like": iris_like,
    "wang-2022": wang_2022,
}


def names() -> list[str]:
    """Names accepted by :func:`get`."""
    return list(_PRESETS)


def name_of(config: OpticalConfig) -> str | None:
    """The name of the preset ``config`` equals, field for field (None if none does)."""
    return next((name for name, make in _PRESETS.items() if make() == config), None)


def describe(config: OpticalConfig, max_changes: int = 3, *,
             ignore: Collection[str] = ()) -> str:
    """A short name for ``config``: its preset's (``"iris-like"``), else the
    preset it differs least from with the fields it changes, when they are
    at most ``max_changes`` (``"iris-like with detector.dark_electrons=0.0"``),
    else ``"custom config"``. Ties go to the preset listed first. Paths in
    ``ignore`` (a sweep's swept parameters, whose base value is never run)
    are neither counted nor named."""
    check_config(config)
    if isinstance(max_changes, bool) or not isinstance(max_changes, int) or max_changes < 0:
        raise ValueError(f"max_changes: {max_changes!r} must be a non-negative integer")
    if isinstance(ignore, str):
        raise TypeError(f"ignore: expected a collection of config paths, got the string "
                        f"{ignore!r}")
    best: tuple[str, list[str]] | None = None
    for name, make in _PRESETS.items():
        preset = make()
        changed = [path for path in preset.diff(config) if path not in ignore]
        if not changed:
            return name
        if len(changed) <= max_changes and (best is None or len(changed) < len(best[1])):
            best = (name, changed)
    if best is None:
        return "custom config"
    name, changed = best
    return f"{name} with " + ", ".join(f"{path}={config.get(path)!r}" for path in changed)


def get(name: str) -> OpticalConfig:
    """The preset configuration called ``name``.

    Raises
    ------
    ValueError
        For an unknown name, listing the valid ones.
    TypeError
        For a name that is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: a preset's name is a string, got {type(name).__name__}; "
                        f"valid: {', '.join(_PRESETS)}")
    if name not in _PRESETS:
        hint = ""
        if name.endswith(".json") or "/" in name or os.sep in name:
            hint = (" (a machine file is read by OpticalConfig.from_file(path), or the "
                    "commands' --config FILE, not as a preset)")
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(_PRESETS)}{hint}")
    return _PRESETS[name]()

