"""A sweep's files on disk: the manifest, one JSON record per finished run,
the lock, and the table read back from them (see :mod:`optical.sweep` for
the layout). Values are stored JSON-safe (non-finite floats as strings) and
every file is written atomically, so a kill never leaves half a file."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import math
import numbers
import os
import re
import reprlib
import stat
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical import presets
from optical._executors import Task, utc_now
from optical._files import atomic_write, linked_to, read_plain
from optical._validation import DuplicateKeyError, parse_json
from optical._version import RESULTS_VERSION
from optical.config import OpticalConfig
from optical.workloads import workload_label

FORMAT = "optical-sweep/1"
MANIFEST = "manifest.json"
RUNS = "runs"
#: Columns that describe a run rather than measure it.
META_COLUMNS = ("point", "seed", "run_id", "elapsed_s", "finished_at", "optical_version",
                "optical_commit", "config")
#: Prefix of a swept path that changes a field of the workload, not of the
#: config: ``workload.layer``, ``workload.tokens``.
WORKLOAD_PREFIX = "workload."


def library_version() -> str:
    """The version of optical that writes a manifest or a run record."""
    from optical._version import __version__

    return __version__


def results_version(manifest: Mapping[str, Any]) -> Any:
    """The results version a manifest records (1: one written before they
    were recorded)."""
    return manifest.get("results_version", 1)


def encode(value: Any) -> Any:
    """JSON-safe value: non-finite floats as "inf", "-inf", "nan"; numpy
    scalars and 0-d arrays (numpy's, JAX's, torch's: a ``shape`` of ``()``
    and an ``item()``) as Python's. The one encoder of every JSON the
    library writes (run files, manifests, the commands' ``--json``); what
    JSON cannot hold (a complex number, a larger array) is left for
    ``json.dumps`` to refuse by type."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, np.floating):  # a longdouble's item() is a longdouble
        return encode(float(value))
    if isinstance(value, np.complexfloating | np.ma.MaskedArray):
        return value  # (a clongdouble's item() is itself; the masked constant is no 0.0)
    if isinstance(value, np.generic):
        return encode(value.item())
    if not isinstance(value, str | bytes | int | float | type(None)) \
            and getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        item = value.item()
        return value if type(item) is type(value) else encode(item)
    return value


#: A run id as content_hash writes it (lower-case hexadecimal; any length,
#: for ids taken as written from a manifest of another version).
_RUN_ID = re.compile(r"[0-9a-f]{1,64}")


def content_hash(data: Any, length: int = 20) -> str:
    """A stable hash of JSON-like ``data`` (key order ignored): a run's id, a
    sweep definition's ``definition_hash``."""
    text = json.dumps(encode(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def decode_value(path: str, value: Any) -> Any:
    """Inverse of :func:`encode` for the value of a config field (a workload
    field's value, ``workload.*``, is stored as it is)."""
    if path.startswith(WORKLOAD_PREFIX):
        return value
    if isinstance(value, str) and OpticalConfig.field_spec(path)["kind"] == "real":
        return float(value)
    return value


#: What a sweep directory may hold besides its manifest: a directory with
#: only these and no manifest is a sweep whose manifest was lost, and the same
#: sweep started there again rebuilds it (run ids are hashes of the runs' content,
#: so the finished runs are found again).
SWEEP_FILES = (".lock", RUNS, "results.parquet", "results.csv", "plots")


def writes(out: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether the sweep in ``out`` writes ``path`` itself: its manifest, lock,
    results table or a run file (another writer there would destroy them),
    by name, through a symlink, or as a hard link to one of them."""
    out, given = Path(out).resolve(), Path(path)
    path = given.resolve()
    own = {out / name for name in (MANIFEST, *SWEEP_FILES) if name not in (RUNS, "plots")}
    if path in own or out / RUNS in path.parents:
        return True
    runs = out / RUNS  # (listed only for a file with other links)
    return linked_to(given, itertools.chain(own, runs.iterdir() if runs.is_dir() else ()))


#: How a sweep directory without a (readable) manifest gets one back.
_RESTART = ("start the same sweep again on this directory (the whole `optical sweep` command "
            "with its workload and options, not only --out; or the same optical.sweep call): "
            "the manifest is rebuilt and the finished runs whose workload, config and seed it "
            "names again are found by their ids, not re-run (a run of a definition that "
            "differs, of a library version with other config fields, or of another "
            "results version, runs again; their files stay where they are)")


def _rebuild_advice(out: Path) -> str:
    return f"The finished runs in {out / RUNS} are kept: delete {out / MANIFEST} and {_RESTART}"


#: The largest manifest and run file read (a sparse file costs nothing on disk
#: and in a tarball, whatever size it claims; a 10**6-run manifest is ~100 MB).
_MAX_MANIFEST_BYTES, _MAX_RECORD_BYTES = 1 << 30, 1 << 24


def _read_json(path: Path, advice: str, limit: int = _MAX_MANIFEST_BYTES) -> Any:
    try:  # a sweep directory may come from someone else: plain files, within limits
        return parse_json(read_plain(path, limit).decode(), unique_keys=True)
    except (json.JSONDecodeError, UnicodeDecodeError, DuplicateKeyError) as err:
        raise ValueError(f"{path}: not valid JSON ({err}). {advice}") from None


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _keys_problem(data: dict, keys: Sequence[tuple[str, type]], prefix: str = "") -> str | None:
    """The first of ``keys`` (name, dict or list) that ``data`` lacks or holds
    as another JSON type, named with ``prefix`` (None: all there)."""
    for key, kind in keys:
        if key not in data:
            return f"missing key {prefix + key!r}"
        if not isinstance(data[key], kind):
            return f"{prefix + key!r} is not a JSON {'object' if kind is dict else 'array'}"
    return None


def _manifest_problem(manifest: Any) -> str | None:
    """What is wrong with a manifest's structure (None: nothing)."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    problem = _keys_problem(manifest, (("definition", dict), ("params", list),
                                       ("points", list), ("run_ids", list)))
    if problem:
        return problem
    definition = manifest["definition"]
    problem = _keys_problem(definition, (("workload", dict), ("base_config", dict),
                                         ("params", dict), ("seeds", list)), "definition.")
    if problem:
        return problem
    params = manifest["params"]
    if not _is_str_list(params) or sorted(params) != sorted(definition["params"]):
        return "'params' does not list the definition's parameters"
    if not definition["seeds"]:
        return "'definition.seeds' is empty"
    points, run_ids = manifest["points"], manifest["run_ids"]
    for i, point in enumerate(points):
        if not isinstance(point, dict) or sorted(point) != sorted(params):
            return f"'points'[{i}] does not give a value of every parameter"
    if len(run_ids) != len(points):
        return f"'run_ids' has {len(run_ids)} entries for {len(points)} points"
    first: dict[str, int] = {}
    for i, ids in enumerate(run_ids):
        if not _is_str_list(ids) or len(ids) != len(definition["seeds"]):
            return f"'run_ids'[{i}] is not a list of one run id per seed"
        for run_id in ids:  # a file name under runs/: never a path ("../x")
            if not _RUN_ID.fullmatch(run_id):
                return (f"'run_ids'[{i}] holds {run_id[:80]!r}, which is not a run id "
                        "(hexadecimal digits)")
            # Each run (point and seed) hashes to its own id: one filed twice
            # would stand for a run the sweep never makes (a point copied over
            # another one, say).
            if run_id in first:
                return (f"'run_ids'[{i}] repeats the run id {run_id} of 'run_ids'"
                        f"[{first[run_id]}] (edited, or damaged)")
            first[run_id] = i
    if content_hash(definition) != manifest.get("definition_hash"):
        # What a sweep resumes and a run's place are read from the manifest:
        # a definition changed by hand would pass the old runs off as its own.
        return ("its 'definition' does not match its 'definition_hash' (the definition "
                "was edited, or the file damaged)")
    return None


def read_manifest(out: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the sweep in ``out``; FileNotFoundError if there is none,
    ValueError naming the file and what is wrong if it is damaged."""
    out = Path(out)
    path = out / MANIFEST
    if os.path.lexists(path) and not path.is_file():
        raise ValueError(f"{path}: not a file (a directory, a FIFO or a dangling link); "
                         "remove it, then start the same sweep again")
    if not path.is_file():
        if (out / RUNS).is_dir():
            raise FileNotFoundError(
                f"{out}: no sweep manifest ({MANIFEST} not found), but {out / RUNS} holds the "
                f"sweep's runs: {_RESTART}")
        raise FileNotFoundError(f"{out}: no sweep here ({MANIFEST} not found)")
    manifest = _read_json(path, _rebuild_advice(out))
    if isinstance(manifest, dict) and manifest.get("format") != FORMAT:
        fmt = manifest.get("format")
        if isinstance(fmt, str) and fmt.startswith("optical-sweep/"):
            raise ValueError(f"{path}: a sweep manifest of format {fmt!r}, written by another "
                             f"version of optical (this one reads {FORMAT!r})")
        if "definition" not in manifest:  # someone else's file: no advice to delete it
            raise ValueError(f"{path}: not an optical sweep manifest (expected format "
                             f"{FORMAT!r})")
        problem: str | None = f"'format' is {fmt!r}, not {FORMAT!r}"
    else:
        problem = _manifest_problem(manifest)
    if problem == "missing key 'run_ids'" and "results_version" not in manifest:
        raise ValueError(f"{path}: a sweep manifest of an early version of optical, which did "
                         "not record its runs' ids: this version cannot place its runs. Read "
                         "it with the version that wrote it, or run the sweep again into a new "
                         "--out directory")
    if problem is not None:
        raise ValueError(f"{path}: damaged sweep manifest: {problem}. {_rebuild_advice(out)}")
    return manifest


def check_placement(path: Path, record: Mapping[str, Any], point: Mapping[str, Any],
                    seed: int, out: Path) -> None:
    """Refuse a run file whose own config, workload and seed contradict where
    the manifest places its run id (``point``, encoded as the manifest stores
    it, and ``seed``): a manifest edited by hand (its run ids reordered, say)
    would otherwise pass one point's results off as another's. A run
    shared with another sweep is placed by its whole config and seed, which
    its id hashes, so it passes."""
    problem = None
    if record["seed"] != seed:
        problem = f"seed {record['seed']}, where {MANIFEST} places it at seed {seed}"
    else:
        for name, value in point.items():
            section, _, field = name.partition(".")
            if name.startswith(WORKLOAD_PREFIX):
                stored = record.get("workload")
                if not isinstance(stored, Mapping) or field not in stored:
                    continue  # a run of a version that did not record it: its id hashes it
            else:
                stored = record["config"].get(section, {})
            stored = stored.get(field, "(none)") if isinstance(stored, Mapping) else "(none)"
            if stored == "(none)" or decode_value(name, stored) != decode_value(name, value):
                problem = (f"{name} = {stored!r}, where {MANIFEST} places it at the point "
                           f"{name} = {value!r}")
                break
    if problem is not None:
        raise ValueError(f"{path}: this run holds {problem}: the manifest does not match its "
                         f"runs (edited, or damaged). {_rebuild_advice(out)}")


_RECORD_KEYS = (("run_id", str, "a string"), ("point", int, "an integer"),
                ("seed", int, "an integer"), ("params", dict, "a JSON object"),
                ("metrics", dict, "a JSON object"), ("elapsed_s", numbers.Real, "a number"),
                ("optical_version", str, "a string"), ("config", dict, "a JSON object"))


def _stored_number(value: Any) -> bool:
    """A metric value as :func:`encode` stores it (booleans, which versions
    before the checks stored for custom workloads, are read as 0 / 1)."""
    if isinstance(value, str):
        return value in ("inf", "-inf", "nan")
    if isinstance(value, int):  # JSON's integers have no bound; a float column has
        return abs(value) <= sys.float_info.max
    return value is None or isinstance(value, float)


class _Damaged:
    """The errors of a sweep's damaged run files, gathered (see
    :func:`damaged_runs`)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def read(self, path: Path) -> dict[str, Any] | None:
        """:func:`read_record` of ``path``, or None (its error kept) if the
        file is damaged. Only the file's own damage is gathered: a run that
        does not match the manifest raises at once, with its own advice
        (rebuild the manifest; deleting runs would lose good ones)."""
        try:
            return read_record(path)
        except ValueError as err:
            self.errors.append(str(err))
            return None


@contextlib.contextmanager
def damaged_runs(out: Path) -> Iterator[_Damaged]:
    """Read run files in the block with ``.read(path)``; at its end one
    ValueError names every damaged file (one was named per attempt: a
    ``cp -r`` onto a full disk that truncated 300 files took 300 resumes)."""
    damaged = _Damaged()
    yield damaged
    if len(damaged.errors) == 1:
        raise ValueError(damaged.errors[0])
    if damaged.errors:
        shown = damaged.errors[:_DAMAGED_SHOWN]
        more = len(damaged.errors) - len(shown)
        raise ValueError(f"{out / RUNS}: {len(damaged.errors)} run files are damaged; delete "
                         "them and resume the sweep to run those runs again:\n"
                         + "\n".join(f"  {e}" for e in shown)
                         + (f"\n  ... and {more} more" if more else ""))


_DAMAGED_SHOWN = 20


def read_record(path: Path) -> dict[str, Any]:
    """One run file, its structure checked; ValueError names the file. (Its
    ``point`` and ``params`` are where the run stood in the sweep that ran
    it; the manifest says where it stands now, which may differ after a
    rebuilt manifest, or in another sweep whose run it is: a run id hashes
    the workload, the whole config and the seed, not the swept paths.)"""
    advice = "Delete it and resume the sweep to run that run again"
    record = _read_json(path, advice, _MAX_RECORD_BYTES)
    problem = None
    if not isinstance(record, dict):
        problem = f"expected a JSON object, got {type(record).__name__}"
    else:
        for key, kind, kind_name in _RECORD_KEYS:
            if key not in record:
                problem = f"missing key {key!r}"
            elif not isinstance(record[key], kind) or isinstance(record[key], bool):
                problem = f"{key!r} is {record[key]!r}, not {kind_name}"
            if problem:
                break
        else:
            if record["run_id"] != path.stem:
                problem = f"'run_id' {record['run_id']!r} is not the file's name"
            else:
                problem = next((f"metric {name!r} is {reprlib.repr(value)}, not a number"
                                for name, value in record["metrics"].items()
                                if not _stored_number(value)), None)
    if problem is not None:
        raise ValueError(f"{path}: not a run record of this sweep: {problem}. {advice}")
    return record


def _open_lock(path: Path) -> int:
    """A descriptor of the sweep's lock file, made if missing: read-write, or
    read-only where a colleague's lock file denies writing (flock takes
    either), never through a symlink, never blocking on a FIFO."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except PermissionError:
        if not os.path.isfile(path) or os.path.islink(path):
            raise
        return os.open(path, os.O_RDONLY | flags)


#: Set to 1 to run sweeps on a file system without ``flock`` (Lustre mounted
#: ``noflock``, some NFS) unlocked, with a warning: the user then keeps a
#: second sweep out of the directory.
UNLOCKED_ENV = "OPTICAL_SWEEP_WITHOUT_FLOCK"


def _without_flock() -> bool:
    """Whether :data:`UNLOCKED_ENV` asks for sweeps without the lock
    (ValueError for a value other than unset, "", 0 or 1)."""
    value = os.environ.get(UNLOCKED_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{UNLOCKED_ENV}={value!r}: expected 1 (run without the sweep's lock "
                         "where the file system has no flock) or 0")
    return value == "1"


@contextlib.contextmanager
def lock(out: Path) -> Iterator[None]:
    """Refuse a second sweep process on the same directory (Unix). A lock
    file made here is removed again if the sweep fails before it wrote its
    manifest (a directory refused as holding no sweep keeps nothing of it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = out / ".lock"
    unlocked = _without_flock()  # (a bad value is refused wherever it is set)
    while True:
        made = not os.path.lexists(path)
        # Never through a symlink (a directory from someone else: its .lock may
        # name any file), never truncated, never blocking on a FIFO.
        try:
            fd = _open_lock(path)
        except OSError as err:
            if not os.path.islink(path) and (err.errno == errno.EROFS or (
                    err.errno in (errno.EACCES, errno.EPERM) and not os.access(out, os.W_OK))):
                raise ValueError(f"{out}: the sweep directory cannot be written "
                                 f"({err.strerror}: {path.name}); a sweep here can be read "
                                 "(optical.load_sweep, optical plot) but not run or "
                                 "resumed") from None
            why = "a symlink" if os.path.islink(path) else (err.strerror or str(err))
            raise ValueError(f"{path}: the sweep's lock file cannot be opened ({why}); a "
                             "sweep's .lock is a plain file of its own: remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{path}: the sweep's lock is not a plain file (a FIFO or a "
                             "device); remove it")
        handle = os.fdopen(fd, "r")  # closed below, or held until the sweep ends
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise ValueError(f"{out}: another sweep is running on this directory; wait for it "
                             "to end (it keeps its finished runs there), or give this one "
                             "another directory") from None
        except OSError as err:  # a file system without flock (ENOSYS, ENOLCK)
            if unlocked:
                try:  # (raised under -W error: then as the refusal below, tidied)
                    warnings.warn(f"{out}: running without the sweep's lock "
                                  f"({err.strerror or err}; {UNLOCKED_ENV}=1): a second sweep "
                                  "on this directory is not refused", RuntimeWarning,
                                  stacklevel=3)
                except BaseException:
                    handle.close()
                    if made:
                        path.unlink(missing_ok=True)
                    raise
                break  # held, unlocking nothing, until the sweep ends
            handle.close()
            if made:
                path.unlink(missing_ok=True)
            raise ValueError(f"{out}: cannot lock {path.name} ({err.strerror or err}): this "
                             "file system does not support the lock that keeps a second "
                             "sweep out of the directory; use a directory on one that "
                             "does (a local disk, or a mount with locking), or set "
                             f"{UNLOCKED_ENV}=1 to run without it, making sure that no "
                             "other sweep runs there meanwhile") from None
        try:  # a lock file a failed sweep removed meanwhile locks nothing: again
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    with handle:
        try:
            yield
        except BaseException:
            if made and not (out / MANIFEST).exists():
                path.unlink(missing_ok=True)
            raise
        finally:
            with contextlib.suppress(OSError):  # (nothing to unlock without flock)
                fcntl.flock(handle, fcntl.LOCK_UN)


def _workload_record(workload: Any) -> dict[str, Any]:
    """What a run file records of its workload: ``to_dict()``, with the
    fields it leaves out at their defaults (a dataclass's numbers, strings,
    booleans and None), so every field a sweep can sweep is there to check
    the run's placement against."""
    data = dict(workload.to_dict())
    if dataclasses.is_dataclass(workload) and not isinstance(workload, type):
        for field in dataclasses.fields(workload):
            value = getattr(workload, field.name)
            if value is None or isinstance(value, bool | int | float | str):
                data.setdefault(field.name, value)
    return data


def write_run(runs_dir: Path, task: Task, point: Mapping[str, Any], outcome: Mapping[str, Any],
              version: str, moved: str | None = None) -> None:
    """Store one finished run as ``runs/<run_id>.json`` (atomically).
    ``moved``: the model directory a layer sweep whose model has moved began
    with, recorded as the workload's (the directory its id hashes), with
    where the model was as ``moved_model_dir``."""
    record = {
        "run_id": task.run_id,
        "point": task.point,
        "seed": task.seed,
        "params": point,
        "metrics": outcome["metrics"],
        "elapsed_s": outcome["elapsed_s"],
        # The worker's clock (a custom executor's outcome may not say: the driver's).
        "finished_at": finished if isinstance(finished := outcome.get("finished_at"), str)
        else utc_now(),
        "optical_version": outcome.get("optical_version", version),  # the worker's
        "results_version": RESULTS_VERSION,
        "environment": outcome.get("environment"),  # kernels.environment() of the worker
        # How many runs one vmap computed it with (None: alone, or a custom executor's).
        "vmap_batch": batch if type(batch := outcome.get("vmap_batch")) is int else None,
        "config": json.loads(task.config.to_json()),
        "workload": _workload_record(task.workload),
    }
    if moved is not None:
        record["moved_model_dir"] = record["workload"]["model_dir"]
        record["workload"]["model_dir"] = moved
    atomic_write(runs_dir / f"{task.run_id}.json", json.dumps(encode(record)) + "\n")


def _text(value: Any) -> str | None:
    """A run file's text field, or None (absent: a run stored before it was
    recorded, or by a custom executor's outcome)."""
    return value if isinstance(value, str) else None


def _commit(record: Mapping[str, Any]) -> str | None:
    """The git commit of optical that computed a run (its environment's
    ``optical_commit``), or None: not from a git checkout, or stored before
    commits were recorded."""
    environment = record.get("environment")
    return _text(environment.get("optical_commit")) if isinstance(environment, dict) else None


def _described(definition: Mapping[str, Any]) -> dict[str, str]:
    """The workload's label (without the fields swept) and the base config's
    (:func:`presets.describe`: its preset, or the nearest with the few fields
    it changes), for a figure's title: a description, so a manifest of
    another version (a config field this one lacks) still loads, as "custom
    config"."""
    swept = set(definition.get("params") or ())
    try:
        base = presets.describe(OpticalConfig.from_dict(definition["base_config"]),
                                ignore=swept)
    except (ValueError, TypeError, KeyError):
        base = None
    workload = definition.get("workload")
    fields = {p.removeprefix(WORKLOAD_PREFIX) for p in swept if p.startswith(WORKLOAD_PREFIX)}
    return {"workload": workload_label(workload, swept=fields) if isinstance(workload, Mapping)
            else "custom workload", "base": base or "custom config"}


def read_frame(out: Path, pd: Any) -> Any:
    """The finished runs of the sweep in ``out`` as one DataFrame (``pd`` is
    pandas), placed at the manifest's points and seeds; see
    :func:`optical.sweep.sweep` for the columns."""
    manifest = read_manifest(out)
    paths = list(manifest["params"])
    # Point and seed of each run as the manifest places it (run ids hash the
    # workload, config and seed, not the point's position).
    place = {run_id: (point, seed)
             for point, ids in enumerate(manifest["run_ids"])
             for seed, run_id in zip(manifest["definition"]["seeds"], ids, strict=False)}
    records = []
    with damaged_runs(out) as damaged:
        for run_id in sorted(place):
            path = out / RUNS / f"{run_id}.json"
            if path.is_file():
                point, seed = place[run_id]
                record = damaged.read(path)
                if record is not None:
                    check_placement(path, record, manifest["points"][point], seed, out)
                    record["point"], record["seed"] = point, seed
                    record["params"] = manifest["points"][record["point"]]
                    records.append(record)
    records.sort(key=lambda r: (r["point"], r["seed"]))
    reserved = set(META_COLUMNS) | set(paths)
    metric_names: dict[str, None] = {}
    for record in records:  # (runs of older versions may hold a "seed" metric)
        metric_names.update(dict.fromkeys(m for m in record["metrics"] if m not in reserved))
    columns: dict[str, Any] = {
        "point": pd.Series([r["point"] for r in records], dtype="int64"),
        "seed": pd.Series([r["seed"] for r in records], dtype="uint64"),
    }
    for path in paths:
        values = [decode_value(path, r["params"][path]) for r in records]
        columns[path] = pd.Series(values, dtype=object if None in values else None)
    for name in metric_names:
        values = [r["metrics"].get(name, math.nan) for r in records]
        columns[name] = pd.Series([float(v) if isinstance(v, str) else v for v in values],
                                  dtype=None if values else "float64")
    columns["run_id"] = pd.Series([r["run_id"] for r in records], dtype=object)
    columns["elapsed_s"] = pd.Series([r["elapsed_s"] for r in records], dtype="float64")
    columns["finished_at"] = pd.Series([_text(r.get("finished_at")) for r in records],
                                       dtype=object)
    columns["optical_version"] = pd.Series([r["optical_version"] for r in records], dtype=object)
    columns["optical_commit"] = pd.Series([_commit(r) for r in records], dtype=object)
    columns["config"] = pd.Series([json.dumps(r["config"], sort_keys=True) for r in records],
                                  dtype=object)
    frame = pd.DataFrame(columns)
    frame.attrs["sweep"] = {"out": str(out), "params": paths, "metrics": list(metric_names),
                            "results_version": results_version(manifest),
                            "runs": sum(len(ids) for ids in manifest["run_ids"]),
                            "finished": len(frame), **_described(manifest["definition"]),
                            "definition_hash": manifest["definition_hash"],
                            # the definition but its seeds (the seed column; a
                            # list pandas would copy at every step): results.parquet
                            # then rebuilds each run's call
                            "definition": {k: v for k, v in manifest["definition"].items()
                                           if k != "seeds"}}
    return frame
