"""A sweep directory received from someone else: nothing outside it is
written or removed through its symlinks, and a special file in it is refused
rather than read or opened for ever."""

import contextlib
import os
import signal

import pytest

import optical
from optical.cli import main

pd = pytest.importorskip("pandas")

WL = optical.MatmulWorkload(tokens=16, k=64, n=32)
BASE = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16})


def _sweep(out):
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=out, base=BASE, executor="serial",
                  progress=False)
    return out


@contextlib.contextmanager
def _within(seconds):
    """TimeoutError instead of a test that blocks for ever (an open or read of a FIFO)."""
    def alarm(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo"])
def test_a_lock_that_is_not_a_file_of_its_own_is_refused_untouched(tmp_path, kind):
    out = _sweep(tmp_path / "s")
    victim = tmp_path / "victim.txt"
    (out / ".lock").unlink()
    if kind == "fifo":
        os.mkfifo(out / ".lock")
    else:
        if kind == "symlink":
            victim.write_text("precious\n")
        (out / ".lock").symlink_to(victim)
    with _within(5), pytest.raises(ValueError, match=r"\.lock"):
        _sweep(out)
    if kind == "symlink":
        assert victim.read_text() == "precious\n"  # not truncated
    else:
        assert not victim.exists()  # not created


def test_a_run_file_that_is_a_fifo_is_refused_on_resume(tmp_path):
    out = _sweep(tmp_path / "s")
    run = sorted((out / "runs").glob("*.json"))[0]
    run.unlink()
    os.mkfifo(run)
    with _within(5), pytest.raises(ValueError, match=run.name):
        _sweep(out)


def test_a_runs_symlink_out_of_the_directory_is_refused_untouched(tmp_path):
    out = _sweep(tmp_path / "s")
    elsewhere = tmp_path / "elsewhere"
    (out / "runs").rename(elsewhere)
    first = sorted(elsewhere.glob("*.json"))[0]
    first.unlink()  # a run still to do
    (elsewhere / ".notes.txt.tmp").write_text("someone's\n")
    (out / "runs").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="runs"):
        _sweep(out)
    assert (elsewhere / ".notes.txt.tmp").read_text() == "someone's\n"
    assert not first.exists()  # nothing written there


@pytest.mark.parametrize("link", ["file", "directory"])
def test_plot_writes_no_figure_through_a_symlink_in_the_sweep(tmp_path, link, capsys):
    out = _sweep(tmp_path / "s")
    victim, victim_dir = tmp_path / "victim.txt", tmp_path / "victim_dir"
    victim.write_text("precious\n")
    victim_dir.mkdir()
    if link == "file":
        (out / "plots").mkdir()
        (out / "plots" / "sqnr_db-vs-adc.bits.png").symlink_to(victim)
    else:
        (out / "plots").symlink_to(victim_dir)
    if link == "file":  # the link is replaced by the figure
        assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db"]) == 0
        figure = out / "plots" / "sqnr_db-vs-adc.bits.png"
        assert not figure.is_symlink() and figure.read_bytes().startswith(b"\x89PNG")
    else:  # plots/ itself a link: refused
        assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db"]) == 2
        assert "plots: a symlink" in capsys.readouterr().err
    assert victim.read_bytes() == b"precious\n"
    assert list(victim_dir.iterdir()) == []


def test_a_sparse_run_file_claiming_a_tebibyte_is_refused_unread(tmp_path):
    """A few bytes on disk and in a tarball; read whole it would take ~2 TB."""
    out = _sweep(tmp_path / "s")
    run = sorted((out / "runs").glob("*.json"))[0]
    os.truncate(run, 1 << 40)  # a few bytes on disk (and in a tarball)
    with pytest.raises(ValueError, match=run.name):
        optical.load_sweep(out)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "modules.json"])
def test_a_model_directorys_sparse_json_is_refused_unread(tmp_path, name):
    """The same for a model directory: its config.json, index or
    sentence-transformers files claiming a tebibyte are named, not read."""
    from optical import transformer
    from tests.test_transformer_bert import _bert_tensors
    from tests.transformer_helpers import TINY_BERT, write_model

    pytest.importorskip("safetensors")
    directory = write_model(tmp_path / "m", TINY_BERT, _bert_tensors(TINY_BERT), shards=2)
    (directory / "modules.json").write_text("[]")
    os.truncate(directory / name, 1 << 40)
    with pytest.raises(ValueError, match=rf"{name}: 1099511627776 bytes"):
        transformer.load(directory).sentence_pipeline()
