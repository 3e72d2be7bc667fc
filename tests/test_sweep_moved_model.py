"""A layer sweep whose model moved (another machine, another path) resumes
with the model's directory now: the same model there runs the runs left
with the numbers the old place gave and under the ids the sweep began with;
another model there, a sweep with no single model, or a manifest that cannot
tell the model is the same, are refused by name."""

import json
import shutil

import pytest

import optical
from optical._sweep_store import content_hash
from optical.cli import main
from optical.sweep import resume
from optical.workloads import LayerWorkload, MatmulWorkload
from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

pd = pytest.importorskip("pandas")

BASE = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
PARAMS = {"adc.bits": [6, 8]}


def _model(directory, weights):
    if not weights:
        return write_model(directory, TINY_LLAMA)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return write_model(directory, TINY_LLAMA,
                       random_llama_tensors(TINY_LLAMA, seed=3, dtype=ml_dtypes.bfloat16),
                       shards=2)


def _sweep(model, out):
    return optical.sweep(LayerWorkload(str(model), layer=1, tokens=4), PARAMS, seeds=[0, 1],
                         out=out, base=BASE, executor="serial", progress=False)


@pytest.mark.parametrize("weights", [False, True], ids=["synthetic", "checkpoint"])
def test_a_sweep_resumes_where_its_model_is_now_with_the_numbers_of_the_old_place(
        tmp_path, weights):
    """Moved with its model, the sweep runs its deleted run again at the new
    place: the same metrics as that run had at the old one (the same model
    and seed), the same run id, the manifest untouched, and the new run's
    file records where the model was beside the workload the id hashes. A
    manifest lost after the move is rebuilt around the runs there."""
    old = _model(tmp_path / "laptop" / "llama", weights)
    out = tmp_path / "s"
    before = _sweep(old, out)
    manifest = (out / "manifest.json").read_bytes()
    new = tmp_path / "cluster" / "Llama-tiny"
    shutil.move(old.parent, new.parent)
    (new.parent / "llama").rename(new)
    run_id = before["run_id"].iloc[2]
    (out / "runs" / f"{run_id}.json").unlink()

    with pytest.raises(ValueError, match=r"cannot be made now: .*if its model has moved from "
                                         r".*laptop/llama, resume with its directory now "
                                         r"\(optical sweep --out DIR --moved-model"):
        resume(out, executor="serial", progress=False)
    summary = resume(out, executor="serial", progress=False, model_dir=new)
    assert (summary.runs, summary.already_done, summary.ran) == (4, 3, 1)
    after = optical.load_sweep(out)
    pd.testing.assert_frame_equal(after.drop(columns=["elapsed_s", "finished_at"]),
                                  before.drop(columns=["elapsed_s", "finished_at"]))
    assert (out / "manifest.json").read_bytes() == manifest
    record = json.loads((out / "runs" / f"{run_id}.json").read_text())
    assert record["workload"]["model_dir"] == str(old.resolve())
    assert record["moved_model_dir"] == str(new.resolve())
    # The same definition given with the moved model is the same sweep too.
    again = _sweep(new, out)
    assert again["run_id"].tolist() == before["run_id"].tolist()
    # The manifest lost: rebuilt from the definition given with the moved
    # model, it names the model as the runs' ids do, and runs none again.
    (out / "manifest.json").unlink()
    rebuilt = _sweep(new, out)
    assert rebuilt["run_id"].tolist() == before["run_id"].tolist()
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == sorted(before["run_id"])
    stored = json.loads((out / "manifest.json").read_text())["definition"]["workload"]
    assert stored["model_dir"] == str(old.resolve())


def test_another_model_where_the_sweep_looks_for_its_own_is_refused(tmp_path):
    """A directory whose config.json differs (synthetic weights: the model
    digest alone tells) is not the sweep's model moved: refused, naming both
    digests, with or without model_dir, and nothing run."""
    old = write_model(tmp_path / "a" / "m", TINY_LLAMA)
    out = tmp_path / "s"
    _sweep(old, out)
    other = write_model(tmp_path / "b" / "m", {**TINY_LLAMA, "rope_theta": 1e4})
    runs = sorted(p.name for p in (out / "runs").iterdir())
    message = (r"holds a different sweep.*Changed: workload model_dir: .* \(the model in "
               r".*b/m is not the one the sweep began with: its config.json or weights differ, "
               r"model digest \w+ where the sweep's was \w+\)")
    with pytest.raises(ValueError, match=message):
        resume(out, executor="serial", progress=False, model_dir=other)
    with pytest.raises(ValueError, match=message):
        _sweep(other, out)
    assert sorted(p.name for p in (out / "runs").iterdir()) == runs


def test_a_hugging_face_cache_and_a_plain_copy_are_told_apart_by_their_fingerprint(tmp_path):
    """The same checkpoint in a Hugging Face cache (files linked to blobs)
    has the plain copy's digest but another fingerprint (it hashes the
    names the files resolve to): refused, saying that the layout differs."""
    plain = _model(tmp_path / "plain" / "m", True)
    out = tmp_path / "s"
    _sweep(plain, out)
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(plain.iterdir())):
        shutil.copyfile(file, blobs / f"{i:040x}")
        (snapshot / file.name).symlink_to(blobs / f"{i:040x}")
    with pytest.raises(ValueError, match=r"Changed: workload checkpoint: .*; workload model_dir: "
                                         r".* \(the model in .*abc123 has the sweep's model "
                                         r"digest, but not its checkpoint's fingerprint.*"
                                         r"Hugging Face cache's blob names"):
        resume(out, executor="serial", progress=False, model_dir=snapshot)


def test_a_manifest_without_a_model_digest_cannot_recognise_its_model_elsewhere(tmp_path):
    """A manifest of a version that recorded no model digest (synthetic
    weights: no checkpoint fingerprint either) gives nothing to compare a
    moved model with: refused, saying so; at its own place it resumes."""
    old = write_model(tmp_path / "a" / "m", TINY_LLAMA)
    out = tmp_path / "s"
    _sweep(old, out)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["definition"]["workload"]["model_digest"]
    manifest["definition_hash"] = content_hash(manifest["definition"])
    path.write_text(json.dumps(manifest))
    assert resume(out, executor="serial", progress=False).ran == 0
    copy = shutil.copytree(old, tmp_path / "b" / "m")
    with pytest.raises(ValueError, match=r"Changed: workload model_dir: .*\(the manifest "
                                         r"records no digest of its model"):
        resume(out, executor="serial", progress=False, model_dir=copy)


def test_sweeps_without_one_model_to_move_refuse_model_dir(tmp_path):
    """model_dir is refused by name for a matmul sweep, for a sweep of
    workload.model_dir (each point names its directory) and beside a
    workload object; a directory that holds no model is named as
    model_dir's."""
    model = write_model(tmp_path / "m", TINY_LLAMA)
    matmul = tmp_path / "mm"
    optical.sweep(MatmulWorkload(tokens=8, k=48, n=40), PARAMS, seeds=1, out=matmul, base=BASE,
                  executor="serial", progress=False)
    with pytest.raises(ValueError, match=r"model_dir: .*manifest.json: the sweep's workload is "
                                         r"of kind 'matmul', which has no model directory"):
        resume(matmul, model_dir=model)
    swept = tmp_path / "sw"
    optical.sweep(LayerWorkload(str(model), layer=0, tokens=4),
                  {"workload.model_dir": [str(model)]}, seeds=1, out=swept, base=BASE,
                  executor="serial", progress=False)
    with pytest.raises(ValueError, match=r"model_dir: .*the sweep sweeps workload.model_dir"):
        resume(swept, model_dir=model)
    shutil.copytree(model, tmp_path / "kept")
    shutil.rmtree(model)
    with pytest.raises(ValueError, match=r"cannot be made now") as refused:
        resume(swept)  # each point names its directory: no hint to move them to one
    assert "--moved-model" not in str(refused.value)
    shutil.copytree(tmp_path / "kept", model)
    with pytest.raises(ValueError, match=r"model_dir: give the moved workload itself"):
        resume(swept, model_dir=model, workload=LayerWorkload(str(model), layer=0, tokens=4))
    plain = tmp_path / "plain"
    _sweep(model, plain)
    with pytest.raises(ValueError, match=r"^model_dir: .*nowhere"):
        resume(plain, model_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"^model_dir: an empty path"):
        resume(plain, model_dir=" ")


def test_the_cli_resumes_a_moved_model_and_says_how_to_resume_it(tmp_path, capsys):
    """--moved-model DIR with --out alone resumes there; beside a workload it
    is refused; the resume command the CLI advises names the moved model
    where the manifest names another directory, and only there."""
    from optical.commands.sweep import _resume_command

    old = write_model(tmp_path / "a" / "m", TINY_LLAMA)
    out = tmp_path / "s"
    args = ["sweep", "--model", str(old), "--layer", "1", "--tokens", "4", "--param",
            "adc.bits=6,8", "--set", "core.inputs=48", "--set", "core.outputs=40", "--jobs",
            "1", "--quiet", "--out", str(out)]
    assert main(args) == 0
    new = tmp_path / "b" / "m"
    shutil.move(old, new)
    capsys.readouterr()
    assert main(["sweep", "--out", str(out), "--jobs", "1"]) == 2
    assert "--moved-model MODEL_DIR" in capsys.readouterr().err
    assert main(["sweep", "--out", str(out), "--moved-model", str(new), "--jobs", "1"]) == 0
    assert "2 runs, all done already" in capsys.readouterr().out
    assert main(["sweep", "--model", str(new), "--out", str(out), "--moved-model",
                 str(new)]) == 2
    assert "--moved-model resumes the sweep in --out" in capsys.readouterr().err
    assert main(["sweep", "--out", str(out), "--moved-model", str(tmp_path / "nowhere")]) == 2
    assert "optical sweep: error: --moved-model: " in capsys.readouterr().err
    assert _resume_command(str(out), str(new)) == (f"`optical sweep --out {out} "
                                                   f"--moved-model {new}`")
    assert _resume_command(str(out), str(old)) == f"`optical sweep --out {out}`"


def test_a_lost_manifest_of_a_sweep_that_did_not_move_is_rebuilt_as_before(tmp_path):
    """Rebuilding a lost manifest looks for a moved model's runs only where
    the given directory's own are absent: runs of the same model at another
    directory copied in stay foreign (the sweep keeps its directory and
    runs none again), and foreign files there are read as a load reads them:
    a FIFO is never opened (it would block), JSON nested past the parser is
    skipped."""
    import os
    import threading

    here = write_model(tmp_path / "a" / "m", TINY_LLAMA)
    there = shutil.copytree(here, tmp_path / "d" / "m")
    other, out = tmp_path / "s1", tmp_path / "s2"
    optical.sweep(LayerWorkload(str(there), layer=1, tokens=4), {"adc.bits": [6]}, seeds=[0, 1],
                  out=other, base=BASE, executor="serial", progress=False)
    before = _sweep(here, out)
    for file in (other / "runs").glob("*.json"):
        shutil.copy(file, out / "runs")
    (out / "runs" / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    fifo = out / "runs" / "fifo.json"
    os.mkfifo(fifo)
    opened = []

    def unblock():  # a reader blocked on the FIFO: let it go, and say so
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            opened.append(True)
        except OSError:  # no reader: nothing blocked
            pass

    watchdog = threading.Timer(60, unblock)
    watchdog.start()
    try:
        (out / "manifest.json").unlink()
        rebuilt = _sweep(here, out)
    finally:
        watchdog.cancel()
        unblock()
    assert not opened
    assert rebuilt["run_id"].tolist() == before["run_id"].tolist()
    stored = json.loads((out / "manifest.json").read_text())["definition"]["workload"]
    assert stored["model_dir"] == str(here.resolve())
