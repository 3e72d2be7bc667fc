"""A sweep's definition: its workload, base config, swept values (a grid of
config paths and workload fields, or random draws from lists and
:class:`Range` s) and seeds, every part checked before any run, and the ids
of its runs. :mod:`optical.sweep` stores and runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical import presets
from optical._sweep_store import WORKLOAD_PREFIX, content_hash, decode_value, encode
from optical._validation import check_bool, check_positive_int, check_seed
from optical._version import RESULTS_VERSION
from optical.config import UNREAD_CONDITIONS, OpticalConfig, check_value, parse_value
from optical.workloads import (
    LayerWorkload,
    MatmulWorkload,
    check_own_kind,
    workload_from_dict,
    workload_label,
)

__all__ = ["MAX_RUNS", "Range", "SweepDefinition", "parse_swept_value"]


#: Most runs (points x seeds) of one sweep: each run is a file of its own.
MAX_RUNS = 10**6

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
        """The range as the manifest stores it."""
        return {"range": [self.lo, self.hi], "log": self.log}




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
            stored = str(Path(os.path.expanduser(value)).resolve())  # as the workload does
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
        _check_stored(workload)
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
                         else int(samples), sample_seed=check_seed(sample_seed, "sample_seed"))
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
        """The swept paths, in the order given (the grid's first varies slowest)."""
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
        """The definition as the manifest stores it (JSON-ready, encoded)."""
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
        """The content hash of :meth:`to_dict`: the manifest's ``definition_hash``."""
        return content_hash(self.to_dict())

    def run_id(self, config: OpticalConfig, seed: int, workload: Any = None) -> str:
        """Stable identity of one run: a hash of (workload, full config, seed,
        results version); ``workload`` is the point's (default: the
        definition's)."""
        return self.run_ids(config, (seed,), workload)[0]

    def run_ids(self, config: OpticalConfig, seeds: Sequence[int],
                workload: Any = None, *, model_dir: str | None = None) -> list[str]:
        """:meth:`run_id` of ``config`` at each of ``seeds`` (the workload and
        config serialised once). ``model_dir``: the directory the ids name the
        workload's model by, where it is not the workload's own (a sweep
        resumed with its model moved keeps the ids of the path it began
        with)."""
        workload = _hashed(self.workload if workload is None else workload)
        if model_dir is not None:
            workload["model_dir"] = model_dir
        data = json.loads(config.to_json())
        # The results version too: a run another version computed differently
        # is never taken for this one's (copied runs, a rebuilt manifest).
        return [content_hash({"workload": workload, "config": data, "seed": seed,
                              "results_version": RESULTS_VERSION})
                for seed in seeds]


def _check_stored(workload: Any) -> None:
    """Refuse a workload whose ``to_dict()`` JSON cannot hold (a sweep
    writes it into its manifest and hashes it into each run's id), naming
    what it holds, before json.dumps' bare TypeError."""
    data = workload.to_dict()
    try:
        content_hash(data)  # what the manifest and the run ids make of it
    except (TypeError, ValueError) as err:
        raise TypeError(f"workload: {type(workload).__name__}.to_dict() returned what JSON "
                        f"cannot hold ({err}); a sweep stores it in its manifest and hashes it "
                        "into every run's id: give it numbers, strings, booleans, None, lists "
                        "and dicts (an array's tolist(), or a name or seed it is made from)"
                        ) from None


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
    checked = tuple(check_seed(s, "seeds") for s in seeds)
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


#: How a sweep :func:`_check_read` now refuses, stored by an earlier version, still runs.
_OLD_SWEEPS = (" (a sweep stored by an earlier version resumes from its directory alone: "
               "optical sweep --out DIR, optical.resume_sweep)")


def _check_read(definition: SweepDefinition) -> None:
    """Refuse a swept config path that no config the sweep can make reads
    (:meth:`OpticalConfig.unread`): its values would give the same numbers,
    a flat line taken for a measurement. Decided on every combination of the
    :data:`~optical.config.UNREAD_CONDITIONS` the params and base give (a
    Range by its ends), not on the points drawn, so a random sweep's
    acceptance does not hang on its sample seed; undecided, and so never
    refused, where a combination is invalid beside the base's other fields
    (it may be valid beside the swept ones). ``energy.*`` is never read by
    them. Built-in workloads only: a custom one may read a field in its own
    way (a workload that prices the machine may sweep ``energy.*``)."""
    if type(definition.workload) not in (MatmulWorkload, LayerWorkload):
        return  # (a subclass of one, of its own kind, may read a field its own way)
    for path in definition.paths:
        if path.startswith("energy."):  # prices the machine; changes no arithmetic
            raise ValueError(f"{path}: a {type(definition.workload).__name__} measures the "
                             "emulated arithmetic, which no energy.* field changes, so each "
                             "of its values would give the same numbers; price the machine "
                             "with optical energy (or optical.energy) instead, or leave it "
                             f"out{_OLD_SWEEPS}")
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
                             f"that makes it count, or leave it out{_OLD_SWEEPS}")


def _unhashed(workload: Any) -> set[str]:
    """The fields a run's id leaves out of ``workload``'s ``to_dict()``
    (``metadata={"unhashed": True}``: a LayerWorkload's model_digest, checked
    on resume instead, so the runs of versions before it keep their ids)."""
    if not dataclasses.is_dataclass(workload) or isinstance(workload, type):
        return set()
    return {f.name for f in dataclasses.fields(workload) if f.metadata.get("unhashed")}


def _hashed(workload: Any) -> dict[str, Any]:
    """What a run's id hashes of ``workload``: its ``to_dict()`` without the
    :func:`_unhashed` fields."""
    leave_out = _unhashed(workload)
    return {k: v for k, v in workload.to_dict().items() if k not in leave_out}
