"""Reading a Hugging Face checkpoint's ``*.safetensors``, one tensor at a time.

A :class:`Checkpoint` knows which file holds which tensor (from
``model.safetensors.index.json`` when present, else from the files' headers)
and reads a tensor only when asked, so one layer of a 70B model needs only
that layer's tensors in memory. Tensors come back as float32 (bf16 and fp16
convert exactly). bf16 is read by the ``safetensors`` package's numpy
framework through ``ml_dtypes``; both are in the ``models`` extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePath

import numpy as np

from optical._files import MODEL_JSON_BYTES, read_plain
from optical._validation import parse_json

__all__ = ["Checkpoint", "find_checkpoint_files", "fingerprint", "sampled_digest"]

INDEX_FILE = "model.safetensors.index.json"
#: TF-era names of a LayerNorm's scale and shift (bert-base-uncased on the Hub
#: stores them), read under the names transformers renames them to on load.
LEGACY_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
#: Weights in formats this library does not read (PyTorch pickles, Flax,
#: TensorFlow, GGUF, ONNX): a directory holding them and no safetensors is
#: refused, not given synthetic weights.
_OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.gguf", "*.ckpt*",
                  "*.onnx", "onnx/*.onnx")
_INSTALL_HINT = "install the models extra: pip install 'optical[models]'"


def find_checkpoint_files(directory: Path) -> list[Path]:
    """The ``*.safetensors`` files of a model directory (sorted); [] if none.

    macOS's AppleDouble sidecars (``._model.safetensors``) are not weights
    and are skipped, as Hugging Face skips them.

    Raises
    ------
    ValueError
        If the directory holds weights only in formats this library does not
        read (PyTorch pickles, Flax, TensorFlow, GGUF, ONNX), a sharded
        checkpoint's index without its shards, or a ``*.safetensors`` that is not a
        regular file (a directory, a FIFO that would block the reader, a
        dangling symlink).
    """
    files = sorted(p for p in directory.glob("*.safetensors") if not p.name.startswith("._"))
    for path in files:
        problem = not_a_file(path)
        if problem is not None:
            raise ValueError(f"{path}: not a safetensors file: {problem}")
    if not files:
        if (directory / INDEX_FILE).exists():
            raise ValueError(f"{directory / INDEX_FILE}: a sharded checkpoint's index, but "
                             "none of its *.safetensors shards is in the directory (an "
                             "interrupted download?); fetch the shards, or remove the index "
                             "for synthetic weights")
        others = sorted({p.relative_to(directory).as_posix() for pattern in _OTHER_WEIGHTS
                         for p in directory.glob(pattern) if not p.name.startswith("._")})
        if others:
            raise ValueError(f"{directory}: found {', '.join(others)} but no *.safetensors; "
                             "only safetensors checkpoints are read (convert the checkpoint "
                             "with transformers' save_pretrained(safe_serialization=True)); "
                             "move them away for synthetic weights")
    return files


def not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a regular file one can open (None when it is)."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        link = f", a symlink to {os.readlink(path)}" if path.is_symlink() else ""
        return f"it cannot be opened ({err.strerror}{link})"
    if stat.S_ISREG(mode):
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else \
        "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
    return f"it is {kind}, not a file"


def fingerprint(directory: str | Path) -> str | None:
    """A short hash of the checkpoint a model directory holds, None when it
    holds no ``*.safetensors`` (synthetic weights): ``config.json``'s bytes
    and, for each safetensors file and the index, its name, size, the name
    it resolves to (in the Hugging Face cache, the blob's content hash) and
    its header (every tensor's name, dtype, shape and offsets). Weights
    rewritten in place with the same shapes and no cache blob name are not
    told apart (hashing every byte of a 70B checkpoint would take minutes).

    Raises
    ------
    ValueError
        If the directory holds PyTorch pickles but no safetensors.
    """
    directory = Path(directory)
    files = find_checkpoint_files(directory)
    if not files:
        return None
    digest = hashlib.sha256()
    config = directory / "config.json"
    digest.update(read_plain(config, MODEL_JSON_BYTES) if config.is_file() else b"")
    index = directory / INDEX_FILE
    for path in [*files, *([index] if index.is_file() else [])]:
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{path.resolve().name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if path == index:
                digest.update(handle.read())
                continue
            length = int.from_bytes(handle.read(8), "little")
            digest.update(handle.read(min(length, _MAX_HEADER)))
    return digest.hexdigest()[:20]


def sampled_digest(directory: str | Path, weights: str | Path | None = None) -> str:
    """A short hash of the bytes a model's numbers come from, where
    :func:`fingerprint` stops: ``directory``'s ``config.json`` (a synthetic
    model's shapes and statistics follow it; :func:`fingerprint` is None
    there) and, for the checkpoint in ``weights`` (None: synthetic weights),
    samples of each ``*.safetensors`` file's bytes, :data:`_SAMPLES`
    stretches of :data:`_SAMPLE_BYTES` spread evenly over it and its last
    one. Weights rewritten in place at the same shapes (a fine-tune saved
    over its base) change nearly every byte, so the samples tell them apart
    for ~70 KiB read per file, where hashing a 70B checkpoint's every byte
    would take minutes; a change confined to a few unsampled bytes is not
    seen."""
    directory = Path(directory)
    digest = hashlib.sha256()
    config = directory / "config.json"
    try:
        digest.update(read_plain(config, MODEL_JSON_BYTES))
    except (OSError, ValueError):  # named by the load that reads it
        digest.update(b"\0unreadable")
    for path in find_checkpoint_files(Path(weights)) if weights is not None else ():
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            for start in sorted({size * i // _SAMPLES for i in range(_SAMPLES)}
                                | {max(0, size - _SAMPLE_BYTES)}):
                handle.seek(start)
                digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:20]


#: sampled_digest's samples of each file: how many, and their length in bytes.
_SAMPLES = 16
_SAMPLE_BYTES = 4096


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"reading *.safetensors needs the safetensors package; "
                          f"{_INSTALL_HINT}") from None
    return safe_open


#: Largest header safetensors reads (its own cap): a larger "length" is not a header.
_MAX_HEADER = 100_000_000


def _truncation(path: Path) -> str | None:
    """Why a safetensors file that failed to open is not one, or is short,
    from its first bytes and its header's own lengths (an 8-byte
    little-endian header length, a JSON header, then the data its
    ``data_offsets`` span); None when neither can be told."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(9)
            if prefix.startswith(b"version "):  # e.g. https://git-lfs.github.com/spec/v1
                return ("it is a Git LFS pointer, not the weights (a clone made without "
                        "git-lfs): fetch them with `git lfs pull`")
            if len(prefix) < 8:
                return f"it is {size} bytes, shorter than a safetensors header"
            length = int.from_bytes(prefix[:8], "little")
            if length > _MAX_HEADER or prefix[8:9] not in (b"{", b""):
                return None  # not a safetensors file at all: the reader says what it found
            if 8 + length > size:
                return (f"it is {size} bytes, but its header alone declares {8 + length}: "
                        "truncated (an interrupted download or copy?)")
            handle.seek(8)
            header = parse_json(handle.read(length))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
        for name, entry in tensors.items():  # a header whose entry contradicts itself
            start, stop = (int(o) for o in entry["data_offsets"])
            width = _ITEMSIZE.get(entry["dtype"])
            count = int(np.prod([int(d) for d in entry["shape"]], dtype=np.int64))
            if width is not None and (stop - start) != count * width:
                return (f"its header gives tensor {name!r} dtype {entry['dtype']} and shape "
                        f"{list(entry['shape'])} ({count * width} bytes) but data_offsets "
                        f"[{start}, {stop}] ({stop - start} bytes): a damaged header")
    except OSError as err:  # the reader calls every failed open "No such file"
        return f"it cannot be read: {err.strerror or err}"
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # damaged otherwise: the reader's own message says how
    if 8 + length + end > size:
        return (f"it is {size} bytes, but its header declares {8 + length + end}: truncated "
                "(an interrupted download or copy?)")
    return None


#: Bytes per element of the safetensors dtypes a header may name.
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _unreadable(path: Path, err: Exception) -> str:
    """The reason for an error message on a file the reader refused."""
    return _truncation(path) or str(err)


class Checkpoint:
    """The tensors of a model directory's safetensors files, read lazily.

    Parameters
    ----------
    directory : path
        A Hugging Face model directory holding ``*.safetensors`` (and, for a
        sharded checkpoint, ``model.safetensors.index.json``).

    Attributes
    ----------
    files : list of Path
        The safetensors files.
    index : Path or None
        The index the tensors are located by, when there is one (else every
        file's header is read); a tensor it does not list is missing.

    A tensor stored under a TF-era LayerNorm name (``...LayerNorm.gamma``,
    ``...LayerNorm.beta``) is found under the name transformers gives it on
    load (``...LayerNorm.weight``, ``...LayerNorm.bias``).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"{self.directory}: not a directory (a checkpoint is a "
                                    "model directory holding *.safetensors files)")
        files = find_checkpoint_files(self.directory)
        if not files:
            raise FileNotFoundError(f"{self.directory}: no *.safetensors files")
        self.files = files
        self.index = self.directory / INDEX_FILE if (self.directory / INDEX_FILE).is_file() \
            else None
        self._where, self._stored = self._rename_legacy(self._map_tensors())

    def _map_tensors(self) -> dict[str, Path]:
        index = self.index
        if index is not None:
            try:
                weight_map = parse_json(
                    read_plain(index, MODEL_JSON_BYTES).decode("utf-8"))["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{index}: not a safetensors index with a 'weight_map' "
                                 f"({err})") from None
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise ValueError(f"{index}: 'weight_map' must map tensor names to shard file "
                                 "names (strings)")
            where: dict[str, Path] = {}
            checked: set[Path] = set()
            for name, file in weight_map.items():
                # Judged by the name the index gives, not by where it resolves to: in
                # the Hugging Face cache every shard is a symlink into ../../blobs.
                parts = PurePath(file).parts
                if not parts or PurePath(file).is_absolute() or ".." in parts:
                    raise ValueError(f"{index}: tensor {name!r} is in {file!r}, which is not "
                                     f"a file of {self.directory}")
                path = self.directory / file
                if path in checked:  # each shard's file is looked at once
                    where[name] = path
                    continue
                try:
                    path.lstat()
                except FileNotFoundError:
                    raise FileNotFoundError(f"{index}: tensor {name!r} is in {file}, which is "
                                            f"missing from {self.directory}") from None
                except OSError as err:  # a name too long for the file system, say
                    raise ValueError(f"{index}: tensor {name!r} is in {file[:80]!r}, which "
                                     f"cannot be a file of {self.directory} "
                                     f"({err.strerror})") from None
                problem = not_a_file(path)
                if problem is not None:
                    raise ValueError(f"{index}: tensor {name!r} is in {path}: {problem}")
                checked.add(path)
                where[name] = path
            single = self.directory / "model.safetensors"
            if single.is_file() and single not in where.values():
                raise ValueError(f"{self.directory}: holds both model.safetensors and "
                                 f"{index.name}, which does not list it: two checkpoints "
                                 "(Hugging Face would load model.safetensors and ignore the "
                                 "index's shards); remove the one you do not mean")
            # Every shard's header, read once: a truncated or corrupt shard (an
            # interrupted download) is named now, not when a layer first needs it.
            for path in sorted(set(where.values())):
                held = set(self._header_names(path))
                absent = sorted(n for n, p in where.items() if p == path and n not in held)
                if absent:
                    raise ValueError(f"{index}: lists {len(absent)} tensor(s) in {path.name} "
                                     f"that it does not hold, e.g. {absent[0]!r}")
            return where
        where = {}
        for path in self.files:
            names = self._header_names(path)
            for name in names:
                if name in where:
                    pair = {where[name].name, path.name}
                    why = (" (two checkpoints: Hugging Face loads model.safetensors and "
                           "ignores a variant such as model.fp16.safetensors unless asked "
                           "for it); remove or move the one you do not mean"
                           if "model.safetensors" in pair else "")
                    raise ValueError(f"tensor {name!r} appears in both {where[name].name} "
                                     f"and {path.name}{why}")
                where[name] = path
        return where

    def _rename_legacy(self, where: dict[str, Path]) -> tuple[dict[str, Path], dict[str, str]]:
        """``where`` under transformers' names, and the stored name of each renamed one."""
        renamed: dict[str, Path] = {}
        stored: dict[str, str] = {}
        for name, path in where.items():
            for old, new in LEGACY_NAMES.items():
                if name.endswith(old):
                    modern = name[:-len(old)] + new
                    if modern in where:
                        raise ValueError(f"{self.directory}: holds both {name!r} and {modern!r}, "
                                         "two names of one tensor (transformers reads the "
                                         "first as the second); remove one")
                    stored[modern] = name
                    name = modern
                    break
            renamed[name] = path
        return renamed, stored

    @staticmethod
    def _header_names(path: Path) -> list[str]:
        """The tensor names in a safetensors file's header."""
        try:
            with _safe_open()(str(path), framework="numpy") as handle:
                return list(handle.keys())
        except ImportError:
            raise
        except Exception as err:  # the Rust reader raises its own error types
            raise ValueError(f"{path}: not a readable safetensors file "
                             f"({_unreadable(path, err)})") from None

    def __repr__(self) -> str:
        """``Checkpoint('models/x', 3 files, 291 tensors, indexed)``: which
        directory and how much of it, not an object address."""
        files = f"{len(self.files)} file{'s' * (len(self.files) != 1)}"
        indexed = ", indexed" if self.index is not None else ""
        return (f"{type(self).__name__}({str(self.directory)!r}, {files}, "
                f"{len(self._where)} tensors{indexed})")

    def names(self) -> list[str]:
        """Every tensor name, sorted."""
        return sorted(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def missing(self, name: str) -> str:
        """Why ``name`` is not found, for an error message: absent from the
        checkpoint, or (a sharded one, read through its index) from the index,
        which a shard might still hold."""
        if self.index is not None:
            return f"tensor {name!r} is not listed in {self.index}"
        return f"tensor {name!r} is missing from the checkpoint in {self.directory}"

    def read(self, name: str, shape: Sequence[int] | None = None, *,
             why: str = "config.json") -> np.ndarray:
        """One tensor as float32 (exact for bf16, fp16 and fp32 storage).

        Parameters
        ----------
        name : str
            The tensor's full name, e.g. ``"model.layers.0.mlp.down_proj.weight"``.
        shape : sequence of int, optional
            The shape the model's config implies; a different stored shape is
            an error.
        why : str
            Where ``shape`` comes from, for the error message.

        Raises
        ------
        ValueError
            A missing tensor, a shape that contradicts ``shape``, non-finite
            values, or a damaged file; each message names the tensor.
        TypeError
            A dtype that is not a float (e.g. int8 or fp8); the message names
            the tensor and its dtype.
        """
        if name not in self._where:
            raise ValueError(self.missing(name))
        path = self._where[name]
        name = self._stored.get(name, name)  # the file's own name, in messages too
        try:
            array = self._read(path, name, shape, why)
        except (ValueError, TypeError, ImportError):
            raise
        except Exception as err:  # the Rust reader's own error types: a damaged file
            raise ValueError(f"tensor {name!r}: {path} is not a readable safetensors file "
                             f"({_unreadable(path, err)})") from None
        with np.errstate(over="ignore"):  # F64 beyond float32's range: named below
            out = array.astype(np.float32)
        if not np.isfinite(out).all():
            if np.isfinite(array).all():  # finite F64 values that float32 cannot hold
                raise ValueError(f"tensor {name!r} in {path.name} holds values beyond "
                                 "float32's range (the emulator computes in float32)")
            raise ValueError(f"tensor {name!r} in {path.name} contains NaN or infinite values")
        return out

    @staticmethod
    def _read(path: Path, name: str, shape: Sequence[int] | None, why: str) -> np.ndarray:
        with _safe_open()(str(path), framework="numpy") as handle:
            if name not in handle.keys():
                raise ValueError(f"tensor {name!r} is missing from {path} (the index lists it "
                                 "there)")
            view = handle.get_slice(name)
            stored_dtype, stored_shape = view.get_dtype(), tuple(view.get_shape())
            if shape is not None and stored_shape != tuple(shape):
                raise ValueError(f"tensor {name!r} has shape {stored_shape} in {path.name}, but "
                                 f"{why} implies {tuple(shape)}")
            if stored_dtype not in _FLOAT_DTYPES:
                raise TypeError(f"tensor {name!r} has dtype {stored_dtype}; expected one of "
                                f"{', '.join(_FLOAT_DTYPES)}")
            if stored_dtype == "BF16":
                try:
                    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
                except ImportError:
                    raise ImportError(f"tensor {name!r} is bfloat16, which needs ml_dtypes; "
                                      f"{_INSTALL_HINT}") from None
            return np.asarray(handle.get_tensor(name))
