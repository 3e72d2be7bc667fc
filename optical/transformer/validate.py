"""How accurate is one layer's prefill on the optical core, against the fp16 reference?

:func:`validate` runs a layer twice on the same input -- the reference with
Hugging Face numerics in ``dtype`` (fp16 by default) and the optical run --
and compares every product and the layer output: SQNR, cosine and relative
error, plus the passes, mask loads and conversions each product took (the
counts the energy model reads; they equal :func:`layer_schedule`'s but for
input channels a static outlier bypass routes around the optics, which
``stats.digital_macs`` counts, as for the dynamic policy, whose optical counts
stay the schedule's).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from optical import metrics, presets
from optical._frozen import frozen
from optical._gemm import cols_matmul, stack_matmul
from optical._progress import progress_bar
from optical._validation import all_finite, check_bool, check_positive_int, check_seed
from optical.calibration import subsample
from optical.config import OpticalConfig, check_config
from optical.core import MatmulStats
from optical.quant import calibration_needs
from optical.transformer._engines import (
    NORMED,
    check_hidden,
    check_options,
    derive_seed,
    largest_row_square_sum,
    norm_overflows,
    sum_stats,
    weight_matmuls,
)
from optical.transformer.numerics import check_dtype, largest, range_problem

__all__ = ["ProductReport", "ValidationReport", "validate", "worst_row_sqnr_db"]

#: Counts summed over a layer's optical products.
COUNTS = ("passes", "weight_loads", "dac_conversions", "adc_conversions", "detector_readouts",
          "macs")


@dataclasses.dataclass(frozen=True)
class ProductReport:
    """Accuracy of one product (or of the layer output) against the reference.

    Attributes
    ----------
    name : str
    optical : bool
        Whether it ran on the optical core (False: digital, its error is the
        error propagated from upstream).
    sqnr_db, cosine, relative_error : float
        Against the reference run's same tensor (errors accumulate along the layer).
    worst_token_sqnr_db : float or None
        The lowest SQNR of one token's output row (weight matmuls and layer
        output; None for the attention products, whose early query rows hold
        a handful of entries). Whole-tensor SQNR is dominated by the largest
        entries, so a token whose own features are lost next to a massive
        activation shows here, not there.
    worst_token : tuple of (int, int) or None
        Which row that is: (prompt, position) in the batch. After a Llama's
        super-weight layer, token 0 (BOS) carries the massive activations and
        most of the output's energy, so whole-tensor SQNR mostly measures it;
        the worst token is then usually another.
    local_sqnr_db : float or None
        With ``local=True``, for products on the optical core: the optical
        product against the exact float64 product of the same inputs it
        received (for the attention products, the raw ``a @ b`` of every
        (batch, KV head), before the scores' scaling and masking): the
        hardware's own error, without what came from upstream.
    stats : MatmulStats or None
        What it did on the hardware. For the attention products on the core
        (``mapping.attention = "optical"``), one matmul per (prompt, KV head)
        pooled: the counts, ``tokens`` and ``digital_channels`` add up over
        them, ``k_tiles``, ``n_tiles`` and ``input_passes`` are the first's,
        and the fractions (``digital_mac_fraction``, the clipped shares) are
        pooled over the MACs and conversions, so the single-matmul identities
        (``passes = tokens * k_tiles * n_tiles * input_passes``) need not
        hold where the static outlier bypass takes channels from some heads
        alone (it acts on these products too, on their own operands).
    """

    name: str
    optical: bool
    sqnr_db: float
    cosine: float
    relative_error: float
    worst_token_sqnr_db: float | None
    local_sqnr_db: float | None = None
    stats: MatmulStats | None = None
    worst_token: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The product's metrics and stats as JSON-ready values."""
        out = dataclasses.asdict(self)
        out["stats"] = None if self.stats is None else self.stats.to_dict()
        out["worst_token"] = None if self.worst_token is None else list(self.worst_token)
        return out


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """The result of :func:`validate`; :meth:`table` (and ``print``) renders it,
    :meth:`to_dict` serialises it.

    Attributes
    ----------
    model, architecture : str
        The model directory's name and "llama" or "bert".
    weights : str
        ``"checkpoint <dir>"`` or ``"synthetic (seed N)"``.
    layer, tokens, batch, seed : int
        What was run: the layer's index, the prompt length, the batch and the
        seed of the noise (and of the inputs, unless ``data_seed``).
    reference_dtype : str
        The reference's dtype ("float16" by default).
    config : OpticalConfig
    products : tuple of ProductReport
        One row per product, in execution order.
    output : ProductReport
        The layer's output hidden states. Its signal includes the residual
        stream the layer passes through exactly (its input), which adds no
        error: in later layers, whose residual is large next to what one
        layer adds, that alone raises the SQNR.
    update : ProductReport or None
        The same error against what the layer adds to its input (output
        minus input, ``"layer update"``): the hardware's effect on the layer's
        own contribution, comparable across depths. Llama layers only (None
        for BERT, whose post-norm layer passes nothing through unchanged).
        Its floor is the reference's own rounding of the residual stream,
        which the optical run does not round: on the ideal preset, tiny
        Llama, 45 dB against an fp16 reference (output 67 dB), 27 dB against
        bf16 (48 dB), 109 dB against float32.
    totals : mapping of str to float (read-only)
        Over the products on the optical core: the sums of the
        :class:`optical.Schedule` counts (``passes``, ``weight_loads``,
        ``dac_conversions``, ``adc_conversions``, ``detector_readouts``,
        ``macs``) and ``detected_photons``, the expected photons detected
        (the signal light that reached the detectors, far below the light the
        energy model charges for an always-on full-scale source; ``inf`` for
        the ideal source); ``digital_macs`` and ``digital_mac_fraction``, the
        MACs of input channels an outlier policy multiplied digitally and
        their share of these products' MACs; ``clipped_fraction``, the ADC
        conversions that clipped, and ``dac_clipped_fraction``, the DAC
        conversions a static input range clipped, each pooled over the
        products.
    timings : mapping of str to float (read-only), s
        Wall time, one part after another: ``setup_s`` (the layer's weights,
        read or synthesised, and its input), ``calibration_s`` (the held-out
        run; ~0 without calibration), ``reference_s``, ``optical_s`` (the
        optical run; ``program_s``, the part of it spent programming the
        masks) and ``compare_s`` (the metrics). Loading the model
        (:func:`load`) comes before the call.
    calibration_tokens : int or None
        Held-out tokens the weight matmuls were calibrated on (None: the
        config needs no calibration).
    calibration_prompts : int or None
        How many held-out prompts they came from, each as long as the scored
        prompts (``tokens``; ``calibration_tokens`` if fewer), their rows
        subsampled evenly to ``calibration_tokens``.
    data_seed : int or None
        Seed of the synthetic and held-out inputs when it was given apart
        from ``seed`` (None: ``seed`` seeded them).
    hidden_given : bool
        Whether the scored input was the caller's ``hidden`` (False: drawn
        by ``model.hidden_states``). The held-out calibration input is
        drawn either way: a ``hidden`` equal to it scores the calibration
        set itself, which no report field can tell.
    options : mapping (read-only)
        ``{"matmul_options": ..., "program_options": ...}`` as given (``{}``
        where none were): a backend or ``exact`` changes the numbers, so the
        report says which ran; a value that is not a JSON number, string,
        bool or None is recorded by its type (an array by its shape and
        dtype).
    notes : tuple of str
        What the numbers alone do not say, printed under the table: the
        products a norm takes next (Llama's o_proj; BERT's attention.output
        and output) with rows whose squares sum past float32's largest, or
        not finite, where the norm overflows on those rows (zeros out of
        an RMSNorm, the bias out of a LayerNorm: Llama's products after it
        then read 0.00 dB).
    """

    model: str
    architecture: str
    weights: str
    layer: int
    tokens: int
    batch: int
    seed: int
    reference_dtype: str
    config: OpticalConfig
    products: tuple[ProductReport, ...]
    output: ProductReport
    totals: Mapping[str, float]
    timings: Mapping[str, float]
    calibration_tokens: int | None = None
    data_seed: int | None = None
    update: ProductReport | None = None
    calibration_prompts: int | None = None
    hidden_given: bool = False
    notes: tuple[str, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {"matmul_options": {}, "program_options": {}})

    def __post_init__(self) -> None:
        frozen(self, "totals", "timings", "options")  # read-only (layer_metrics reads the
                                                        # first two)
        object.__setattr__(self, "notes", tuple(self.notes))

    def product(self, name: str) -> ProductReport:
        """The row of product ``name`` (``"down_proj"``, ``"attention.scores"``, ...)."""
        for row in self.products:
            if row.name == name:
                return row
        raise KeyError(f"no product {name!r}; products: "
                       f"{', '.join(r.name for r in self.products)}")

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values. ``optical validate --json`` writes
        these and the run's provenance beside them (the model's directory
        and digest, the config's source, :func:`optical.kernels.environment`
        and the versions): a report kept from Python keeps what computed it
        only if the caller adds those."""
        return {
            "model": self.model, "architecture": self.architecture, "weights": self.weights,
            "layer": self.layer, "tokens": self.tokens, "batch": self.batch, "seed": self.seed,
            "reference_dtype": self.reference_dtype, "config": self.config.to_dict(),
            "products": [p.to_dict() for p in self.products], "output": self.output.to_dict(),
            "update": None if self.update is None else self.update.to_dict(),
            "totals": dict(self.totals), "timings": dict(self.timings),
            "calibration_tokens": self.calibration_tokens,
            "calibration_prompts": self.calibration_prompts, "data_seed": self.data_seed,
            "hidden_given": self.hidden_given, "notes": list(self.notes),
            "options": {k: dict(v) for k, v in self.options.items()},
        }

    def __str__(self) -> str:
        """:meth:`table` (``print(report)``); ``repr`` keeps every field."""
        return self.table()

    def _calibration_label(self) -> str:
        if self.calibration_tokens is None:
            return ""
        prompts = self.calibration_prompts
        label = f"; calibrated on {self.calibration_tokens} held-out tokens"
        if prompts is not None:
            length = min(self.tokens, self.calibration_tokens)
            label += f" ({prompts} prompt{'s' if prompts > 1 else ''} of {length})"
        if any(p.optical for p in self.products if p.name in ATTENTION_PRODUCTS):
            label += ", attention products on their own operands"
        return label

    def _token_label(self, where: tuple[int, int] | None) -> str:
        if where is None:
            return ""
        return str(where[1]) if self.batch == 1 else f"{where[0]}:{where[1]}"

    def table(self, preset: str | None = None) -> str:
        """A plain-text table: one row per product, then the layer output and totals.

        ``preset`` names the hardware in the heading; by default the preset the
        config equals, else :func:`optical.presets.describe`'s nearest preset
        and the fields the config changes, else "custom config"."""
        hardware = preset or presets.describe(self.config)
        lines = [
            f"{self.model} layer {self.layer}: {self.tokens} tokens x {self.batch} prompt(s), "
            f"weights {self.weights}" + (", input given (hidden=)" if self.hidden_given else ""),
            f"hardware {hardware}; reference {self.reference_dtype} (Hugging Face numerics); "
            f"seed {self.seed}"
            + ("" if self.data_seed is None else f", data seed {self.data_seed}")
            + self._calibration_label(),
            "",
        ]
        local = any(p.local_sqnr_db is not None for p in self.products)
        # Inputs clipped at a static DAC range: a column where anything has one.
        dac = any(p.stats is not None and p.stats.dac_clipped_fraction for p in self.products) \
            or self.config.dac.scaling == "static"
        at_width = max(7, len(self._token_label((self.batch - 1, self.tokens - 1))))
        header = (f"{'product':18s} {'runs on':8s} {'SQNR dB':>8s} {'cosine':>9s} "
                  f"{'rel.err':>9s} {'worst dB':>9s} {'at':>{at_width}s}"
                  + (f" {'local dB':>8s}" if local else "")
                  + f" {'passes':>12s} {'mask loads':>10s} {'DAC conv':>12s} {'ADC conv':>12s}"
                  f" {'clipped':>8s}" + (f" {'DAC clip':>8s}" if dac else ""))
        lines += [header, "-" * len(header)]
        rows = (*self.products, self.output, *([self.update] if self.update else []))
        for row in rows:
            where = "optical" if row.optical else "-" if row is self.output \
                or row is self.update else "digital"
            text = (f"{row.name:18s} {where:8s} "
                    f"{row.sqnr_db:8.2f} {row.cosine:9.6f} {row.relative_error:9.2e} ")
            text += (" " * 9 if row.worst_token_sqnr_db is None
                     else f"{row.worst_token_sqnr_db:9.2f}")
            text += f" {self._token_label(row.worst_token):>{at_width}s}"
            if local:
                text += f" {row.local_sqnr_db:8.2f}" if row.local_sqnr_db is not None else " " * 9
            if row.stats is not None:
                s = row.stats
                text += (f" {s.passes:12d} {s.weight_loads:10d} {s.dac_conversions:12d} "
                         f"{s.adc_conversions:12d} {s.clipped_fraction:8.2%}")
                text += f" {s.dac_clipped_fraction:8.2%}" if dac else ""
            lines.append(text)
        t = self.totals
        pad = 18 + 1 + 8 + 1 + 8 + 1 + 9 + 1 + 9 + 1 + 9 + 1 + at_width + (9 if local else 0)
        clipped = f" {t['clipped_fraction']:8.2%}" if "clipped_fraction" in t else ""
        if dac and "dac_clipped_fraction" in t:
            clipped += f" {t['dac_clipped_fraction']:8.2%}"
        lines.append(f"{'total (optical)':{pad}s} {int(t['passes']):12d} "
                     f"{int(t['weight_loads']):10d} {int(t['dac_conversions']):12d} "
                     f"{int(t['adc_conversions']):12d}{clipped}")
        times = self.timings
        at = "token" if self.batch == 1 else "prompt:token"
        lines += ["", "SQNR, cosine and rel.err against the reference's same tensor; worst dB: "
                      f"the lowest SQNR of one token's row, at that {at}"
                      + ("; local dB: against the exact product of the inputs it received"
                         if local else ""),
                  f"optical MACs {int(t['macs']):d}; "
                      + (f"digital (outlier channels) MACs {int(t['digital_macs']):d}, "
                         f"{t['digital_mac_fraction']:.3%} of these products'; "
                         if t.get("digital_macs") else "")
                      + (f"layer and input {times['setup_s']:.2f} s, "
                         if "setup_s" in times else "")
                      + (f"calibration run {times['calibration_s']:.2f} s, "
                         if self.calibration_tokens is not None else "")
                      + f"reference {times['reference_s']:.2f} s, "
                      f"optical {times['optical_s']:.2f} s "
                      f"(programming the masks {times['program_s']:.2f} s)"
                      + (f", metrics {times['compare_s']:.2f} s" if "compare_s" in times else "")]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def validate(model: Any, *, layer: int, tokens: int, config: OpticalConfig, seed: int = 0,
             batch: int = 1, hidden: np.ndarray | None = None, dtype: str = "float16",
             local: bool = False, program_options: Mapping[str, Any] | None = None,
             matmul_options: Mapping[str, Any] | None = None,
             calibration_tokens: int | None = None, progress: bool = False,
             data_seed: int | None = None) -> ValidationReport:
    """Compare one layer's optical prefill with its reference.

    Parameters
    ----------
    model : LlamaModel, BertModel, or path of a model directory
    layer : int
    tokens : int
        Prompt length (positions 0..tokens-1).
    config : OpticalConfig
    seed : int
        Seed of the optical noise and, unless ``data_seed`` is given, of the
        synthetic input and the held-out calibration input. Not of the
        weights: a path is loaded as ``transformer.load(path)`` loads it
        (synthetic weights of seed 0 without a checkpoint; pass a model
        loaded with another ``seed`` for other ones).
    batch : int
        Prompts of ``tokens`` tokens, processed together (weights programmed once).
    hidden : ndarray, float32, shape (batch, tokens, hidden), optional
        The layer input ((tokens, hidden) when batch is 1); default:
        ``model.hidden_states(layer, tokens, seed=seed, batch=batch)``, with
        ``seed=data_seed`` when that is given.
    dtype : {"float16", "bfloat16", "float32"}
        Reference dtype.
    local : bool
        Also compute each optical product's error on its own inputs (one extra
        float64 GEMM per product): the weight matmuls', and the attention
        products' when ``mapping.attention = "optical"``.
    program_options, matmul_options : mapping, optional
        Passed to every ``optical.program`` / ``optical.matmul`` call: their
        keywords the layer does not set itself (``calibration``, except
        under a config that calibrates, where validate sets it;
        ``chunk_tokens``, ``backend``, ``exact``), checked before any work.
    calibration_tokens : int, optional
        When the config needs calibration (calibrated ADC windows, a static
        input range, static outlier channels), each weight matmul is
        calibrated on its inputs in a float32 reference run of this many
        held-out tokens (a different seed), drawn from ``model.hidden_states``
        even when ``hidden`` is given, as prompts as long as the scored ones
        (``tokens``, or this many if fewer), so that calibration sees the
        positions and attention spans it will score: as many prompts as hold
        this many tokens, and this many of their rows, evenly spaced
        (:func:`optical.calibration.subsample`).
        Default: ``config.calibration.max_tokens``, as many as programming
        uses, whatever the prompt length (a short prompt calibrated on itself
        alone is mostly scored on the luck of a small calibration set: 12.7
        against 24.5 dB for q_proj of Llama-3.2-1B's layer 1 at 8 tokens);
        given or by default, at most the model's ``max_position_embeddings``
        (a bound on the held-out run's memory). Before 2026-12-06 it was one
        prompt of that many tokens, whatever ``tokens``: all-MiniLM-L6-v2's
        layer 5 at 8 tokens read 14.7 dB at the output with 1.9 % of its
        conversions clipped, against 20.0 dB and 0.1 % now (iris-like, mean
        of seeds 0-2); Llama-3.2-1B moved within its seeds' spread. The
        attention products, whose operands are activations, calibrate on
        their own inputs.
    progress : bool
        Show a progress bar (tqdm, on stderr): the calibration run, the
        reference run, then each product on the optical core.
    data_seed : int, optional
        Seed of the data alone (the synthetic input and the held-out
        calibration input), so that runs of
        different ``seed`` differ in their noise only: error bars of the
        hardware's noise, without the luck of the input.

    Returns
    -------
    ValidationReport

    Raises
    ------
    ValueError
        Besides bad arguments: a ``hidden`` beyond the reference dtype's
        range (one it rounds to inf: fp16 from 65520), before anything runs,
        or a reference that overflows inside the layer (named by its first
        non-finite product), before the optical run: there is nothing finite
        to score against.
    """
    from optical.transformer.model import load

    seed = check_seed(seed)
    data = seed if data_seed is None else check_seed(data_seed, "data_seed")
    check_config(config)
    needs_calibration = bool(calibration_needs(config))
    # Before the model is loaded; under a calibrating config validate sets
    # every product's calibration itself (held-out tokens: calibration_tokens).
    check_options(program_options, matmul_options, calibrated_by="validate's own calibration "
                  "on held-out tokens (calibration_tokens; this config calibrates)"
                  if needs_calibration else None)
    if isinstance(model, str | os.PathLike):
        model = load(model)
    elif not (callable(getattr(model, "layer", None)) and hasattr(model, "spec")):
        raise TypeError("model: expected a model from optical.transformer.load or a model "
                        f"directory, got {type(model).__name__}")
    dtype = check_dtype(dtype)
    tokens = check_positive_int(tokens, "tokens")
    batch = check_positive_int(batch, "batch")
    local, progress = check_bool(local, "local"), check_bool(progress, "progress")
    if calibration_tokens is not None:
        calibration_tokens = check_positive_int(calibration_tokens, "calibration_tokens")
    begin = time.perf_counter()
    block = model.layer(layer)
    model.spec.check_tokens(tokens)
    hidden_given = hidden is not None
    if hidden is None:
        hidden = model.hidden_states(layer, tokens, seed=data, batch=batch)
    else:
        shape = getattr(hidden, "shape", None)
        # Its type, dtype, width and values named as this argument (the layer says h).
        hidden = check_hidden(hidden, model.spec.hidden_size, name="hidden")
        if hidden.shape[:2] != (batch, tokens):
            raise ValueError(f"hidden: expected shape ({batch}, {tokens}, hidden), got {shape}")
    _check_hidden_fits(hidden, dtype)  # the model's own states too (with its advice)

    on_core = len(weight_matmuls(block.weights))
    on_core += 2 if config.mapping.attention == "optical" else 0
    with progress_bar(on_core + 1 + needs_calibration, desc=f"{model.name} layer {block.index}",
                      enabled=progress, unit="step") as bar:
        calibration, calibration_prompts = None, None
        start = time.perf_counter()
        if needs_calibration:
            bar.set_postfix_str("calibration run")
            limit = model.spec.max_positions or math.inf  # a bound on this run's memory
            if calibration_tokens is None:
                calibration_tokens = min(config.calibration.max_tokens, limit)
            elif calibration_tokens > limit:
                raise ValueError(f"calibration_tokens: {calibration_tokens} exceed "
                                 f"max_position_embeddings {limit}, the bound on the held-out "
                                 "tokens (drawn as prompts of the scored length)")
            # Prompts of the scored prompts' length (their positions and
            # attention spans, as in use); calibration_tokens rows of them,
            # evenly spaced (a last prompt cut short would over-sample the
            # first positions).
            length = min(tokens, calibration_tokens)
            calibration_prompts = -(-calibration_tokens // length)
            held_out = model.hidden_states(layer, length, seed=derive_seed(data, "calibration"),
                                           batch=calibration_prompts)
            calibration = {name: subsample(rows, calibration_tokens) for name, rows in
                           block.matmul_inputs(held_out, dtype="float32").items()}
            bar.update()

        bar.set_postfix_str(f"{dtype} reference")
        calibrated = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore"):  # named below, once
            reference = block.trace(hidden, dtype=dtype)
        _check_reference_finite(reference, dtype)
        middle = time.perf_counter()
        bar.update()

        running: list[str] = []  # the product on the core: the bar names it

        def starting(name: str) -> None:
            if running:
                bar.update()  # the one before it is done
            running[:] = [name]
            bar.set_postfix_str(name)

        run = block.trace(hidden, config=config, seed=seed, program_options=program_options,
                          matmul_options=matmul_options, calibration=calibration,
                          progress=starting)
        if running:
            bar.update()
        end = time.perf_counter()

    rows = []
    for name, value in run.products.items():
        ref = reference.products[name]
        local_db = None
        if local and name in run.inputs:
            local_db = metrics.sqnr_db(_exact_linear(block, name, run.inputs[name]), value)
        elif local and name in run.operands:  # optical attention: per (batch, KV head)
            a, b, raw = run.operands[name]
            local_db = metrics.sqnr_db(stack_matmul(a.astype(np.float64), b.astype(np.float64)),
                                       raw)
        rows.append(_compare(name, name in run.stats, ref, value, tokens, local_db,
                             run.stats.get(name)))
    output = _compare("layer output", False, reference.output, run.output, tokens)
    # The output's error against what the layer adds: both runs' output less
    # the one input they share, so the error is the output's own. (A BERT
    # layer normalises its sum: nothing passes through to subtract.)
    update = None
    if model.spec.architecture == "llama":
        residual = np.asarray(hidden, dtype=np.float32).reshape(reference.output.shape)
        update = _compare("layer update", False, reference.output - residual,
                          run.output - residual, tokens)
    # Every weight matmul runs on the core, so there is always a product to pool:
    # counts add, the digital share and the clipping are pooled.
    stats = list(run.stats.values())
    pooled = sum_stats(stats)
    totals: dict[str, float] = {k: getattr(pooled, k) for k in COUNTS}
    totals["detected_photons"] = math.fsum(s.detected_photons for s in stats)
    totals.update({k: getattr(pooled, k)
                   for k in ("digital_macs", "digital_mac_fraction", "clipped_fraction",
                             "dac_clipped_fraction")})
    finished = time.perf_counter()
    return ValidationReport(
        model=model.name, architecture=model.spec.architecture, weights=model.weights_source,
        layer=block.index, tokens=tokens, batch=batch, seed=seed, reference_dtype=dtype,
        config=config, products=tuple(rows), output=output, update=update, totals=totals,
        timings={"setup_s": start - begin, "calibration_s": calibrated - start,
                 "reference_s": middle - calibrated, "optical_s": end - middle,
                 "program_s": run.program_s, "compare_s": finished - end},
        calibration_tokens=calibration_tokens if needs_calibration else None,
        calibration_prompts=calibration_prompts,
        data_seed=None if data_seed is None else data, hidden_given=hidden_given,
        notes=_overflow_notes(run.products),
        options={"matmul_options": _recorded(matmul_options),
                 "program_options": _recorded(program_options)})


def _recorded(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` as the report records them: JSON numbers, strings, bools
    and None as they are, anything else by its type (an array by its shape
    and dtype)."""
    record = {}
    for key, value in (options or {}).items():
        if value is None or isinstance(value, bool | int | float | str):
            record[str(key)] = value
        elif isinstance(value, np.generic):
            record[str(key)] = value.item()
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            record[str(key)] = f"{type(value).__name__} {tuple(value.shape)} {value.dtype}"
        else:
            record[str(key)] = type(value).__name__
    return record


def _overflow_notes(products: Mapping[str, np.ndarray]) -> list[str]:
    """A note naming the products a norm takes next whose rows' squares sum
    past float32's largest (or that are not finite): the norm, which sums
    them in float32, overflows there (an RMSNorm row comes out as zeros, a
    LayerNorm row as its bias), and what comes after scores what that
    leaves (0.00 dB, no error of its own, where it is zeros)."""
    over = norm_overflows({name: largest_row_square_sum(value)
                           for name, value in products.items() if name in NORMED})
    if not over:
        return []
    names = ", ".join(over)
    return [f"{names}: rows whose squares sum past float32's largest ({largest('float32'):.3g}; "
            f"up to "
            f"{max(over.values()):.3g}): the norm after {'it' if len(over) == 1 else 'them'} "
            "overflows on those rows (they come out as zeros, or as a LayerNorm's bias "
            "alone), and what follows scores what that leaves; lower the noise (e.g. "
            "detector.read_noise_electrons) or check the input"]


#: The products of activations with activations (per head, not per token);
#: every other product is a weight matmul or the layer output, one row per token.
ATTENTION_PRODUCTS = ("attention.scores", "attention.values")


def _check_hidden_fits(hidden: Any, dtype: str) -> None:
    """ValueError where the input exceeds the reference dtype's range (fp16
    from 65520, which rounds to inf): the reference would be inf and NaN,
    nothing to score. ``hidden``: float32 and finite (``check_hidden``'s, or
    the model's own states)."""
    problem = range_problem(hidden, dtype, "hidden")
    if problem is not None:
        raise ValueError(f"{problem}; {_wider(dtype)}")


def _check_reference_finite(reference: Any, dtype: str) -> None:
    """ValueError, before the optical run, where the reference overflows its
    dtype inside the layer: there is nothing finite to score against."""
    if np.isfinite(reference.output).all():
        return
    where = next((name for name, value in reference.products.items()
                  if not np.isfinite(value).all()), "the layer output")
    raise ValueError(f"the {dtype} reference holds inf or NaN from {where} on (a value "
                     f"beyond {dtype}'s largest, {largest(dtype):.4g}): nothing finite to "
                     f"score against; {_wider(dtype, 'check the weights and the input')}")


def _wider(dtype: str, otherwise: str = "scale the input down") -> str:
    """What to try instead: a wider reference dtype, or ``otherwise``."""
    if dtype == "float16":
        return "validate with dtype='bfloat16' or 'float32'"
    return otherwise


def worst_row_sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Lowest SQNR (dB) of one row (last axis) among rows whose reference is
    not zero (float64 sums, a block of rows at a time)."""
    return worst_row(reference, test)[0]


def worst_row(reference: np.ndarray, test: np.ndarray) -> tuple[float, tuple[int, ...] | None]:
    """:func:`worst_row_sqnr_db` and that row's index over the leading axes
    (the first such row on a tie; None when every reference row is zero).
    Each row pair is scaled by its own power of two first (exact, so no
    ratio moves; float64 rows near 1e200 gave NaN, near 1e-200 "every row
    zero"); NaN or inf is refused, as :mod:`optical.metrics` refuses it."""
    reference, test = np.asarray(reference), np.asarray(test)
    ref = reference.reshape(-1, reference.shape[-1])
    out = test.reshape(ref.shape)
    for name, arr in (("reference", ref), ("test", out)):
        if not all_finite(arr):
            raise ValueError(f"{name} contains NaN or infinite values")
    rows = max(1, metrics.SUM_CHUNK // max(ref.shape[1], 1))
    signal, noise = np.empty(ref.shape[0]), np.empty(ref.shape[0])
    for r0 in range(0, ref.shape[0], rows):
        r, o = (a[r0:r0 + rows].astype(np.float64) for a in (ref, out))
        top = np.maximum(np.abs(r).max(axis=1, initial=0.0), np.abs(o).max(axis=1, initial=0.0))
        shift = -np.frexp(top)[1][:, None]  # 2**e at or above each row's largest magnitude
        r, o = np.ldexp(r, shift), np.ldexp(o, shift)
        err = r - o
        signal[r0:r0 + rows] = np.einsum("ij,ij->i", r, r)
        noise[r0:r0 + rows] = np.einsum("ij,ij->i", err, err)
    keep = np.flatnonzero(signal > 0)
    if not keep.size:
        return (math.inf if not noise.any() else -math.inf), None
    with np.errstate(divide="ignore"):
        db = 10 * np.log10(signal[keep] / noise[keep])
    row = int(keep[np.argmin(db)])
    return float(db.min()), tuple(int(i) for i in np.unravel_index(row, reference.shape[:-1]))


def _compare(name: str, on_core: bool, reference: np.ndarray, test: np.ndarray, tokens: int,
             local_db: float | None = None, stats: MatmulStats | None = None) -> ProductReport:
    # Float64 sums a block at a time: no float64 copy of a whole product.
    worst, where = None, None
    if name not in ATTENTION_PRODUCTS:
        # A weight matmul's rows are (batch * tokens) tokens, the output's (batch, tokens):
        # as (batch, tokens, features), the worst row is named (prompt, position).
        worst, where = worst_row(reference.reshape(-1, tokens, reference.shape[-1]),
                                 test.reshape(-1, tokens, test.shape[-1]))
    return ProductReport(name, on_core, *metrics.compare(reference, test), worst, local_db, stats,
                         worst_token=where)


def _exact_linear(block: Any, name: str, x: np.ndarray) -> np.ndarray:
    """The float64 product ``x @ W.T (+ bias)`` of weight matmul ``name``."""
    x64 = x.astype(np.float64)
    y = cols_matmul(x64.reshape(-1, x64.shape[-1]), block.weights[name].T.astype(np.float64))
    y = y.reshape(*x64.shape[:-1], y.shape[-1])
    bias = block.weights.get(name + ".bias")
    return y if bias is None else y + bias
