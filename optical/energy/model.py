"""Energy and latency of an optical prefill, component by component.

Every term is a count times a cost. The counts come from
:func:`optical.transformer.layer_schedule` (optics) and
:mod:`optical.energy.counts` (digital work and memory); the costs from the
config's ``energy`` section and its source, DAC, ADC and detector sections:

==================  ======================================================================
component           energy
==================  ======================================================================
laser               source activations (DAC conversions) x fan-out pixels
                    (``core.outputs`` x weight rails) x ``photons_per_mac`` x h c / lambda
                    x ``source_mean_level`` / (quantum efficiency x ``optical_efficiency``
                    x ``laser_efficiency``)
dac                 DAC conversions x (``dac_energy`` or ``walden_fom * 2**dac.bits``)
adc                 ADC conversions x (``adc_energy`` or ``walden_fom * 2**adc.enob``)
detector            detector readouts x ``detector_energy``
mask_load           weight loads x ``mask_load_energy``
weight_memory       mask bytes of weight loads x ``dram_energy_per_byte``, plus the
                    embedding and LM-head reads
activation_memory   on-chip bytes (activations, partial sums, activation masks)
                    x ``sram_energy_per_byte``
digital             digital operations x ``digital_energy_per_op``
static              ``static_power`` x ``cores`` x time to first token
==================  ======================================================================

``photons_per_mac`` counts *detected* photons at full-scale input and full
transmission; every source lights a whole row of the mask (all its columns
and weight rails) whatever the weights are, so the emitted light per pass is
fixed by the fan-out, not by the data.

Latency. A core streams ``input_rate`` passes per second and loads a mask in
``t_load = 1 / mask_refresh_rate`` s. Each weight tile is loaded once per
prefill (per batch), so its load is amortised only over the ``batch *
tokens`` rows that stream through it. Matmuls run one after another (each
needs the previous one's output); the tiles of one matmul run in parallel on
the cores. Weight masks do not depend on the data, so idle cores load the
next matmuls' tiles ahead of time (ideal prefetching); masks made of
activations (optical attention) can only be loaded once their data exist.
The optical time is then the larger of the two classic bounds of a parallel
schedule: the work (every tile's load and stream, in core-seconds) over the
cores, and the span (the chain of matmuls: one initial load, then each
matmul's rounds of streaming, plus the loads of activation masks). A greedy
scheduler is within a factor two of this (Graham's bound). When the cores can
hold every weight tile of the model (``cores >= tiles``) the weights stay
resident: nothing is loaded per prefill and the time is the span. The
digital work runs after the optics at ``digital_ops_per_s`` (no overlap: an
upper bound).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from optical._frozen import frozen
from optical._validation import check_bool, check_positive_int
from optical.config import OpticalConfig, check_config
from optical.core import Schedule
from optical.energy import counts
from optical.physics import encoding
from optical.physics.noise import LIGHT_SPEED, PLANCK
from optical.transformer.schedule import layer_schedule
from optical.transformer.spec import ModelSpec

__all__ = [
    "COMPONENTS",
    "PrefillEnergy",
    "conversion_energies",
    "laser_energy_per_activation",
    "matmul_energy",
    "matmul_time",
    "photon_energy",
    "prefill",
]


#: Schedule counts summed over a prefill's matmuls and layers in reports.
_SUMMED = ("passes", "weight_loads", "dac_conversions", "adc_conversions",
           "detector_readouts", "macs")

#: Energy components, in the order reports and plots list them.
COMPONENTS = ("laser", "dac", "adc", "detector", "mask_load", "weight_memory",
              "activation_memory", "digital", "static")


def photon_energy(wavelength: float) -> float:
    """Energy of one photon, ``h c / lambda``.

    Parameters
    ----------
    wavelength : float, m

    Returns
    -------
    float, J
    """
    if not wavelength > 0:
        raise ValueError(f"wavelength: {wavelength} must be > 0 m")
    return PLANCK * LIGHT_SPEED / wavelength


def laser_energy_per_activation(config: OpticalConfig) -> float:
    """Electrical energy of one source lighting its mask row for one pass.

    Returns
    -------
    float, J
        ``core.outputs * weight_rails * photons_per_mac * h c / lambda *
        source_mean_level / (quantum_efficiency * optical_efficiency *
        laser_efficiency)``.

    Raises
    ------
    ValueError
        If ``source.photons_per_mac`` is infinite (the ideal source).
    """
    p = config.source.photons_per_mac
    if not math.isfinite(p):
        raise ValueError("source.photons_per_mac is inf: the ideal source has no finite "
                         "energy; set source.photons_per_mac (e.g. --set "
                         "source.photons_per_mac=1e4)")
    e = config.energy
    fan_out = config.core.outputs * encoding.n_rails(config.encoding.weights)
    detected = fan_out * p * photon_energy(config.source.wavelength) * e.source_mean_level
    return detected / (config.detector.quantum_efficiency * e.optical_efficiency
                       * e.laser_efficiency)


def conversion_energies(config: OpticalConfig) -> tuple[float, float]:
    """Energy of one DAC and one ADC conversion, J.

    An explicit ``energy.dac_energy`` / ``energy.adc_energy`` wins; otherwise
    the Walden figure of merit times ``2**dac.bits`` / ``2**adc.enob``.

    Raises
    ------
    ValueError
        If a converter is ideal (``bits`` None) and has no explicit energy.
    """
    e = config.energy
    values, problems = [], []
    for name, explicit, bits in (("dac", e.dac_energy, config.dac.bits),
                                 ("adc", e.adc_energy, config.adc.enob)):
        if explicit is not None:
            values.append(explicit)
        elif bits is None:
            problems.append(f"{name}.bits is None: an ideal converter has no finite energy; "
                            f"set {name}.bits or energy.{name}_energy")
        else:
            values.append(e.walden_fom * 2.0 ** bits)
    if problems:  # both named at once
        raise ValueError("; ".join(problems))
    return values[0], values[1]


def _check_priced(config: OpticalConfig) -> None:
    """One ValueError naming every field that leaves the machine without a
    finite price (an ideal source, converter or mask), so that a preset's
    are all set in one go (the ideal preset's four took four tries)."""
    problems = []
    for check in (laser_energy_per_activation, conversion_energies, counts.check_mask_bits):
        try:
            check(config)
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise ValueError("; ".join(problems))


def matmul_energy(s: Schedule, config: OpticalConfig, *, resident: bool = False,
                  mask_source: str = "dram") -> dict[str, float]:
    """Energy of one optical matmul by component (no ``static``), J.

    Parameters
    ----------
    s : Schedule
        As counted by :func:`optical.core.schedule` or ``layer_schedule``.
    config : OpticalConfig
    resident : bool
        Whether the weights are already on the mask (no load, no weight read).
    mask_source : {"dram", "sram"}
        Where the mask data comes from: weights from off-chip memory,
        activations (attention's K and V) from on-chip memory.
    """
    resident = check_bool(resident, "resident")
    if mask_source not in ("dram", "sram"):
        raise ValueError(f"mask_source: {mask_source!r} is not valid; valid: 'dram', 'sram'")
    e = config.energy
    out = dict.fromkeys(COMPONENTS[:-1], 0.0)
    out["laser"] = s.dac_conversions * laser_energy_per_activation(config)
    dac, adc = conversion_energies(config)
    work = counts.matmul_work(s, config)
    out["dac"] = s.dac_conversions * dac
    out["adc"] = s.adc_conversions * adc
    out["detector"] = s.detector_readouts * e.detector_energy
    out["activation_memory"] = work.sram_bytes * e.sram_energy_per_byte
    out["digital"] = work.ops * e.digital_energy_per_op
    if not resident and s.passes:  # nothing streamed: nothing loaded (as matmul_time)
        out["mask_load"] = s.weight_loads * e.mask_load_energy
        mask = counts.mask_bytes(s, config)
        if mask_source == "sram":
            out["activation_memory"] += mask * e.sram_energy_per_byte
        else:
            out["weight_memory"] = mask * e.dram_energy_per_byte
    return out


def matmul_time(s: Schedule, config: OpticalConfig, *, cores: int, resident: bool = False,
                activation: bool = False) -> dict[str, float]:
    """Work and span of one optical matmul on ``cores`` cores.

    Parameters
    ----------
    s : Schedule
    config : OpticalConfig
    cores : int
        Cores its tiles are spread over.
    resident : bool
        Whether its masks are already loaded (nothing to load).
    activation : bool
        Whether its masks hold activations: they are loaded only once the
        data exist, so the loads lie on the span.

    Returns
    -------
    dict
        ``work`` (core-seconds: every tile's load and stream; with a
        double-buffered mask, the longer of the two), ``span`` (s: its rounds
        of ``cores`` tiles, each streaming ``passes / weight_loads`` passes,
        plus their loads for activation masks) and ``streaming`` (s: the
        streaming part of the span).
    """
    cores = check_positive_int(cores, "cores")
    resident = check_bool(resident, "resident")
    activation = check_bool(activation, "activation")
    if s.weight_loads == 0 or s.passes == 0:
        return {"work": 0.0, "span": 0.0, "streaming": 0.0}
    e = config.energy
    stream = s.passes / s.weight_loads / e.input_rate
    load = 0.0 if resident else 1.0 / e.mask_refresh_rate
    per_tile = max(load, stream) if e.double_buffered_mask else load + stream
    rounds = -(-s.weight_loads // cores)
    streaming = rounds * stream
    span = streaming + (rounds * load if activation else 0.0)
    return {"work": s.weight_loads * per_tile, "span": span, "streaming": streaming}


@dataclasses.dataclass(frozen=True)
class PrefillEnergy:
    """Energy and time of one batched prefill on the optical machine.

    Its mappings are read-only dicts, nested ones too;
    :func:`dataclasses.replace` makes another report.

    Attributes
    ----------
    model : str
    tokens, batch : int
        ``batch`` prompts of ``tokens`` tokens, prefilled together.
    components : mapping of str to float, J
        Energy of the whole batch by component (see :data:`COMPONENTS`).
    by_matmul : mapping of str to mapping of str to float, J
        Energy of each matmul name summed over the layers, by component.
    digital : mapping of str to float, J
        Energy of each item of digital work (its operations and memory
        traffic) over the whole prefill, the optical matmuls' decoding
        included as ``"decode"``: a view across ``components``.
    time : mapping of str to float, s
        ``streaming`` (the chain of matmuls' streaming), ``mask_load`` (the
        rest of the optical time: loads that prefetching cannot hide) and
        ``digital``; they add up to the TTFT.
    counts : mapping of str to int
        Totals over the layers: the schedule counts (passes, weight loads,
        conversions, readouts, MACs; ``weight_loads`` is the schedule's even
        with resident weights, which load none), bytes written to masks
        (``mask_bytes``: 0 for resident weights but activation masks), digital
        operations and their on- and off-chip bytes, weight tiles of the
        model, rows streamed per weight load.
    schedule : mapping of str to Schedule
        One layer's schedule, the counts the report was computed from.
    num_layers : int
    weights_resident : bool
    cores : int
        Optical cores the prefill ran on (``energy.cores``).
    faster_if_reloaded : mapping of str to float, optional
        With resident weights and optical attention, the TTFT (``ttft_s``, s)
        and energy (``energy_j``, J) of reloading the weights every prefill
        instead, where that is faster (None otherwise).
    """

    model: str
    tokens: int
    batch: int
    components: Mapping[str, float]
    by_matmul: Mapping[str, Mapping[str, float]]
    digital: Mapping[str, float]
    time: Mapping[str, float]
    counts: Mapping[str, int]
    schedule: Mapping[str, Schedule]
    num_layers: int
    weights_resident: bool
    cores: int = 1
    faster_if_reloaded: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        # Read-only: a component changed in place moved ``total`` after the fact.
        frozen(self, "components", "by_matmul", "digital", "time", "counts", "schedule",
               "faster_if_reloaded")

    @property
    def component_names(self) -> tuple[str, ...]:
        """The components of :attr:`components`: :data:`COMPONENTS`' order,
        then any a caller added (``dataclasses.replace``), which the table
        and the figure show as well (the figure left them out of a bar
        whose total :attr:`total` counts them in)."""
        return (*COMPONENTS, *(k for k in self.components if k not in COMPONENTS))

    @property
    def total(self) -> float:
        """Energy of the whole batch, J."""
        return float(sum(self.components.values()))

    @property
    def ttft(self) -> float:
        """Time to first token of every request of the batch, s."""
        return float(sum(self.time.values()))

    @property
    def per_token(self) -> float:
        """Energy per prompt token, J."""
        return self.total / (self.batch * self.tokens)

    @property
    def per_request(self) -> float:
        """Energy per prefill request, J."""
        return self.total / self.batch

    @property
    def per_mac(self) -> float:
        """Energy of the whole prefill (every component, the digital work
        around the optics included) per multiply-accumulate run optically
        (``counts["macs"]``), J: the figure optical-computing papers quote
        per MAC. ``components["laser"] / counts["macs"]`` is the light's own."""
        return self.total / self.counts["macs"] if self.counts["macs"] else math.inf

    @property
    def laser_power(self) -> float:
        """Average electrical power of the lasers while they stream, all
        cores together, W: their energy over the streaming time (``time
        ["streaming"]``). An average over the rounds of tiles: while a
        matmul's tiles fill every core at once the draw is higher (up to
        ``cores`` sources at full power), so size a supply for that peak."""
        streaming = self.time["streaming"]
        return self.components["laser"] / streaming if streaming > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Prompt tokens per second of one machine, tokens/s."""
        return self.batch * self.tokens / self.ttft if self.ttft > 0 else math.inf

    def table(self) -> str:
        """The components as ``optical energy`` prints them (J for the batch,
        J per token, share), the total, the energy per optical MAC and the
        lasers' average power."""
        tokens = self.batch * self.tokens
        total = self.total
        lines = [f"  {'component':18s} {'J (batch)':>11s} {'J/token':>11s} {'share':>7s}"]
        for name in self.component_names:
            value = self.components.get(name, 0.0)
            share = value / total if total > 0 else 0.0
            lines.append(f"  {name:18s} {value:11.4g} {value / tokens:11.4g} {share:7.1%}")
        lines.append(f"  {'total':18s} {total:11.4g} {self.per_token:11.4g} {1:7.1%}")
        macs = self.counts["macs"]
        if macs:
            lines.append(f"  per optical MAC: {self.per_mac * 1e12:.4g} pJ (laser "
                         f"{self.components['laser'] / macs * 1e12:.4g} pJ) over {macs:.4g} "
                         "MACs")
            lines.append(f"  lasers while streaming: {self.laser_power:.4g} W electrical "
                         "(average)")
        return "\n".join(lines)

    def __str__(self) -> str:
        """:meth:`table` (``print(report)``); ``repr`` keeps every field."""
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON-ready values (what ``optical energy --json``
        writes under ``optical``): energies in J, times in s, and the counts they come from."""
        return {
            "energy_j": {"total": self.total, "per_token": self.per_token,
                         "per_request": self.per_request, "per_mac": self.per_mac,
                         "components": dict(self.components),
                         "by_matmul": {k: dict(v) for k, v in self.by_matmul.items()},
                         "digital": dict(self.digital)},
            "ttft_s": self.ttft,
            "time_s": dict(self.time),
            "throughput_tokens_per_s": self.throughput,
            "laser_power_w": self.laser_power,
            "weights_resident": self.weights_resident,
            "faster_if_reloaded": (None if self.faster_if_reloaded is None
                                   else dict(self.faster_if_reloaded)),
            "cores": self.cores,
            "counts": dict(self.counts),
            "schedule": {"num_layers": self.num_layers,
                         "per_layer": {k: v.to_dict() for k, v in self.schedule.items()}},
        }


def prefill(spec: ModelSpec, tokens: int, config: OpticalConfig, *, batch: int = 1,
            model: str = "") -> PrefillEnergy:
    """Energy and time to first token of prefilling ``batch`` prompts of
    ``tokens`` tokens on the optical machine described by ``config``.

    Parameters
    ----------
    spec : ModelSpec
        From :func:`optical.transformer.read_spec`.
    tokens, batch : int
    config : OpticalConfig
    model : str
        A name for the report.

    Returns
    -------
    PrefillEnergy
        With ``cores`` at least the model's weight tiles the weights stay
        resident (no loads: the lowest energy). Optical attention's
        activation masks then get only the cores they leave, and with few
        left over reloading the weights every prefill is faster, for more
        energy: ``faster_if_reloaded`` then gives that schedule's TTFT and
        energy (so one more core past the weight tiles may lengthen the
        resident TTFT; the faster of the two never lengthens).

    Raises
    ------
    ValueError
        For non-positive counts, an infinite ``photons_per_mac``, ideal
        converters without an explicit energy, or an unquantised mask.
    """
    counts._check_spec(spec)
    check_config(config)
    _check_priced(config)
    tokens, batch = counts._check_counts(tokens, batch)
    spec.check_tokens(tokens)
    e = config.energy
    schedules = layer_schedule(spec, tokens, config, batch=batch)
    tiles = _weight_tiles(spec, schedules)
    if e.cores < tiles:
        return _price(spec, tokens, config, batch, model, schedules, tiles, resident=False)
    kept = _price(spec, tokens, config, batch, model, schedules, tiles, resident=True)
    if not any(n in counts.ACTIVATION_MASKS for n in schedules):
        return kept  # nothing competes for cores: resident is also the fastest
    # Resident weights hold `tiles` cores for good; optical attention's
    # activation masks then get only the cores left over, and with few left
    # reloading the weights and spreading every mask over all the cores is
    # faster (for more energy): say so beside the resident report.
    reloaded = _price(spec, tokens, config, batch, model, schedules, tiles, resident=False)
    if reloaded.ttft < kept.ttft:
        kept = dataclasses.replace(kept, faster_if_reloaded={"ttft_s": reloaded.ttft,
                                                             "energy_j": reloaded.total})
    return kept


def _total(spec: ModelSpec, tokens: int, config: OpticalConfig, batch: int) -> float:
    """``prefill(spec, tokens, config, batch=batch).total`` (J) without
    building the report (read-only mappings, the reloaded alternative) or
    checking the arguments again: for a caller that has checked them once
    and prices thousands of prompt lengths (``compare.break_even_tokens``;
    building the reports took a fifth to two fifths of its time)."""
    schedules = layer_schedule(spec, tokens, config, batch=batch)
    tiles = _weight_tiles(spec, schedules)
    return _price(spec, tokens, config, batch, "", schedules, tiles,
                  resident=config.energy.cores >= tiles, report=False)


def _weight_tiles(spec: ModelSpec, schedules: Mapping[str, Schedule]) -> int:
    """The weight tiles of the whole model: every layer's weight loads but
    the activation masks' (the cores that hold them all keep them resident)."""
    return spec.num_layers * sum(s.weight_loads for n, s in schedules.items()
                                 if n not in counts.ACTIVATION_MASKS)


def spare_cores(cores: int, tiles: int) -> int:
    """The cores optical attention's activation masks run on beside ``tiles``
    resident weight tiles: those the weights leave, or, with none left, one
    shared core (docs/energy.md, limitations)."""
    return max(1, cores - tiles)


def _price(spec: ModelSpec, tokens: int, config: OpticalConfig, batch: int, model: str,
           schedules: Mapping[str, Schedule], tiles: int, *, resident: bool,
           report: bool = True) -> PrefillEnergy | float:
    """:func:`prefill` with the weights resident (``cores >= tiles``) or
    reloaded every prefill; ``report`` False: its ``total`` alone."""
    e = config.energy
    layers = spec.num_layers
    spare = spare_cores(e.cores, tiles) if resident else e.cores

    components = dict.fromkeys(COMPONENTS, 0.0)
    by_matmul: dict[str, dict[str, float]] = {}
    work = span = streaming = 0.0  # per layer
    totals = dict.fromkeys((*_SUMMED, "mask_bytes"), 0)
    for name, s in schedules.items():
        activation = name in counts.ACTIVATION_MASKS
        loaded = activation or not resident
        parts = matmul_energy(s, config, resident=not loaded,
                              mask_source="sram" if activation else "dram")
        by_matmul[name] = {k: v * layers for k, v in parts.items()}
        for k, v in parts.items():
            components[k] += v * layers
        t = matmul_time(s, config, cores=spare if activation else e.cores,
                        resident=not loaded, activation=activation)
        work, span, streaming = work + t["work"], span + t["span"], streaming + t["streaming"]
        for k in _SUMMED:
            totals[k] += getattr(s, k) * layers
        if loaded:
            totals["mask_bytes"] += counts.mask_bytes(s, config) * layers

    # Digital work: the optical matmuls' decoding (already in the matmul
    # components above) and everything else (added here).
    items = {"decode": layers * counts.sum_work(
        {n: counts.matmul_work(s, config) for n, s in schedules.items()})}
    items.update({name: w * layers for name, w in counts.layer_work(
        spec, tokens, batch=batch, attention=config.mapping.attention).items()})
    items.update(counts.head_work(spec, tokens, batch=batch))
    digital = {name: w.ops * e.digital_energy_per_op + w.sram_bytes * e.sram_energy_per_byte
               + w.dram_bytes * e.dram_energy_per_byte for name, w in items.items()}
    rest = counts.sum_work({n: w for n, w in items.items() if n != "decode"})
    components["digital"] += rest.ops * e.digital_energy_per_op
    components["activation_memory"] += rest.sram_bytes * e.sram_energy_per_byte
    components["weight_memory"] += rest.dram_bytes * e.dram_energy_per_byte
    all_work = counts.sum_work(items)
    first_load = 0.0 if resident else 1.0 / e.mask_refresh_rate
    if resident:
        optics = layers * span
    else:
        optics = max(layers * work / e.cores, first_load + layers * span)
    time = {"mask_load": optics - layers * streaming, "streaming": layers * streaming,
            "digital": all_work.ops / e.digital_ops_per_s}
    components["static"] = e.static_power * e.cores * sum(time.values())
    if not report:
        return float(sum(components.values()))  # as PrefillEnergy.total sums them
    totals.update(digital_ops=all_work.ops, sram_bytes=all_work.sram_bytes,
                  dram_bytes=all_work.dram_bytes, weight_tiles=tiles,
                  rows_per_weight_load=batch * tokens)
    return PrefillEnergy(model=model, tokens=tokens, batch=batch, components=components,
                         by_matmul=by_matmul, digital=digital, time=time, counts=totals,
                         schedule=dict(schedules), num_layers=layers,
                         weights_resident=resident, cores=e.cores)
