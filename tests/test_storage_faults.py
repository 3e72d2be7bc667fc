"""Storage faults while the library reads and writes: each error names the
file, says what to do, and keeps the finished work (a storage audit)."""

import dataclasses
import errno
import os
from pathlib import Path

import pytest

import optical
from optical import _files, _sweep_store
from optical.sweep import load, resume

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

WL = optical.MatmulWorkload(tokens=8, k=32, n=16)
PARAMS = {"adc.bits": [6, 8]}


def _sweep(out, workload=WL):
    return optical.sweep(workload, PARAMS, seeds=1, out=out, executor="serial",
                         progress=False)


def test_a_read_error_names_the_run_file(tmp_path, monkeypatch):
    """EIO reading one run file: the error names it (it named no file, and
    the user could not tell which of thousands to restore)."""
    out = tmp_path / "s"
    _sweep(out)
    bad = sorted((out / "runs").glob("*.json"))[0]
    real_open = open

    class Failing:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self):
            raise OSError(errno.EIO, "Input/output error")

    def flaky_open(file, *args, **kwargs):
        handle = real_open(file, *args, **kwargs)
        if isinstance(file, int) and os.readlink(f"/proc/self/fd/{file}") == str(bad):
            return Failing(handle)
        return handle

    monkeypatch.setattr(_files, "open", flaky_open, raising=False)
    with pytest.raises(OSError, match="Input/output error") as caught:
        load(out)
    assert caught.value.filename == str(bad)


def test_a_run_file_or_manifest_that_is_a_directory_is_named(tmp_path):
    out = tmp_path / "s"
    _sweep(out)
    run = sorted((out / "runs").glob("*.json"))[0]
    run.unlink()
    run.mkdir()
    with pytest.raises(ValueError, match=f"{run.name}: not a plain file"):  # was "4: Is a
        resume(out, executor="serial", progress=False)                      # directory"
    run.rmdir()
    manifest = out / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    # It said "no sweep manifest (manifest.json not found) ... start the same
    # sweep again", which met the same error again.
    with pytest.raises(ValueError, match="manifest.json: not a file .*remove it"):
        _sweep(out)


def test_a_sweep_directory_that_cannot_be_written_is_not_blamed_on_its_lock(tmp_path,
                                                                            monkeypatch):
    """A read-only directory (another user's, a read-only mount): the error
    says so and that the sweep can be read, not "remove" the lock file
    (someone else's)."""
    out = tmp_path / "s"
    _sweep(out)
    real = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_sweep_store.os, "open", refuse)
    monkeypatch.setattr(_sweep_store.os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match="the sweep directory cannot be written .* can be "
                                         "read .* but not run or resumed") as caught:
        resume(out, executor="serial", progress=False)
    assert "remove it" not in str(caught.value)
    monkeypatch.undo()
    assert len(load(out)) == 2


def test_a_colleagues_lock_file_that_denies_writing_still_locks(tmp_path, monkeypatch):
    """A shared sweep: the .lock a colleague's run left (mode 0644) cannot be
    opened for writing by another member of the group, who can write the
    directory: flock takes a read-only descriptor, so the resume runs
    (review: it was told the directory cannot be written)."""
    out = tmp_path / "s"
    optical.sweep(WL, {"adc.bits": [6, 8, 10]}, seeds=1, out=out, executor="serial",
                  progress=False)
    next((out / "runs").glob("*.json")).unlink()
    real = os.open

    def read_only_lock(path, flags, *args, **kwargs):
        if str(path).endswith(".lock") and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(_sweep_store.os, "open", read_only_lock)
    summary = resume(out, executor="serial", progress=False)
    assert summary.ran == 1 and len(load(out)) == 3


@dataclasses.dataclass(frozen=True)
class Wanders:
    """A workload whose first run changes the working directory."""

    to: str

    def run(self, config, seed):
        os.chdir(self.to)
        return WL.run(config, seed)

    def to_dict(self):
        return {"kind": "wanders"}


def test_a_relative_out_survives_a_change_of_directory_mid_sweep(tmp_path, monkeypatch):
    """Later runs went to <new cwd>/<out> (another sweep's directory, or a
    missing one: a finished run lost), and the table returned was read
    there."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    frame = _sweep(Path("s"), Wanders(str(elsewhere)))
    assert len(frame) == 2
    assert len(list((home / "s" / "runs").glob("*.json"))) == 2
    assert not (elsewhere / "s").exists()


def test_an_in_place_output_that_fails_names_the_file(tmp_path):
    """A --json target with a second hard link is written in place (a new
    file would break the link): a full disk's error names it."""
    target = tmp_path / "report.json"
    target.write_text("{}\n")
    os.link(target, tmp_path / "other-link.json")

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left") as caught:
        _files.write_output(target, full)
    assert caught.value.filename == str(target)


def test_every_damaged_run_file_is_named_at_once(tmp_path):
    """Run files truncated (a copy onto a disk that filled): one error names
    them all, for load and resume alike (one was named per attempt), and
    deleting them lets the sweep finish."""
    out = tmp_path / "s"
    optical.sweep(WL, {"adc.bits": [4, 5, 6, 8]}, seeds=1, out=out, executor="serial",
                  progress=False)
    runs = sorted((out / "runs").glob("*.json"))
    for run in runs[:3]:
        run.write_bytes(run.read_bytes()[:40])
    for attempt in (lambda: load(out), lambda: resume(out, executor="serial", progress=False)):
        with pytest.raises(ValueError, match="3 run files are damaged") as caught:
            attempt()
        assert all(run.name in str(caught.value) for run in runs[:3])
        assert runs[3].name not in str(caught.value)
    for run in runs[:3]:
        run.unlink()
    resume(out, executor="serial", progress=False)
    assert len(load(out)) == 4


def test_a_manifest_at_odds_with_its_runs_is_not_blamed_on_them(tmp_path):
    """Runs that do not match the manifest (its run ids edited) are not
    damaged files: the advice is to rebuild the manifest, not to delete every
    finished run (review: the gathered header said to delete them)."""
    import json

    out = tmp_path / "s"
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=2, out=out, executor="serial",
                  progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["run_ids"] = manifest["run_ids"][::-1]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as caught:
        load(out)
    assert "run files are damaged" not in str(caught.value)
    assert "the manifest does not match its runs" in str(caught.value)


def test_a_new_file_whose_target_vanished_mid_write_gets_the_umasks_mode(tmp_path):
    """replacing() creates its temporary private when the target exists; if
    the target is gone by the rename (or was a dangling link), the new file
    gets the umask's bits, as open() gives, not 0600 (review)."""
    target = tmp_path / "report.json"
    target.write_text("{}")
    previous = os.umask(0o022)
    try:
        with _files.replacing(target) as tmp:
            tmp.write_text("[]")
            target.unlink()
    finally:
        os.umask(previous)
    assert target.read_text() == "[]" and (target.stat().st_mode & 0o777) == 0o644
