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
runs by their ids. A layer sweep whose model moved (another machine, another
path) resumes with the model's new directory (:func:`resume`'s
``model_dir``, or the same definition given with it): the model there must be
the one the sweep began with, and the runs keep the ids of the path it began
with. :func:`load` reads the runs back.

The module is light to import: pandas, tqdm and the executors' dependencies
(the ``sweep`` extra) are imported when a sweep runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import numbers
import os
import reprlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
from optical._files import absolute, atomic_write, replacing
from optical._progress import progress_bar
from optical._signals import (  # sigterm_as_exit: where callers found it before the split
    Terminated,
    _ctrl_c_recorded,
    _raise_received,
    sigterm_as_exit,  # noqa: F401
)
from optical._sweep_definition import (
    MAX_RUNS,
    Range,
    SweepDefinition,
    _describe_point,
    _unhashed,
    parse_swept_value,
)
from optical._sweep_store import (
    _MAX_RECORD_BYTES,
    FORMAT,
    MANIFEST,
    META_COLUMNS,
    RUNS,
    SWEEP_FILES,
    WORKLOAD_PREFIX,
    _read_json,
    _rebuild_advice,
    _workload_record,
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
from optical._validation import check_bool, missing_or_broken
from optical._version import RESULTS_VERSION
from optical.config import OpticalConfig
from optical.workloads import (
    BUILTIN_KINDS,
    LayerWorkload,
    MatmulWorkload,
    clear_caches,
    workload_from_dict,
    workload_label,
)

__all__ = ["MAX_RUNS", "DaskExecutor", "Executor", "LayerWorkload", "MatmulWorkload",
           "ProcessExecutor", "Range", "SerialExecutor",
           "SweepDefinition", "SweepError", "SweepSummary", "Task", "Terminated", "evaluate",
           "execute", "load",
           "parse_swept_value", "read_manifest", "resume", "stored_definition", "sweep"]


class SweepError(RuntimeError):
    """A run of the sweep failed; the runs finished before it are kept."""


# --------------------------------------------------------------------------- #
# Reading a sweep back (its files: optical._sweep_store)
# --------------------------------------------------------------------------- #


def stored_definition(out: str | os.PathLike, workload: Any = None, *,
                      model_dir: str | os.PathLike | None = None) -> SweepDefinition:
    """The definition of the sweep in ``out``, rebuilt from its manifest
    (``workload`` for a custom workload the manifest cannot rebuild;
    ``model_dir`` for a layer sweep's model that has moved since it began:
    its directory now); ValueError names the manifest when it cannot be
    rebuilt."""
    manifest = read_manifest(out)
    if model_dir is not None and workload is not None:
        raise ValueError("model_dir: give the moved workload itself (its model_dir the new "
                         "directory), or model_dir with the stored workload, not both")
    if workload is None:  # its model directory may have changed since: say so, not "manifest"
        stored = manifest["definition"]["workload"] if model_dir is None \
            else _moved_workload(out, manifest, model_dir)
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
            if model_dir is not None:  # the directory the caller gave: named as theirs
                raise ValueError(f"model_dir: {err}") from None
            moved = ""
            where = stored.get("model_dir")
            if _one_model(stored, manifest["definition"].get("params")) \
                    and isinstance(where, str):
                moved = (f"; if its model has moved from {where}, resume with its directory "
                         "now (optical sweep --out DIR --moved-model MODEL_DIR; "
                         "optical.resume_sweep(out, model_dir=...))")
            raise ValueError(f"{Path(out) / MANIFEST}: the sweep's workload it stores "
                             f"({workload_label(manifest['definition']['workload'])}) cannot "
                             f"be made now: {err}. Its finished runs stay readable "
                             "(optical.load_sweep, optical plot); to finish it, run the sweep "
                             f"again into a new --out directory{moved}") from None
    try:
        return SweepDefinition.from_dict(manifest["definition"], workload)
    except (ValueError, TypeError, KeyError) as err:
        text = f"missing key {err}" if isinstance(err, KeyError) else str(err)
        raise ValueError(f"{Path(out) / MANIFEST}: cannot rebuild the sweep's definition "
                         f"from it: {text}") from None


def _one_model(workload: Any, params: Iterable[str] | None) -> bool:
    """Whether a sweep's stored workload (``to_dict()`` or a run file's
    record of it) and its swept ``params`` name one model directory, which
    can move: a layer workload whose ``model_dir`` the sweep does not sweep."""
    return isinstance(workload, Mapping) and workload.get("kind") == "layer" \
        and WORKLOAD_PREFIX + "model_dir" not in (params or ())


def _moved_workload(out: str | os.PathLike, manifest: Mapping[str, Any],
                    model_dir: str | os.PathLike) -> dict[str, Any]:
    """The stored workload of a layer sweep with ``model_dir`` in its
    directory's place and its checkpoint left to be found there (compared
    with the sweep's by :func:`_prepare`); ValueError where the sweep has no
    single model to move."""
    where = Path(out) / MANIFEST
    definition = manifest["definition"]
    stored = definition.get("workload")
    if not isinstance(stored, Mapping) or stored.get("kind") != "layer":
        kind = stored.get("kind") if isinstance(stored, Mapping) else None
        raise ValueError(f"model_dir: {where}: the sweep's workload is of kind {kind!r}, "
                         "which has no model directory to move (only a layer sweep's has)")
    if WORKLOAD_PREFIX + "model_dir" in (definition.get("params") or ()):
        raise ValueError(f"model_dir: {where}: the sweep sweeps workload.model_dir, each of its "
                         "points naming its own directory; such a sweep cannot be moved to "
                         "one")
    if not isinstance(model_dir, str | os.PathLike):
        raise TypeError(f"model_dir: expected a path, got {type(model_dir).__name__}")
    if not os.fspath(model_dir).strip():  # Path("") would be the working directory
        raise ValueError("model_dir: an empty path names no model directory")
    fields = {k: v for k, v in stored.items() if k not in ("checkpoint", "model_digest")}
    return {**fields, "model_dir": os.fspath(model_dir)}


def _moved_model(stored: Mapping[str, Any], given: Mapping[str, Any]) -> str | None:
    """The model directory a stored layer sweep began with, where the
    definition ``given`` now is that sweep with its model moved: the
    workloads differ in ``model_dir`` alone (the checkpoint's fingerprint
    included), the sweep does not sweep ``workload.model_dir``, and the
    model's digest (``config.json`` and samples of the weights' bytes) is
    the one the manifest recorded. None otherwise (a manifest of a version
    that recorded no digest included): the definitions are then compared as
    they are."""
    old, new = stored.get("workload"), given.get("workload")
    if not (_one_model(old, given.get("params")) and _one_model(new, given.get("params"))) \
            or old.get("model_dir") == new.get("model_dir") \
            or old.get("model_digest") is None:
        return None
    if {k: v for k, v in old.items() if k != "model_dir"} \
            != {k: v for k, v in new.items() if k != "model_dir"}:
        return None
    moved = old.get("model_dir")
    return moved if isinstance(moved, str) else None


def _not_moved(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Why a layer sweep whose workloads differ in ``model_dir`` (and the
    checkpoint's fingerprint) alone is not taken for the same sweep with its
    model moved (:func:`_moved_model`)."""
    before, now = old.get("model_digest"), new.get("model_digest")
    if before is None:
        return (" (the manifest records no digest of its model, as versions before digests "
                "did not, so a moved model cannot be told to be the same one)")
    if before == now:  # the fingerprint alone differs
        return (f" (the model in {new.get('model_dir')} has the sweep's model digest, but "
                "not its checkpoint's fingerprint, which also hashes each file's header, the "
                "index and the name the file resolves to: a Hugging Face cache's blob names "
                "there, the file's own in a plain copy; give the model in the layout the "
                "sweep began with (a cache copied with cp -a keeps its blob names))")
    return (f" (the model in {new.get('model_dir')} is not the one the sweep began with: its "
            f"config.json or weights differ, model digest {now} where the sweep's was "
            f"{before})")


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
    range, a point given twice, a grid's point left out, or more random
    points than the sweep draws (None: the points are the definition's).
    A random sweep's points are not drawn again: another version may draw
    others, and the manifest's are the ones its runs ran."""
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
    # Values as tuples: Python's equality (1000 == 1000.0), as `in spec` above.
    seen: dict[tuple[Any, ...], int] = {}
    for i, point in enumerate(points):
        first = seen.setdefault(tuple(point[p] for p in definition.paths), i)
        if first != i:
            return (f"'points'[{i}] repeats 'points'[{first}] ({_describe_point(point)}) "
                    "(edited, or damaged)")
    if definition.samples is None:
        left_out = [point for point in definition.points()
                    if tuple(point[p] for p in definition.paths) not in seen]
        if left_out:
            more = f" and {len(left_out) - 1} more" if len(left_out) > 1 else ""
            return (f"'points' leaves out the grid's point {_describe_point(left_out[0])}"
                    f"{more} (edited, or damaged)")
    elif len(points) > definition.samples:
        return (f"'points' holds {len(points)} points; the sweep draws at most "
                f"{definition.samples} (edited, or damaged)")
    return None


def _run_ids_problem(definition: SweepDefinition, points: list[dict[str, Any]],
                     configs: list[OpticalConfig], workloads: list[Any],
                     manifest: Mapping[str, Any], moved: str | None = None) -> str | None:
    """A manifest's run id that is not the hash of its point's workload,
    config and seed (None: none). Checked only where the manifest's base
    config has the fields this version's has: a version with other fields
    hashes other JSON, and its ids are taken as written. (``workloads`` are each point's
    workload of the definition, which _prepare compared with the manifest's;
    ``moved``: the model directory the sweep began with, where its model
    has moved since.)"""
    fields = {f"{section}.{name}" for section, values
              in manifest["definition"]["base_config"].items()
              if isinstance(values, Mapping) for name in values}
    if fields != set(OpticalConfig().paths()):
        return None
    for i, config in enumerate(configs):
        ids = definition.run_ids(config, definition.seeds, workloads[i], model_dir=moved)
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
             ) -> tuple[list[dict[str, Any]], list[OpticalConfig], list[Any], list[list[str]],
                        str | None]:
    """Create ``out`` with its manifest, or check the one there; returns the
    points, their configs and workloads, the run ids by point and seed, and
    the model directory the sweep began with where its model has moved since
    (:func:`_moved_model`; None otherwise).
    Points and ids come from the manifest once it exists, so a resumed sweep
    runs the same points under the same ids even if a newer version of the
    library adds config fields (with defaults that keep the old behaviour).
    A directory holding only a sweep's files but no manifest (it was lost or
    deleted) gets a new one: the runs already there that belong to this sweep
    are found by their ids (those of a layer sweep whose model has moved
    since they ran, by the directory their files name: :func:`_began_at`)."""
    new = json.loads(json.dumps(definition.to_dict()))
    moved = None
    if (out / MANIFEST).exists():
        manifest = read_manifest(out)
        version = results_version(manifest)
        if version != RESULTS_VERSION:
            raise ValueError(
                f"{out} was begun by a version of optical whose runs give other numbers "
                f"or other metrics (results version {version!r}; this version's is "
                f"{RESULTS_VERSION}): finishing it here would mix runs computed two ways. "
                "Finish it with the "
                "version that began it, or run the sweep again into a new --out directory "
                "(load() and optical plot still read the runs it has)")
        # A layer sweep's model moved since it began: the same model, now
        # elsewhere; its runs keep the ids of the path the sweep began with.
        moved = _moved_model(manifest["definition"], new)
        if moved is not None:
            new = {**new, "workload": {**new["workload"], "model_dir": moved}}
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
            elif _one_model(old, definition.paths) \
                    and {line.partition(":")[0] for line in changed} \
                    <= {"workload model_dir", "workload checkpoint"}:
                keep += _not_moved(old, new["workload"])
            raise ValueError(f"{out} holds a different sweep; refusing to mix results. "
                             "Changed: " + "; ".join(changed) +
                             ". Use a new --out directory, or delete this one to start over; "
                             f"{keep}.")
        points = [{p: decode_value(p, v) for p, v in point.items()}
                  for point in manifest["points"]]
        problem = _points_problem(definition, points)
        if problem is None:
            configs, workloads = definition.configs(points), definition.workloads(points)
            problem = _run_ids_problem(definition, points, configs, workloads, manifest, moved)
        if problem is not None:
            raise ValueError(f"{out / MANIFEST}: damaged sweep manifest: {problem}. "
                             f"{_rebuild_advice(out)}")
        return points, configs, workloads, manifest["run_ids"], moved
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
    moved = _began_at(definition, new, out, configs, workloads, run_ids)
    if moved is not None:  # the manifest names the model as the runs' ids do
        new = {**new, "workload": {**new["workload"], "model_dir": moved}}
        run_ids = [definition.run_ids(config, definition.seeds, workload, model_dir=moved)
                   for config, workload in zip(configs, workloads, strict=True)]
    (out / RUNS).mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": FORMAT,
        "optical_version": library_version(),
        "results_version": RESULTS_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "definition": new,
        "definition_hash": definition.hash if moved is None else content_hash(new),
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
    return points, configs, workloads, run_ids, moved


def _began_at(definition: SweepDefinition, new: Mapping[str, Any], out: Path,
              configs: list[OpticalConfig], workloads: list[Any],
              run_ids: list[list[str]]) -> str | None:
    """The model directory a layer sweep whose manifest was lost began with,
    where its model has moved since: where none of ``run_ids`` (the given
    directory's) is in ``out`` but the runs there are this sweep's under
    another directory's ids, the ``workload.model_dir`` their files record
    (the sweep's name for the model; where it was found is their
    ``moved_model_dir``), for a workload that is the definition's but for
    that directory, with the model's digest now; of several such
    directories, the one whose ids name the most runs there. None
    otherwise: the runs are then found, or not, by the given directory's
    ids. Run files are read as a load reads them (plain files, within
    limits; a damaged or foreign one is skipped here, named where it is
    read), each directory's ids computed once."""
    given = new.get("workload")
    runs = out / RUNS
    if not _one_model(given, definition.paths) or not runs.is_dir():
        return None
    files = {p.stem: p for p in runs.glob("*.json")}
    if not files or any(run_id in files for ids in run_ids for run_id in ids):
        return None  # the given directory's runs are there: not moved, or moved back
    # As a run file records a workload: every field, those at their defaults
    # too; the fields the sweep sweeps are each point's.
    leave_out = {"model_dir", *(p.removeprefix(WORKLOAD_PREFIX) for p in definition.paths
                                if p.startswith(WORKLOAD_PREFIX))}
    same = {k: v for k, v in _workload_record(definition.workload).items()
            if k not in leave_out}
    found: dict[str, int] = {}  # a directory tried: how many runs its ids name
    for path in files.values():
        try:
            stored = _read_json(path, "", _MAX_RECORD_BYTES)
        except (OSError, ValueError):
            continue
        stored = stored.get("workload") if isinstance(stored, Mapping) else None
        began = stored.get("model_dir") if isinstance(stored, Mapping) else None
        if not isinstance(began, str) or began == given.get("model_dir") or began in found \
                or {k: v for k, v in stored.items() if k not in leave_out} != same:
            continue
        found[began] = sum(run_id in files for config, workload
                           in zip(configs, workloads, strict=True)
                           for run_id in definition.run_ids(config, definition.seeds, workload,
                                                            model_dir=began))
    best = max(sorted(found), key=found.__getitem__, default=None)
    return best if best is not None and found[best] else None


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class SweepSummary:
    """What one call of :func:`execute` did; ``elapsed_s``: its wall time, s,
    from its directory's lock to the results file written."""

    out: Path
    runs: int
    already_done: int
    ran: int
    executor: str
    results_path: Path
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values (paths as strings): ``optical sweep --json``."""
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
    out = absolute(out, "out")
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
    start = time.perf_counter()
    with lock(out), _sweeping():
        points, configs, workloads, run_ids, moved = _prepare(definition, out)
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
                            f"whose numbers or metrics differ from this one's (results version "
                            f"{RESULTS_VERSION}): every worker needs this version of optical. "
                            f"The {finished} runs finished so far are kept in {out}.")
                    write_run(runs_dir, task, points[task.point], outcome, version, moved)
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
                        executor=description, results_path=results,
                        elapsed_s=time.perf_counter() - start)


_RUNNING = [0]  # sweeps running in this process (threads of a notebook, say)
_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def _sweeping() -> Iterator[None]:
    """Count a running sweep; the last to end clears the workloads' caches
    (a matmul's operands and truth, a model with its last layer: 0.9 GB for
    Llama-3.1-8B), so a finished sweep keeps nothing alive in this process,
    and a sweep in another thread keeps what it uses (a Dask cluster's
    workers keep theirs: :func:`optical.workloads.clear_caches`)."""
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
        ``finished_at`` (UTC, ISO 8601, the clock of the process that ran
        it), ``optical_version``, ``optical_commit`` (the git commit of
        optical that ran it; None outside a git checkout) and ``config``
        (the run's full config as JSON).
        ``frame.attrs["sweep"]`` holds ``out``, the swept ``params``, the
        ``metrics``, ``runs``, the number of runs the sweep plans, and
        ``finished``, the number it holds (``len(frame)``; fewer while it is
        unfinished), ``workload``, the workload's label, and ``base``, the
        base config's :func:`optical.presets.describe` (its preset, or the
        nearest preset with the few fields it changes, else "custom config"),
        ``results_version``, the results version its runs were computed
        under (:data:`optical._version.RESULTS_VERSION`), and ``definition``,
        the manifest's definition but its seeds (the ``seed`` column): the
        workload as its ``to_dict`` records it, the base config, params and
        sampling, which results.parquet keeps too (a CSV keeps no attrs),
        and ``definition_hash``, the manifest's hash of the whole definition
        (``optical plot --json`` records it).

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
    out = absolute(out, "out")  # the directory execute writes, whatever the cwd then
    execute(definition, out, executor=executor, progress=progress,
            results_format=results_format)
    return load(out)


def resume(out: str | os.PathLike, *, workload: Any = None, executor: Any = None,
           progress: bool = True, results_format: str | None = None,
           model_dir: str | os.PathLike | None = None) -> SweepSummary:
    """Finish the sweep in ``out`` from its manifest (``workload`` for a
    custom workload that the manifest cannot rebuild). ``model_dir``: where
    a layer sweep's model is now, if it has moved since the sweep began
    (another machine, another path); it must be the same model (the
    checkpoint's fingerprint and the model's digest are compared with the
    manifest's), and the manifest keeps naming the directory the sweep began
    with, so the runs keep their ids (each new run file records where its
    model was)."""
    definition = stored_definition(out, workload, model_dir=model_dir)
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
