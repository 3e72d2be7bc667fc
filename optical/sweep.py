"""Parameter sweeps: a grid (or random sample) of config values x seeds, run on
local processes or a Dask cluster, resumable, ending in a tidy DataFrame.

>>> import optical
>>> wl = optical.MatmulWorkload(tokens=16, k=64, n=32)
>>> df = optical.sweep(wl, {"adc.bits": [4, 6, 8]}, seeds=2, out="runs/adc",
...                    executor="serial", progress=False)            # doctest: +SKIP
>>> df.groupby("adc.bits")["sqnr_db"].mean()                          # doctest: +SKIP

On disk, ``out/`` holds:

- ``manifest.json``: the sweep definition (workload, base config, parameters,
  seeds, sampling), its hash, the list of points and their run ids, the
  library version;
- ``runs/<run_id>.json``: one file per finished (point, seed), written
  atomically (temporary file + ``os.replace``) the moment the run finishes,
  with the point's values, its metrics, its full config, the seed, the
  library version and the run time;
- ``results.parquet`` (or ``.csv``): every run as one table, rewritten when a
  sweep call completes.

A run is identified by a hash of (workload, full config, seed, results
version). Re-running the same sweep skips the runs already on disk, so a
killed sweep loses only the runs in flight; a sweep whose definition differs
from the manifest's, or that another results version began, is refused with
the list of what changed. If the manifest is lost or damaged,
delete it and start the same sweep again: the new manifest finds the finished
runs by their ids. :func:`load` reads the runs back.

The module is light to import: pandas, tqdm and the executors' dependencies
(the ``sweep`` extra) are imported when a sweep runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import math
import numbers
import os
import reprlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical import presets
from optical._executors import (
    DaskExecutor,
    Executor,
    ProcessExecutor,
    SerialExecutor,
    Task,
    check_not_bootstrapping,
    evaluate,
    make_executor,
)
from optical._files import atomic_write, replacing
from optical._progress import progress_bar
from optical._sweep_store import (
    FORMAT,
    MANIFEST,
    META_COLUMNS,
    RUNS,
    SWEEP_FILES,
    WORKLOAD_PREFIX,
    _rebuild_advice,
    check_placement,
    content_hash,
    damaged_runs,
    decode_value,
    encode,
    library_version,
    lock,
    read_frame,
    read_manifest,
    results_version,
    write_run,
)
from optical._validation import check_bool, check_positive_int, check_seed, missing_or_broken
from optical._version import RESULTS_VERSION
from optical.config import UNREAD_CONDITIONS, OpticalConfig, check_value, parse_value
from optical.workloads import (
    BUILTIN_KINDS,
    LayerWorkload,
    MatmulWorkload,
    check_own_kind,
    clear_caches,
    workload_from_dict,
    workload_label,
)

__all__ = ["MAX_RUNS", "DaskExecutor", "Executor", "LayerWorkload", "MatmulWorkload",
           "ProcessExecutor", "Range", "SerialExecutor",
           "SweepDefinition", "SweepError", "SweepSummary", "Task", "Terminated", "evaluate",
           "execute", "load",
           "parse_swept_value", "read_manifest", "resume", "stored_definition", "sweep"]


#: Most runs (points x seeds) of one sweep: each run is a file of its own.
MAX_RUNS = 10**6


class SweepError(RuntimeError):
    """A run of the sweep failed; the runs finished before it are kept."""


class Terminated(SystemExit):
    """SIGTERM under :func:`sigterm_as_exit`: a SystemExit with code 143, so
    the sweep stops its workers and keeps its finished runs, and the CLI can
    say how to resume."""


@dataclasses.dataclass(frozen=True)
class Range:
    """A continuous range of values for random sampling: uniform in [lo, hi]
    (in log space when ``log``); for an integer field each integer of
    [lo, hi] equally likely, or with ``log`` as likely as its share of
    [lo - 1/2, hi + 1/2] in log space."""

    lo: float
    hi: float
    log: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"range": [self.lo, self.hi], "log": self.log}


# --------------------------------------------------------------------------- #
# Definition
# --------------------------------------------------------------------------- #


def _canonical(path: str, value: Any) -> Any:
    """The value as the config stores it (ints of real fields become floats);
    ValueError names the path and the value. Combinations of fields are
    checked later, point by point."""
    if isinstance(value, np.generic):
        value = value.item()
    return check_value(path, value)


def parse_swept_value(path: str, text: str) -> Any:
    """A swept value from the command line: a config path's as
    :func:`optical.config.parse_value` parses it (ValueError: an unknown path
    or a bad value); a workload field's (``workload.layer``) as an integer, a
    float, true / false, none, or else the text itself (the workload checks
    it when the sweep is built)."""
    if not path.startswith(WORKLOAD_PREFIX):
        return parse_value(path, text)
    text = text.strip()
    if text.lower() in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[text.lower()]
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _workload_field(workload: Any, path: str) -> dataclasses.Field:
    """The workload field a ``workload.*`` path names; ValueError if the
    workload has no such field (or no fields: only a dataclass's are swept)."""
    name = path.removeprefix(WORKLOAD_PREFIX)
    if not dataclasses.is_dataclass(workload) or isinstance(workload, type):
        raise ValueError(f"{path}: {type(workload).__name__} is not a dataclass, so none of its "
                         "fields can be swept; sweep config paths")
    fields = {field.name: field for field in dataclasses.fields(workload)}
    if name not in fields:
        raise ValueError(f"{path}: {type(workload).__name__} has no field {name!r}; its "
                         f"fields: {', '.join(fields)}")
    if fields[name].metadata.get("derived"):
        raise ValueError(f"{path}: {type(workload).__name__} derives {name} from its other "
                         "fields (and what they point to); it is not swept")
    return fields[name]


def _with_fields(workload: Any, changes: Mapping[str, Any]) -> Any:
    """``workload`` with the ``workload.*`` values of ``changes`` (a copy,
    validated by its own constructor: its ValueError names the field). The
    fields it derives (``metadata={"derived": True}``: a LayerWorkload's
    checkpoint fingerprint) are derived again, not carried over."""
    fields = {path.removeprefix(WORKLOAD_PREFIX): value for path, value in changes.items()}
    if not fields:
        return workload
    for field in dataclasses.fields(workload):
        if field.metadata.get("derived"):
            fields[field.name] = field.default
    return dataclasses.replace(workload, **fields)


def _canonical_field(workload: Any, path: str, value: Any) -> Any:
    """The value as the workload stores it (a model directory as an absolute
    path), or as given where the base workload refuses it: a value may be
    valid only beside the other values of its point (layer 20 with another
    model_dir), which :meth:`SweepDefinition.workloads` checks point by
    point. ValueError names the path and a value that cannot be stored."""
    field = _workload_field(workload, path)
    if isinstance(value, np.generic):
        value = value.item()
    try:
        stored = getattr(_with_fields(workload, {path: value}), field.name)
    except (ValueError, TypeError, OSError):
        stored = value
        if field.metadata.get("path") and isinstance(value, str | os.PathLike):
            stored = str(Path(value).expanduser().resolve())  # as the workload stores it
    if stored is not None and not isinstance(stored, bool | int | float | str):
        raise ValueError(f"{path}: {value!r} is stored as a {type(stored).__name__}; only "
                         "numbers, strings, booleans and None can be swept")
    return stored


def _split(point: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A point's config values and its workload values."""
    config = {p: v for p, v in point.items() if not p.startswith(WORKLOAD_PREFIX)}
    return config, {p: v for p, v in point.items() if p.startswith(WORKLOAD_PREFIX)}


@dataclasses.dataclass(frozen=True)
class SweepDefinition:
    """What a sweep runs: a workload, a base config, values of dotted config
    paths and of the workload's fields (``workload.layer``: a grid, or
    ``samples`` random points), and seeds.

    Build it with :meth:`build`, which validates everything before any run.
    """

    workload: Any
    base: OpticalConfig
    params: tuple[tuple[str, tuple[Any, ...] | Range], ...]
    seeds: tuple[int, ...]
    samples: int | None = None
    sample_seed: int = 0

    @classmethod
    def build(cls, workload: Any, params: Mapping[str, Any], *, seeds: int | Sequence[int],
              base: str | OpticalConfig = "iris-like", samples: int | None = None,
              sample_seed: int = 0, check_points: bool = True) -> SweepDefinition:
        """Validate a sweep definition; every error names the offending input.

        Parameters
        ----------
        workload : MatmulWorkload, LayerWorkload or any object with
            ``run(config, seed) -> dict`` and ``to_dict()`` (and, optionally,
            ``check_seed(seed)`` and ``check_config(config)``, which raise
            ValueError for a seed or a point's config it cannot run: checked
            here, before any run)
        params : mapping of dotted path to a sequence of values or a Range
            A config path (``adc.bits``), or ``workload.<field>`` for a field
            of a dataclass workload (``workload.layer``,
            ``workload.tokens``), given a list of values (a Range needs a
            config field)
        seeds : int (that many seeds, 0, 1, ...) or a sequence of seeds
        base : preset name or OpticalConfig
        samples : int, optional
            Random sampling: this many draws, each value drawn uniformly from
            its list or :class:`Range` (integers for integer fields);
            identical draws count as one point. Default: the full grid.
        sample_seed : int
            Seed of the random sampling.
        check_points : bool
            Run the workload's ``check_config`` on every point (~0.3 s for
            each new lens geometry, once). :meth:`from_dict` skips it: a
            stored sweep runs its manifest's points, checked when it was made.
        """
        for attr in ("run", "to_dict"):
            if not callable(getattr(workload, attr, None)):
                raise TypeError(f"workload: {type(workload).__name__} has no {attr}() method")
        if check_points:  # (a stored sweep resumes with the object that made it)
            check_own_kind(workload)
        if isinstance(base, str):
            base = presets.get(base)
        if not isinstance(base, OpticalConfig):
            raise TypeError(f"base: expected a preset name or an OpticalConfig, got "
                            f"{type(base).__name__}")
        if not isinstance(params, Mapping):
            raise TypeError(f"params: expected a mapping of dotted paths to values, got "
                            f"{type(params).__name__}")
        if samples is not None:
            samples = check_positive_int(samples, "samples")
            _check_runs(samples, "samples", "random points")
        canonical: list[tuple[str, tuple[Any, ...] | Range]] = []
        for path, values in params.items():
            if not isinstance(path, str):
                raise TypeError(f"params: a path must be a string, got {path!r}")
            canonical.append((path, _check_param(path, values, random=samples is not None,
                                                 workload=workload)))
        if check_points:  # a stored sweep runs its manifest's points, all valid
            _check_range_ends(canonical, base)
        seeds = _check_seeds(seeds)
        if samples is None:
            _check_runs(math.prod(len(values) for _, values in canonical) * len(seeds),
                        "params, seeds", "runs (grid points x seeds)")
        else:
            _check_runs(samples * len(seeds), "samples, seeds", "runs (points x seeds)")
        definition = cls(workload=workload, base=base, params=tuple(canonical),
                         seeds=seeds, samples=None if samples is None
                         else int(samples), sample_seed=_named_seed(sample_seed, "sample_seed"))
        points = definition.points()
        configs = definition.configs(points)  # every point's config is valid, or ValueError now
        workloads = definition.workloads(points)  # and every point's workload
        keys = [content_hash(each.to_dict()) for each in workloads]
        for each in dict(zip(keys, workloads, strict=True)).values():
            if callable(getattr(each, "check_seed", None)):
                for seed in seeds:
                    each.check_seed(seed)
        if check_points:
            _check_read(definition)
            checked: set[tuple[str, OpticalConfig]] = set()
            for point, config, each, name in zip(points, configs, workloads, keys, strict=True):
                key = (name, config)
                if key not in checked and callable(getattr(each, "check_config", None)):
                    try:
                        each.check_config(config)
                    except ValueError as err:
                        raise ValueError(f"point {_describe_point(point)}: {err}") from None
                    checked.add(key)
        return definition

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.params]

    def points(self) -> list[dict[str, Any]]:
        """The parameter values of every point, in run order."""
        if self.samples is None:
            grid = itertools.product(*(values for _, values in self.params))
            return [dict(zip(self.paths, combo, strict=True)) for combo in grid]
        rng = np.random.default_rng(self.sample_seed)
        points: list[dict[str, Any]] = []
        seen: set[str] = set()
        # Drawn in the paths' sorted order, as the definition's hash sees them:
        # the order the params are given in does not change the points.
        drawn = sorted(self.params, key=lambda item: item[0])
        for _ in range(self.samples):
            values = {path: _draw(rng, path, spec) for path, spec in drawn}
            point = {path: values[path] for path in self.paths}
            key = content_hash(point)
            if key not in seen:  # identical draws are one point
                seen.add(key)
                points.append(point)
        return points

    def configs(self, points: Sequence[Mapping[str, Any]] | None = None) -> list[OpticalConfig]:
        """The full config of every point; ValueError names a point that
        makes an invalid combination."""
        configs = []
        for point in self.points() if points is None else points:
            try:
                configs.append(self.base.replace(_split(point)[0]))
            except ValueError as err:
                raise ValueError(f"point {_describe_point(point)}: {err}") from None
        return configs

    def workloads(self, points: Sequence[Mapping[str, Any]] | None = None) -> list[Any]:
        """The workload of every point: the definition's, with the point's
        ``workload.*`` values; ValueError names a point that makes an invalid
        combination (more outlier channels than ``k``, say)."""
        made: dict[str, Any] = {}
        workloads = []
        for point in self.points() if points is None else points:
            changes = _split(point)[1]
            key = content_hash(changes)
            if key not in made:
                try:
                    made[key] = _with_fields(self.workload, changes)
                except (ValueError, TypeError, OSError) as err:
                    raise ValueError(f"point {_describe_point(point)}: {err}") from None
            workloads.append(made[key])
        return workloads

    @property
    def label(self) -> str:
        """The workload's label, without the fields the sweep sweeps."""
        swept = {p.removeprefix(WORKLOAD_PREFIX) for p in self.paths
                 if p.startswith(WORKLOAD_PREFIX)}
        if swept:
            return workload_label(self.workload.to_dict(), swept=swept)
        return getattr(self.workload, "label", type(self.workload).__name__)

    def to_dict(self) -> dict[str, Any]:
        params = {path: spec.to_dict() if isinstance(spec, Range) else list(spec)
                  for path, spec in self.params}
        return encode({
            "workload": self.workload.to_dict(),
            "base_config": json.loads(self.base.to_json()),
            "params": params,
            "sampling": "grid" if self.samples is None else "random",
            "samples": self.samples,
            "sample_seed": self.sample_seed,
            "seeds": list(self.seeds),
        })

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], workload: Any = None) -> SweepDefinition:
        """Inverse of :meth:`to_dict`; ``workload`` overrides a custom one."""
        if workload is None:
            workload = workload_from_dict(data["workload"])
        base = OpticalConfig.from_dict(data["base_config"])
        params: dict[str, Any] = {}
        for path, spec in data["params"].items():
            if isinstance(spec, Mapping):
                lo, hi = spec["range"]
                params[path] = Range(decode_value(path, lo), decode_value(path, hi),
                                     bool(spec.get("log", False)))
            else:
                params[path] = [decode_value(path, v) for v in spec]
        return cls.build(workload, params, seeds=data["seeds"], base=base,
                         samples=data.get("samples"), sample_seed=data.get("sample_seed", 0),
                         check_points=False)

    @property
    def hash(self) -> str:
        return content_hash(self.to_dict())

    def run_id(self, config: OpticalConfig, seed: int, workload: Any = None) -> str:
        """Stable identity of one run: a hash of (workload, full config, seed,
        results version); ``workload`` is the point's (default: the
        definition's)."""
        return self.run_ids(config, (seed,), workload)[0]

    def run_ids(self, config: OpticalConfig, seeds: Sequence[int],
                workload: Any = None) -> list[str]:
        """:meth:`run_id` of ``config`` at each of ``seeds`` (the workload and
        config serialised once)."""
        workload = _hashed(self.workload if workload is None else workload)
        data = json.loads(config.to_json())
        # The results version too: a run another version computed differently
        # is never taken for this one's (copied runs, a rebuilt manifest).
        return [content_hash({"workload": workload, "config": data, "seed": seed,
                              "results_version": RESULTS_VERSION})
                for seed in seeds]


def _named_seed(value: Any, name: str) -> int:
    """``check_seed`` with the argument's name in the message."""
    try:
        return check_seed(value)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {str(err).removeprefix('seed: ')}") from None


def _check_runs(runs: int, name: str, what: str) -> None:
    if runs > MAX_RUNS:
        raise ValueError(f"{name}: {runs} {what} are more than a sweep holds (at most "
                         f"{MAX_RUNS} runs, a file each); split it into several sweeps")


def _check_seeds(seeds: Any) -> tuple[int, ...]:
    if isinstance(seeds, numbers.Integral) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"seeds: {seeds} must be a positive number of seeds")
        _check_runs(seeds, "seeds", "seeds")
        return tuple(range(int(seeds)))
    if isinstance(seeds, np.ndarray):
        if seeds.ndim != 1 or (seeds.size and seeds.dtype.kind not in "iu"):
            raise ValueError(f"seeds: an array of seeds must be 1-D and of integers, got "
                             f"shape {seeds.shape} and dtype {seeds.dtype}")
        _check_runs(seeds.size, "seeds", "seeds")
        seeds = seeds.tolist()
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence) or len(seeds) == 0:
        raise ValueError(f"seeds: {seeds!r} must be a positive count or a non-empty "
                         "sequence of seeds")
    _check_runs(len(seeds), "seeds", "seeds")  # before each is checked (range(10**11))
    checked = tuple(_named_seed(s, "seeds") for s in seeds)
    if len(set(checked)) != len(checked):
        raise ValueError(f"seeds: {list(checked)} repeats a seed")
    return checked


def _check_param(path: str, values: Any, *, random: bool,
                 workload: Any) -> tuple[Any, ...] | Range:
    if path.startswith(WORKLOAD_PREFIX):
        _workload_field(workload, path)
        if isinstance(values, Range):
            raise ValueError(f"{path}: a Range needs a config field; give a list of the "
                             "workload's values (random sampling draws from it)")
        return _checked_values(path, values,
                               lambda path, v: _canonical_field(workload, path, v))
    spec = OpticalConfig.field_spec(path)  # ValueError: unknown config path
    if isinstance(values, Range):
        if not random:
            raise ValueError(f"{path}: a Range needs random sampling (samples=N; CLI: "
                             "--samples N); give a list of values for a grid")
        if spec["kind"] not in ("int", "real"):
            raise ValueError(f"{path}: a Range needs a numeric field, not a {spec['kind']}")
        lo, hi = _canonical(path, values.lo), _canonical(path, values.hi)
        if lo is None or hi is None:  # an optional field's None is not a bound
            raise ValueError(f"{path}: range [{values.lo}, {values.hi}] needs a number at "
                             "each end")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"{path}: range [{values.lo}, {values.hi}] must be finite with "
                             "lo < hi")
        if values.log and lo <= 0:
            raise ValueError(f"{path}: a log range needs lo > 0, got {values.lo}")
        return Range(lo, hi, check_bool(values.log, f"{path}: Range log"))
    return _checked_values(path, values, _canonical)


def _check_range_ends(params: Sequence[tuple[str, Any]], base: OpticalConfig) -> None:
    """Refuse a Range whose ends the base config does not allow (a photon
    count past 1e30, ADC bits at or below the ENOB loss): otherwise whether
    the sweep is accepted depends on where ``sample_seed``'s draws land. A
    Range sharing its section with another swept path is left to the
    points' own check (that path may make its ends valid)."""
    for path, values in params:
        if not isinstance(values, Range):
            continue
        section = path.split(".")[0]
        if any(other != path and other.split(".")[0] == section for other, _ in params):
            continue
        for end in (values.lo, values.hi):
            try:
                base.replace({path: end})
            except ValueError as err:
                raise ValueError(f"{path}: the Range [{values.lo:g}, {values.hi:g}] reaches "
                                 f"{end:g}, which the base config does not allow ({err}); "
                                 "every draw must be valid, whatever sample_seed") from None


def _checked_values(path: str, values: Any, canonical: Any) -> tuple[Any, ...]:
    """A grid parameter's values, each ``canonical(path, value)``, none twice."""
    if isinstance(values, np.ndarray) and values.ndim == 0:
        values = [values[()]]  # the one value it holds, as a numpy scalar
    elif isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        values = [values]
    if len(values) == 0:
        raise ValueError(f"{path}: no values given")
    _check_runs(len(values), path, "values")  # before each is checked
    checked = tuple(canonical(path, v) for v in values)
    try:
        seen = set(checked)
    except TypeError:  # values that do not hash: compared pairwise
        seen = None
    if seen is None or len(seen) != len(checked):
        for i, value in enumerate(checked):
            if value in checked[:i]:
                raise ValueError(f"{path}: value {value!r} is given twice")
    return checked


def _draw(rng: np.random.Generator, path: str, spec: tuple[Any, ...] | Range) -> Any:
    if not isinstance(spec, Range):
        return spec[int(rng.integers(len(spec)))]
    integer = OpticalConfig.field_spec(path)["kind"] == "int"
    if integer and not spec.log:
        return _canonical(path, int(rng.integers(spec.lo, spec.hi, endpoint=True)))
    if spec.log:  # an integer's share of the log range: rounding reaches it from both sides
        pad = 0.5 if integer else 0.0
        lo, hi = math.log(spec.lo - pad), math.log(spec.hi + pad)
    else:
        lo, hi = spec.lo, spec.hi
    value = float(rng.uniform(lo, hi))
    value = math.exp(value) if spec.log else value
    if integer:
        value = int(min(max(round(value), spec.lo), spec.hi))
    else:  # exp(log(lo)) may round an ulp below lo (or past hi)
        value = min(max(value, spec.lo), spec.hi)
    return _canonical(path, value)


def _describe_point(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items()) or "(base config)"


# --------------------------------------------------------------------------- #
# Reading a sweep back (its files: optical._sweep_store)
# --------------------------------------------------------------------------- #


def stored_definition(out: str | os.PathLike, workload: Any = None) -> SweepDefinition:
    """The definition of the sweep in ``out``, rebuilt from its manifest
    (``workload`` for a custom workload the manifest cannot rebuild);
    ValueError names the manifest when it cannot be rebuilt."""
    manifest = read_manifest(out)
    if workload is None:  # its model directory may have changed since: say so, not "manifest"
        stored = manifest["definition"]["workload"]
        kind = stored.get("kind") if isinstance(stored, Mapping) else None
        if kind not in BUILTIN_KINDS:
            raise ValueError(f"{Path(out) / MANIFEST}: the sweep's workload, of kind {kind!r}, "
                             "is not one its manifest can rebuild (built-in: "
                             f"{', '.join(BUILTIN_KINDS)}): a custom workload's sweep resumes "
                             "from Python with the workload object, optical.resume_sweep(out, "
                             "workload=...). Its finished runs stay readable "
                             "(optical.load_sweep, optical plot)")
        try:
            workload = workload_from_dict(stored)
        except (ValueError, TypeError, OSError) as err:
            raise ValueError(f"{Path(out) / MANIFEST}: the sweep's workload it stores "
                             f"({workload_label(manifest['definition']['workload'])}) cannot "
                             f"be made now: {err}. Its finished runs stay readable "
                             "(optical.load_sweep, optical plot); to finish it, run the sweep "
                             "again into a new --out directory") from None
    try:
        return SweepDefinition.from_dict(manifest["definition"], workload)
    except (ValueError, TypeError, KeyError) as err:
        text = f"missing key {err}" if isinstance(err, KeyError) else str(err)
        raise ValueError(f"{Path(out) / MANIFEST}: cannot rebuild the sweep's definition "
                         f"from it: {text}") from None


def _changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two definitions, one line each."""
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "base_config":
            cfg_a, cfg_b = OpticalConfig.from_dict(a), OpticalConfig.from_dict(b)
            lines += [f"base config {p}: {cfg_a.get(p)!r} -> {cfg_b.get(p)!r}"
                      for p in cfg_a.diff(cfg_b)]
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            for sub in sorted(set(a) | set(b), key=str):
                if a.get(sub) != b.get(sub):
                    lines.append(f"{key} {sub}: {a.get(sub, '(none)')!r} -> "
                                 f"{b.get(sub, '(none)')!r}")
        else:
            lines.append(f"{key}: {a!r} -> {b!r}")
    return lines


def _check_read(definition: SweepDefinition) -> None:
    """Refuse a swept config path that no config the sweep can make reads
    (:meth:`OpticalConfig.unread`): its values would give the same numbers,
    a flat line taken for a measurement. Decided on every combination of the
    :data:`~optical.config.UNREAD_CONDITIONS` the params and base give (a
    Range by its ends), not on the points drawn, so a random sweep's
    acceptance does not hang on its sample seed; undecided, and so never
    refused, where a combination is invalid beside the base's other fields
    (it may be valid beside the swept ones). Built-in workloads only: a
    custom one may read a field in its own way."""
    if type(definition.workload) not in (MatmulWorkload, LayerWorkload):
        return  # (a subclass of one, of its own kind, may read a field its own way)
    params = dict(definition.params)
    choices = [(c, [definition.base.get(c)] if c not in params
                else [params[c].lo, params[c].hi] if isinstance(params[c], Range)
                else list(params[c])) for c in UNREAD_CONDITIONS]
    configs = []
    for combo in itertools.product(*(values for _, values in choices)):
        try:
            configs.append(definition.base.replace(dict(zip(UNREAD_CONDITIONS, combo,
                                                            strict=True))))
        except ValueError:  # valid beside other swept values only (bits=1 beside a
            return  # smaller enob_loss): undecided here, so never refused
    for path in definition.paths:
        if path.startswith(WORKLOAD_PREFIX):
            continue
        reasons = [config.unread(path) for config in configs]
        if all(reasons):
            why = "; ".join(dict.fromkeys(reasons))  # each reason once, in order
            raise ValueError(f"{path}: no point of this sweep reads it ({why}), so each of "
                             "its values would give the same numbers; sweep or set the field "
                             "that makes it count, or leave it out (a sweep stored by an "
                             "earlier version resumes from its directory alone: optical "
                             "sweep --out DIR, optical.resume_sweep)")


def _unhashed(workload: Any) -> set[str]:
    """The fields a run's id leaves out of ``workload``'s ``to_dict()``
    (``metadata={"unhashed": True}``: a LayerWorkload's model_digest, checked
    on resume instead, so the runs of versions before it keep their ids)."""
    if not dataclasses.is_dataclass(workload) or isinstance(workload, type):
        return set()
    return {f.name for f in dataclasses.fields(workload) if f.metadata.get("unhashed")}


def _check_unhashed(path: Path, record: Mapping[str, Any], workload: Any, out: Path) -> None:
    """Refuse a finished run whose recorded :func:`_unhashed` fields (a
    LayerWorkload's model_digest) differ from its point's workload now: the
    model's config.json or weights were rewritten since it ran, and its id,
    which does not hash them, would pass it off as this model's. A run of a
    version that did not record them is not checked."""
    stored = record.get("workload")
    if not isinstance(stored, Mapping):
        return
    for name in sorted(_unhashed(workload)):
        before, now = stored.get(name), getattr(workload, name)
        if before is not None and now is not None and before != now:
            where = getattr(workload, "model_dir", None)
            raise ValueError(
                f"{path}: this run was made when {where or 'its workload'} gave {name} "
                f"{before}; it gives {now} now (its config.json or weights were rewritten "
                "since): finishing the sweep would mix two models' runs. Run the sweep into a "
                f"new --out directory (load() and optical plot still read the runs in {out})")


def _hashed(workload: Any) -> dict[str, Any]:
    """What a run's id hashes of ``workload``: its ``to_dict()`` without the
    :func:`_unhashed` fields."""
    leave_out = _unhashed(workload)
    return {k: v for k, v in workload.to_dict().items() if k not in leave_out}


def _may_share(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two sweep definitions can have runs in common: their
    workloads agree but for the fields either sweeps (a run's id hashes its
    workload)."""
    swept = {p.removeprefix(WORKLOAD_PREFIX) for d in (old, new)
             for p in d.get("params") or () if p.startswith(WORKLOAD_PREFIX)}
    a, b = old.get("workload"), new.get("workload")
    if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
        return a == b
    if "model_dir" in swept:  # a point's checkpoint is its directory's
        swept.add("checkpoint")
    return ({k: v for k, v in a.items() if k not in swept}
            == {k: v for k, v in b.items() if k not in swept})


def _points_problem(definition: SweepDefinition, points: list[dict[str, Any]]) -> str | None:
    """A manifest's point whose value lies outside its parameter's values or
    range (None: every point is the definition's)."""
    allowed = dict(definition.params)
    for i, point in enumerate(points):
        for path, value in point.items():
            spec = allowed[path]
            if isinstance(spec, Range):
                inside = isinstance(value, numbers.Real) and spec.lo <= value <= spec.hi
            else:
                inside = value in spec
            if not inside:
                return (f"'points'[{i}] has {path} = {value!r}, which the sweep does not define "
                        "(edited, or damaged)")
    return None


def _run_ids_problem(definition: SweepDefinition, points: list[dict[str, Any]],
                     configs: list[OpticalConfig], workloads: list[Any],
                     manifest: Mapping[str, Any]) -> str | None:
    """A manifest's run id that is not the hash of its point's workload,
    config and seed (None: none). Checked only where the manifest's base
    config has the fields this version's has: a version with other fields
    hashes other JSON, and its ids are taken as written. (``workloads`` are each point's
    workload of the definition, which _prepare compared with the manifest's.)"""
    fields = {f"{section}.{name}" for section, values
              in manifest["definition"]["base_config"].items()
              if isinstance(values, Mapping) for name in values}
    if fields != set(OpticalConfig().paths()):
        return None
    for i, config in enumerate(configs):
        ids = definition.run_ids(config, definition.seeds, workloads[i])
        for seed, run_id, expected in zip(definition.seeds, manifest["run_ids"][i], ids,
                                          strict=True):
            if run_id != expected:
                why = ("edited or damaged, or the checkpoint in the point's model directory "
                       "changed since: runs made with other weights are not this point's"
                       if getattr(workloads[i], "checkpoint", None) is not None
                       or "workload.model_dir" in points[i] else "edited, or damaged")
                return (f"'run_ids'[{i}] names {run_id}, which is not the run of point {i} "
                        f"({_describe_point(points[i])}) at seed {seed} ({why})")
    return None


def _without_unhashed(definition: Mapping[str, Any], workload: Any) -> dict[str, Any]:
    """A definition's ``to_dict()`` without the workload's :func:`_unhashed`
    fields, which a resumed sweep checks run by run (a point's own, where
    the definition's workload is only the base of a swept model_dir), and
    which versions before them did not store."""
    stored = definition.get("workload")
    if not isinstance(stored, Mapping):
        return dict(definition)
    leave_out = _unhashed(workload)
    return {**definition, "workload": {k: v for k, v in stored.items() if k not in leave_out}}


def _prepare(definition: SweepDefinition, out: Path
             ) -> tuple[list[dict[str, Any]], list[OpticalConfig], list[Any], list[list[str]]]:
    """Create ``out`` with its manifest, or check the one there; returns the
    points, their configs and workloads, and the run ids by point and seed.
    Points and ids come from the manifest once it exists, so a resumed sweep
    runs the same points under the same ids even if a newer version of the
    library adds config fields (with defaults that keep the old behaviour).
    A directory holding only a sweep's files but no manifest (it was lost or
    deleted) gets a new one: the runs already there that belong to this sweep
    are found by their ids."""
    new = json.loads(json.dumps(definition.to_dict()))
    if (out / MANIFEST).exists():
        manifest = read_manifest(out)
        version = results_version(manifest)
        if version != RESULTS_VERSION:
            raise ValueError(
                f"{out} was begun by a version of optical whose runs give other numbers "
                f"(results version {version!r}; this version's is {RESULTS_VERSION}): "
                "finishing it here would mix runs computed two ways. Finish it with the "
                "version that began it, or run the sweep again into a new --out directory "
                "(load() and optical plot still read the runs it has)")
        # The workload's unhashed fields are checked run by run, not here.
        stored, fresh = (_without_unhashed(d, definition.workload)
                         for d in (manifest["definition"], new))
        changed = _changes(stored, fresh)
        if changed:
            old = manifest["definition"].get("workload")
            shared = _may_share(stored, fresh)
            keep = (f"to keep the runs the two sweeps share, copy {out / RUNS}/*.json into the "
                    "new directory first (a run's id is its workload, config, seed and results "
                    "version, so the new sweep finds them there)" if shared
                    else "the two share no run (a run's id hashes its workload)")
            if (isinstance(old, Mapping) and old.get("kind") == "layer"
                    and "checkpoint" not in old and new["workload"].get("checkpoint")):
                from optical.transformer.model import weights_directory

                where = weights_directory(new["workload"]["model_dir"])
                keep += (f" ({out} was made with synthetic weights, or by a version of optical "
                         "that did not record a checkpoint's fingerprint; the model's weights "
                         f"are now read from the checkpoint in {where}, whose runs are not "
                         "those)")
            raise ValueError(f"{out} holds a different sweep; refusing to mix results. "
                             "Changed: " + "; ".join(changed) +
                             ". Use a new --out directory, or delete this one to start over; "
                             f"{keep}.")
        points = [{p: decode_value(p, v) for p, v in point.items()}
                  for point in manifest["points"]]
        problem = _points_problem(definition, points)
        if problem is None:
            configs, workloads = definition.configs(points), definition.workloads(points)
            problem = _run_ids_problem(definition, points, configs, workloads, manifest)
        if problem is not None:
            raise ValueError(f"{out / MANIFEST}: damaged sweep manifest: {problem}. "
                             f"{_rebuild_advice(out)}")
        return points, configs, workloads, manifest["run_ids"]
    # Without a manifest, only a sweep's own files (its manifest was lost): the
    # new manifest finds the finished runs again by their ids.
    foreign = [p.name for p in out.iterdir() if p.name not in SWEEP_FILES
               and not (p.name.startswith(".") and p.name.endswith(".tmp"))]
    if (out / RUNS).exists() and not (out / RUNS).is_dir():
        foreign.append(RUNS)
    if foreign:
        names = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
        advice = "choose a new directory"
        if (out / RUNS).is_dir():  # most likely a sweep whose manifest was lost
            advice += (f"; if it is a sweep whose {MANIFEST} was lost, move those away "
                       "and start the same sweep again to rebuild it")
        raise ValueError(f"out: {out} is not empty and holds no sweep ({MANIFEST}); it also "
                         f"holds {names}: {advice}")
    points = definition.points()
    configs, workloads = definition.configs(points), definition.workloads(points)
    run_ids = [definition.run_ids(config, definition.seeds, workload)
               for config, workload in zip(configs, workloads, strict=True)]
    (out / RUNS).mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": FORMAT,
        "optical_version": library_version(),
        "results_version": RESULTS_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "definition": new,
        "definition_hash": definition.hash,
        "params": definition.paths,
        "points": encode(points),
        "runs": len(points) * len(definition.seeds),
        "run_ids": run_ids,
    }
    try:  # created, never replaced: where the lock did not keep another sweep
        # out (a file system whose flock is per host), the manifest it made
        # meanwhile is read as any other sweep's, and a different one refused.
        atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n", exclusive=True)
    except FileExistsError:
        return _prepare(definition, out)
    return points, configs, workloads, run_ids


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class SweepSummary:
    """What one call of :func:`execute` did."""

    out: Path
    runs: int
    already_done: int
    ran: int
    executor: str
    results_path: Path

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["out"], data["results_path"] = str(self.out), str(self.results_path)
        return data


def execute(definition: SweepDefinition, out: str | os.PathLike, *, executor: Any = None,
            progress: bool = True, results_format: str | None = None) -> SweepSummary:
    """Run every run of ``definition`` not yet in ``out``; see :func:`sweep`."""
    check_not_bootstrapping("optical.sweep")
    progress = check_bool(progress, "progress")
    if results_format not in (None, "parquet", "csv"):
        raise ValueError(f"results_format: {results_format!r} is not valid; valid: parquet, "
                         "csv, None (the format of the results file already there, else "
                         "parquet)")
    # Absolute now: a workload (or a notebook's thread) changing the working
    # directory mid-sweep would send later runs to another sweep's directory.
    out = Path(out).absolute()
    if results_format is None:  # a resumed CSV sweep stays one (a link to a file counts)
        results_format = "csv" if ((out / "results.csv").is_file()
                                   and not (out / "results.parquet").is_file()) else "parquet"
    pd = _require("pandas")
    if results_format == "parquet":
        _require("pyarrow")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"out: cannot create {out}: {err.strerror or err}") from None
    with lock(out), _sweeping():
        points, configs, workloads, run_ids = _prepare(definition, out)
        runs_dir = out / RUNS
        if runs_dir.is_symlink():  # a directory from someone else: runs/ may name any
            raise ValueError(f"{runs_dir}: a symlink; a sweep writes and removes its run "
                             "files only in a runs/ directory of its own")
        runs_dir.mkdir(exist_ok=True)
        # Temporaries of the sweep's own files, left by a kill (under the lock no
        # other sweep writes them); another program's in this directory (a plot's
        # --json, the last sweep's summary) are its own.
        own = [f".{name}.*.tmp" for name in (MANIFEST, "results.parquet", "results.csv")]
        for stale in [*runs_dir.glob(".*.tmp"), *(p for g in own for p in out.glob(g))]:
            stale.unlink(missing_ok=True)
        done = {p.stem for p in runs_dir.glob("*.json")}
        stored_points = encode(points)
        with damaged_runs(out) as damaged:  # every damaged run file is named now
            for index, ids in enumerate(run_ids):
                for seed, run_id in zip(definition.seeds, ids, strict=True):
                    if run_id in done:
                        record = damaged.read(runs_dir / f"{run_id}.json")
                        if record is not None:
                            check_placement(runs_dir / f"{run_id}.json", record,
                                            stored_points[index], seed, out)
                            _check_unhashed(runs_dir / f"{run_id}.json", record,
                                            workloads[index], out)
        reserved = set(META_COLUMNS) | set(definition.paths)
        tasks, total = [], 0
        for index, config in enumerate(configs):
            for seed, run_id in zip(definition.seeds, run_ids[index], strict=True):
                total += 1
                if run_id not in done:
                    tasks.append(Task(run_id, index, seed, workloads[index], config))
        runner, owned = make_executor(executor)
        label = definition.label
        finished = total - len(tasks)
        bar = progress_bar(total, desc=label, enabled=progress, initial=finished)
        version = library_version()
        expected, received = {t.run_id for t in tasks}, set()
        try:
            with _ctrl_c_recorded(), contextlib.closing(runner.run(tasks)) as outcomes:
                for task, outcome in outcomes:
                    if task.run_id not in expected:
                        raise SweepError(
                            f"the executor ({runner.describe()}) returned an outcome for run "
                            f"{task.run_id}, which it was not given. The {finished} runs "
                            f"finished so far are kept in {out}.")
                    if task.run_id in received:  # once is enough: counted and written once
                        continue
                    if not isinstance(outcome, BaseException | Mapping) \
                            or isinstance(outcome, Mapping) \
                            and not {"metrics", "elapsed_s"} <= outcome.keys():
                        raise SweepError(
                            f"the executor ({runner.describe()}) gave run {task.run_id} "
                            f"{type(outcome).__name__} {reprlib.repr(outcome)}, not an outcome: "
                            "an executor yields (task, evaluate(task)), the dict of the run's "
                            "metrics, time and environment that optical.sweep.evaluate "
                            "returns, or the exception the run raised. The "
                            f"{finished} runs finished so far are kept in {out}.")
                    if isinstance(outcome, BaseException):
                        # A stop signal that arrived inside the run may come
                        # back as its failure (jaxlib turns one raised while
                        # it imports into an ImportError): the signal wins.
                        _raise_received()
                        raise SweepError(
                            f"run failed at point {_describe_point(points[task.point])}, seed "
                            f"{task.seed}: {type(outcome).__name__}: "
                            f"{str(outcome).rstrip('.')}. The {finished} runs finished so far "
                            f"are kept in {out}.") from outcome
                    problem = _metrics_problem(outcome.get("metrics"), reserved)
                    if problem is not None:
                        _raise_received()
                        raise SweepError(
                            f"run at point {_describe_point(points[task.point])}, seed "
                            f"{task.seed}: {type(task.workload).__name__}.run returned "
                            f"{problem}. The {finished} runs finished so far are kept in {out}.")
                    other = outcome.get("results_version", RESULTS_VERSION)
                    if other != RESULTS_VERSION:  # a Dask worker with another optical
                        _raise_received()
                        raise SweepError(
                            f"run at point {_describe_point(points[task.point])}, seed "
                            f"{task.seed} was computed by optical "
                            f"{outcome.get('optical_version')!r} (results version {other!r}), "
                            f"whose numbers differ from this one's (results version "
                            f"{RESULTS_VERSION}): every worker needs this version of optical. "
                            f"The {finished} runs finished so far are kept in {out}.")
                    write_run(runs_dir, task, points[task.point], outcome, version)
                    finished += 1
                    received.add(task.run_id)
                    bar.update(1)
                    _raise_received()
            lost = len(expected - received)
            if lost:  # an executor that dropped runs must not pass for a finished sweep
                raise SweepError(
                    f"the executor ({runner.describe()}) returned no outcome for {lost} of the "
                    f"{len(tasks)} runs it was given. The {finished} runs finished so far are "
                    f"kept in {out}; running the sweep again runs the rest.")
        except KeyboardInterrupt as err:  # Ctrl-C: say what is kept (the CLI says it its way)
            if err.args:
                raise
            raise KeyboardInterrupt(
                f"sweep interrupted: the {finished} runs finished so far are kept in {out}; "
                "run the sweep again to resume").with_traceback(err.__traceback__) from None
        finally:
            bar.close()
            description = runner.describe()
            if owned:
                runner.close()
        frame = read_frame(out, pd)
        results = out / f"results.{results_format}"
        with replacing(results) as tmp:
            if results_format == "parquet":
                # Through a file object: pyarrow encodes a path as strict UTF-8,
                # not as the file system does (a name in another encoding, or
                # any non-ASCII name under an ASCII locale, failed).
                with open(tmp, "wb") as handle:
                    frame.to_parquet(handle, index=False)
            else:
                frame.to_csv(tmp, index=False)
        # The other format's file holds fewer runs now: one results file, never a stale one.
        stale = out / f"results.{'csv' if results_format == 'parquet' else 'parquet'}"
        if stale.is_symlink() or stale.is_file():  # a link goes, never what it points at
            stale.unlink()
    return SweepSummary(out=out, runs=total, already_done=total - len(tasks), ran=len(tasks),
                        executor=description, results_path=results)


_RUNNING = [0]  # sweeps running in this process (threads of a notebook, say)
_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def _sweeping() -> Iterator[None]:
    """Count a running sweep; the last to end clears the workloads' caches
    (a matmul's operands and truth, a model with its last layer: 0.9 GB for
    Llama-3.1-8B), so a finished sweep keeps nothing alive, and a sweep in
    another thread keeps what it uses."""
    with _RUNNING_LOCK:
        _RUNNING[0] += 1
    try:
        yield
    finally:
        with _RUNNING_LOCK:
            _RUNNING[0] -= 1
            if not _RUNNING[0]:
                clear_caches()


def _metrics_problem(metrics: Any, reserved: set[str]) -> str | None:
    """What makes a run's metrics unfit for the table (None: nothing): names
    must be strings other than the run's columns and swept paths, values
    numbers (or None)."""
    if not isinstance(metrics, Mapping):
        return f"{type(metrics).__name__}, not a dict of metrics"
    for name, value in metrics.items():
        if not isinstance(name, str) or name in reserved:
            return (f"a metric named {name!r}, which is a column of the run or a swept "
                    "parameter, not a metric")
        if value is None:
            continue
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer
                                                                  | np.floating):
            return f"metric {name!r} = {value!r}, not a number"
        if isinstance(value, int | np.integer):
            beyond = abs(int(value)) > sys.float_info.max  # JSON and Python ints: unbounded
        else:
            with np.errstate(over="ignore"):  # a longdouble's float: inf past the range
                beyond = math.isinf(float(value)) and not np.isinf(value)
        if beyond:
            return (f"metric {name!r} = {reprlib.repr(value)}, a finite number beyond "
                    "float64's range, which the table holds")
    return None




def sweep(workload: Any, params: Mapping[str, Any], *, seeds: int | Sequence[int],
          out: str | os.PathLike, executor: Any = None, base: str | OpticalConfig = "iris-like",
          samples: int | None = None, sample_seed: int = 0, progress: bool = True,
          results_format: str | None = None) -> Any:
    """Run ``workload`` at every point of a parameter sweep, for every seed.

    Parameters
    ----------
    workload : MatmulWorkload, LayerWorkload, or any object with
        ``run(config, seed) -> dict of metrics`` and ``to_dict()``
    params : mapping of str to sequence or Range
        Dotted config paths and their values: ``{"adc.bits": [4, 6, 8]}``
        (a list, tuple or numpy array of values; a single value, a string
        included, is a one-value list), and ``workload.<field>`` for a field
        of the workload (a dataclass, as the built-in workloads):
        ``{"workload.layer": [0, 4, 8]}`` runs each point on the workload
        with that field, and each run has the id it has in a sweep of that
        workload alone (a Range needs a config path).
        The grid is their product (the first path varies slowest).
    seeds : int or sequence of int
        Seeds run at every point (an int ``n`` means 0 .. n-1): each is the
        workload's ``seed`` -- the noise, and for a :class:`LayerWorkload`
        also the layer input and the held-out calibration input (its weights
        stay at ``weights_seed``; ``optical validate --seed N`` is the same
        run).
    out : path
        Directory of the sweep. Re-running the same sweep resumes it: runs
        already there are skipped. A different sweep there is refused.
    executor : None, int, "serial", "processes", "vmap", dask.distributed.Client or Executor
        None: worker processes on every core; an int: that many (1: this
        process); "vmap": in this process, runs that differ only in seed and
        numeric noise fields batched under ``jax.vmap``; a Dask client: its
        cluster.
    base : str or OpticalConfig
        The config the parameters change (a preset name or a config).
    samples, sample_seed : int, optional
        Draw ``samples`` random points instead of the grid; lists are then
        sampled uniformly, and :class:`Range` s continuously. Identical draws
        count as one point, so a small list can give fewer rows than
        ``samples`` (three draws over two values: at most two points).
        ``sample_seed`` applies only with ``samples``.
    progress : bool
        Show a progress bar (tqdm, on stderr).
    results_format : {"parquet", "csv"} or None
        The format of ``out/results.*``; None: the format of the results file
        already in ``out`` (a resumed CSV sweep stays CSV), else parquet.

    Returns
    -------
    pandas.DataFrame
        One row per (point, seed), sorted: ``point``, ``seed``, one column per
        swept path, one per metric, then ``run_id``, ``elapsed_s``,
        ``optical_version`` and ``config`` (the run's full config as JSON).
        ``frame.attrs["sweep"]`` holds ``out``, the swept ``params``, the
        ``metrics``, ``runs``, the number of runs the sweep plans, and
        ``finished``, the number it holds (``len(frame)``; fewer while it is
        unfinished), ``workload``, the workload's label, and ``base``, the
        base config's :func:`optical.presets.describe` (its preset, or the
        nearest preset with the few fields it changes, else "custom config"),
        and ``results_version``, the results version its runs were computed
        under (:data:`optical._version.RESULTS_VERSION`).

    Raises
    ------
    ValueError
        An unknown path, an invalid value or combination, or a different
        sweep already in ``out`` -- before any run starts.
    SweepError
        A run failed; the runs finished before it are kept.
    TypeError
        An ``executor`` that is none of the kinds above (a bool, say).

    Notes
    -----
    Local worker processes are started with "spawn": a script that calls
    ``sweep`` must guard its main code with ``if __name__ == "__main__":``.
    """
    definition = SweepDefinition.build(workload, params, seeds=seeds, base=base,
                                       samples=samples, sample_seed=sample_seed)
    if definition.samples is None and definition.sample_seed != 0:
        raise ValueError(f"sample_seed: applies only with samples (random points); a grid "
                         f"draws nothing, and sample_seed={definition.sample_seed} would make "
                         f"the same grid another sweep")
    out = Path(out).absolute()  # the directory execute writes, whatever the cwd then
    execute(definition, out, executor=executor, progress=progress,
            results_format=results_format)
    return load(out)


def resume(out: str | os.PathLike, *, workload: Any = None, executor: Any = None,
           progress: bool = True, results_format: str | None = None) -> SweepSummary:
    """Finish the sweep in ``out`` from its manifest (``workload`` for a
    custom workload that the manifest cannot rebuild)."""
    definition = stored_definition(out, workload)
    return execute(definition, out, executor=executor, progress=progress,
                   results_format=results_format)


def load(out: str | os.PathLike) -> Any:
    """Every finished run of the sweep in ``out`` as a tidy DataFrame (see
    :func:`sweep` for the columns and ``attrs``), sorted by point and seed;
    FileNotFoundError where ``out`` holds no sweep (no manifest)."""
    return read_frame(Path(out), _require("pandas"))


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(missing_or_broken(module, err, f"sweeps need {module!r}",
                                            "sweep")) from err


#: Signals received under :func:`sigterm_as_exit` (the CLI) or
#: :func:`_ctrl_c_recorded` (a sweep called from Python). Their handlers raise
#: at once, but Python ignores an exception raised inside a
#: garbage-collection callback (JAX registers one), so :func:`execute` also
#: stops on this record after each result, in the main thread.
_RECEIVED: list[int] = []


def _stop(signum: int) -> None:
    """The exception of a stop signal: KeyboardInterrupt for SIGINT, else
    :class:`Terminated`."""
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(128 + signum)


def _raise_received() -> None:
    """Raise again for a signal whose exception was swallowed: in the main
    thread, whose sweep recorded it (one in another thread, which Python
    never signals, runs on)."""
    if _RECEIVED and threading.current_thread() is threading.main_thread():
        _stop(_RECEIVED[0])


@contextlib.contextmanager
def sigterm_as_exit(abandon: Callable[[int], None] | None = None) -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (a SystemExit, code 143) in the
    main thread, so a terminated sweep stops its workers and keeps its
    finished runs (used by the CLI); SIGTERM and SIGINT (Ctrl-C) are also
    recorded, so that a sweep stops after its next result even if the
    exception was swallowed where it was raised. ``abandon(signum)``, if
    given, is called where it is swallowed instead (numba's compiler calls
    back into Python while it compiles, for a minute or more; a batch
    scheduler's grace period is often 30 s): the CLI ends the process there,
    the finished runs being on disk already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _recording((signal.SIGTERM, signal.SIGINT), abandon):
        yield


@contextlib.contextmanager
def _ctrl_c_recorded() -> Iterator[None]:
    """Record Ctrl-C (SIGINT) during a sweep called from Python, as
    :func:`sigterm_as_exit` does for the CLI, so one swallowed by a
    garbage-collection callback (JAX's, imported by the numba backend for
    its GEMMs: 1 to 3 of 20 interrupts in a notebook) still stops the sweep
    after its next result. Only in the main thread where SIGINT has Python's
    own handler: a caller's handler, or the CLI's, is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    with _recording((signal.SIGINT,)):
        yield


@contextlib.contextmanager
def _recording(signals: tuple[int, ...],
               abandon: Callable[[int], None] | None = None) -> Iterator[None]:
    """Handlers of ``signals`` that record the signal and raise its stop
    exception, and an unraisable hook that drops that exception's traceback
    where Python ignores it (calling ``abandon``); main thread only."""

    def handler(signum: int, frame: Any) -> None:
        _RECEIVED.append(signum)
        _stop(signum)

    hook = sys.unraisablehook

    def quiet(unraisable: Any) -> None:
        # Where Python ignores the handler's exception (a garbage-collection
        # callback), it prints a traceback; the signal is recorded and acted
        # on after the next result, so that traceback is noise.
        if not (_RECEIVED and isinstance(unraisable.exc_value, KeyboardInterrupt | Terminated)):
            hook(unraisable)
        elif abandon is not None:
            abandon(_RECEIVED[0])

    _RECEIVED.clear()
    # A signal the caller ignores (SIGINT in a background job of a shell
    # script) stays ignored, as Python leaves it.
    previous = {s: signal.signal(s, handler) for s in signals
                if signal.getsignal(s) != signal.SIG_IGN}
    sys.unraisablehook = quiet
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
        sys.unraisablehook = hook
        _RECEIVED.clear()
