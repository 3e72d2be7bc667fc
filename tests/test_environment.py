"""The process environment a researcher's machine or cluster job may have:
locales, file-name encodings, default ACLs, closed or failing stderr (an
environment audit)."""

import errno
import os
import struct
import subprocess
import sys

import pytest

import optical
from optical._progress import progress_bar

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

WL = optical.MatmulWorkload(tokens=8, k=32, n=16)


def test_results_parquet_is_written_under_a_name_that_is_not_utf8(tmp_path):
    """pyarrow encodes a path as strict UTF-8: a sweep directory whose name
    holds a Latin-1 byte (or any non-ASCII name under an ASCII locale) lost
    its results table after every run had finished."""
    out = tmp_path / os.fsdecode(b"sw\xe9ep")
    frame = optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=out, executor="serial",
                          progress=False)
    assert len(frame) == 2
    with open(out / "results.parquet", "rb") as handle:  # (pyarrow's path: UTF-8 only)
        pd.testing.assert_frame_equal(pd.read_parquet(handle), frame, check_like=True,
                                      check_dtype=False)


def _acl(entries):
    """A POSIX ACL as the kernel's xattr holds it (version 2, then tag,
    permissions, id per entry)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def test_new_files_take_the_directorys_default_acl(tmp_path):
    """A shared sweep directory whose default ACL gives a group rwx: files
    were created private, then chmod-ed to the umask's bits, which set the
    ACL mask to --- under umask 077 (the group could read nothing); open()
    keeps rw-. Written files now get what open() gives."""
    shared = tmp_path / "shared"
    shared.mkdir()
    undefined = 0xFFFFFFFF
    try:
        os.setxattr(shared, "system.posix_acl_default",
                    _acl([(0x01, 7, undefined), (0x04, 7, undefined), (0x08, 7, 4242),
                          (0x10, 7, undefined), (0x20, 0, undefined)]))
    except OSError as err:
        pytest.skip(f"no POSIX ACLs here ({err.strerror})")

    def mask(path):
        raw = os.getxattr(path, "system.posix_acl_access")
        entries = [struct.unpack("<HHI", raw[4 + 8 * i:12 + 8 * i])
                   for i in range((len(raw) - 4) // 8)]
        return next(perm for tag, perm, _ in entries if tag == 0x10)

    previous = os.umask(0o077)
    try:
        (shared / "by-open").write_text("x")
        optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=shared / "s", executor="serial",
                      progress=False)
    finally:
        os.umask(previous)
    assert mask(shared / "by-open") == 6
    written = [shared / "s" / "manifest.json", shared / "s" / "results.parquet",
               *(shared / "s" / "runs").glob("*.json")]
    assert [mask(p) for p in written] == [6] * len(written)


class _Failing:
    """A stderr whose writes fail, as a closed pipe's or a full disk's do."""

    def __init__(self, err):
        self.err = err

    def write(self, text):
        raise self.err

    def flush(self):
        raise self.err

    def isatty(self):
        return False


@pytest.mark.parametrize("err", [BrokenPipeError(errno.EPIPE, "Broken pipe"),
                                 OSError(errno.ENOSPC, "No space left on device"),
                                 ValueError("I/O operation on closed file")])
def test_a_progress_bar_whose_stderr_fails_does_not_stop_the_work(monkeypatch, err):
    """A sweep under `2>/dev/full`, or whose stderr reader had gone, stopped
    at its first progress write (0 runs, or 1 of 3)."""
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys, "stderr", _Failing(err))
    bar = progress_bar(3, desc="runs")
    for _ in range(3):
        bar.update()
    bar.close()


def test_a_closed_stderr_runs_a_sweep(tmp_path):
    """`optical sweep ... 2>&-`: sys.stderr is None, and tqdm's write of it
    failed (exit 1, no run)."""
    code = ("import sys\nfrom optical.cli import main\n"
            f"sys.exit(main(['sweep', '--matmul', '8x32x16', '--param', 'adc.bits=4,8', "
            f"'--seeds', '1', '--jobs', '1', '--out', {str(tmp_path / 's')!r}]))\n")
    # (the shell closes it: a preexec_fn would fork this JAX-threaded process)
    run = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, code],
                         stdout=subprocess.PIPE, text=True, timeout=300)
    assert run.returncode == 0, run.stdout
    assert len(list((tmp_path / "s" / "runs").glob("*.json"))) == 2


def _python(code, *args):
    """The stdout of ``python -c code args`` in a fresh process, which must succeed."""
    run = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_the_package_imports_and_reads_models_without_posix_only_names(tmp_path):
    """On Windows os has no register_at_fork and no O_NONBLOCK: `import
    optical` failed at once, then every model or sweep file read."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    model = write_model(tmp_path / "m", TINY_LLAMA)
    code = ("import os, sys\n"
            "import concurrent.futures.process, random, subprocess, tempfile  # (stdlib's own\n"
            "del os.register_at_fork, os.O_NONBLOCK  # uses guard it) as on Windows\n"
            "import numpy as np, optical\n"
            "from optical import transformer\n"
            "spec = transformer.load(sys.argv[1]).spec\n"
            "y = optical.matmul(np.ones((2, 8)), np.ones((8, 3)), optical.presets.get('ideal'), "
            "seed=0)\n"
            "print(spec.hidden_size, round(float(y[0, 0]), 6))\n")
    assert _python(code, model).split() == [str(TINY_LLAMA["hidden_size"]), "8.0"]


def test_a_notebook_workload_on_worker_processes_is_named(tmp_path):
    """A workload class defined in a notebook (or python -c) cannot be
    imported by spawned workers: the pool's error blamed a missing main
    guard, which a notebook cannot add; the real one went to the worker's
    stderr. Named before any run; executor=1 runs it."""
    code = ("import dataclasses, sys, optical\n"
            "@dataclasses.dataclass(frozen=True)\n"
            "class Toy:\n"
            "    def run(self, config, seed):\n"
            "        return {'m': float(seed)}\n"
            "    def to_dict(self):\n"
            "        return {'kind': 'toy'}\n"
            "try:\n"
            "    optical.sweep(Toy(), {'adc.bits': [4, 8]}, seeds=2, out=sys.argv[1] + '/a',\n"
            "                  executor=2, progress=False)\n"
            "except ValueError as err:\n"
            "    print(err)\n"
            "print(len(optical.sweep(Toy(), {'adc.bits': [4, 8]}, seeds=2, "
            "out=sys.argv[1] + '/b', executor=1, progress=False)))\n")
    first, second = _python(code, tmp_path).strip().splitlines()
    assert first == ("workload: its class Toy is defined in an interactive session (a notebook, "
                     "python -c), which worker processes cannot import; define it in a .py "
                     "module, or pass executor=1 to run in this process")
    assert second == "4"
    assert not list((tmp_path / "a" / "runs").glob("*.json"))


def test_pickled_programmed_weights_arrive_without_copies():
    """Out-of-band pickle 5 (Dask's transfers) gives arrays over read-only
    memoryviews of bytes: immutable, so not copied again on construction
    (review: 202 MB of copies for a 4096 x 4096 matrix)."""
    import pickle

    import numpy as np

    pw = optical.program(np.ones((64, 32), np.float32), optical.presets.get("ideal"))
    buffers = []
    data = pickle.dumps(pw, protocol=5, buffer_callback=buffers.append)
    frames = [memoryview(bytes(b.raw())) for b in buffers]
    back = pickle.loads(data, buffers=frames)
    for name in ("transmissions", "weights", "adc_lo"):
        array = getattr(back, name)
        assert any(np.shares_memory(array, np.frombuffer(f, np.uint8)) for f in frames), name


def test_the_suite_runs_as_a_background_job_and_from_elsewhere(tmp_path):
    """`make test &` in a shell script starts pytest with SIGINT ignored: the
    tests of Ctrl-C raised nothing (3 failed in test_sweep.py); conftest gives
    back Python's handler. Started from another directory, the tests run from
    the checkout's root, while pytest's own relative paths (--basetemp) stay
    where pytest was started (a chdir at import sent them into the checkout,
    where pytest deleted a runs/ directory of the same name)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = os.path.join(root, "tests", "test_sweep.py")
    command = (f"{sys.executable} -m pytest -q -p no:cacheprovider -p no:randomly "
               f"--basetemp=bt {tests} -k 'swallowed_ctrl_c or makes_a_run_fail' & wait")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]  # the CLI's two, the API's one
    assert (tmp_path / "bt").is_dir() and not os.path.exists(os.path.join(root, "bt"))


def test_the_commit_optical_runs_from_is_read_from_its_checkout(tmp_path):
    """A provenance audit: every run recorded optical_version 0.1.0, whatever
    the commit. The environment names the commit of the checkout optical is
    imported from, read from its .git as `git rev-parse HEAD` gives it: a
    branch in loose refs, the same after `git pack-refs`, a detached HEAD, a
    worktree (a .git file); None outside a checkout or for a damaged HEAD."""
    import shutil

    from optical._version import commit_of, source_commit

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args, cwd=tmp_path / "repo"):
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
               "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}  # no signing
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                              text=True, env=env).stdout.strip()

    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main")
    (repo / "a").write_text("1")
    git("add", "a")
    git("commit", "-q", "-m", "one")
    first = git("rev-parse", "HEAD")
    assert commit_of(repo) == first
    (repo / "a").write_text("2")
    git("commit", "-q", "-am", "two")
    second = git("rev-parse", "HEAD")
    git("pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert commit_of(repo) == second != first
    git("worktree", "add", "-q", str(tmp_path / "tree"), first)  # detached there
    assert commit_of(tmp_path / "tree") == first
    git("checkout", "-q", "--detach", first)
    assert commit_of(repo) == first
    assert commit_of(tmp_path) is None  # not a checkout
    git("checkout", "-q", "main")
    packed = repo / ".git" / "packed-refs"  # comments and peeled lines before the branch
    packed.write_text(f"# pack-refs with: peeled fully-peeled sorted\n^{first}\n"
                      + packed.read_text())
    assert commit_of(repo) == second
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/gone\n")
    assert commit_of(repo) is None
    (repo / ".git" / "HEAD").unlink()
    os.mkfifo(repo / ".git" / "HEAD")  # not read (it would block): None
    assert commit_of(repo) is None
    # optical's own checkout only: copied into another project's tree, None
    from optical._version import checkout_commit

    (repo / ".git" / "HEAD").unlink()  # the FIFO, which git would block on too
    (repo / ".git" / "HEAD").write_text(f"{first}\n")
    assert checkout_commit(repo) is None  # no pyproject.toml
    (repo / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert checkout_commit(repo) is None
    (repo / "pyproject.toml").write_text('[project]\nname = "optical"\nversion = "0.1.0"\n')
    assert checkout_commit(repo) == first
    env = optical.kernels.environment()
    assert env["optical_commit"] == source_commit()
    here = os.path.dirname(os.path.dirname(os.path.abspath(optical.__file__)))
    if os.path.exists(os.path.join(here, ".git")):
        assert env["optical_commit"] == git("rev-parse", "HEAD", cwd=here)


def test_a_jax_run_records_the_device_it_computes_on(monkeypatch):
    """A JAX run's last bits follow its device's GEMMs (a GPU's round as its
    own): run records and validate's JSON name the device an unplaced JAX
    run computes on, ``jax.default_device``'s where one is set, and None
    where JAX starts no backend (a JAX_PLATFORMS naming no platform)."""
    import dataclasses
    import json

    jax = pytest.importorskip("jax")
    from optical.kernels import _jax_device

    first = jax.devices()[0]
    env = optical.kernels.environment()
    assert env["jax_device"] == _jax_device()
    assert env["jax_device"].split(":")[0] == first.platform == jax.default_backend()
    if first.platform == "cpu":
        assert env["jax_device"] == "cpu"  # XLA's CPU device is of kind "cpu"

    @dataclasses.dataclass
    class Device:
        platform: str
        device_kind: str

    h100 = Device("gpu", "NVIDIA H100 80GB HBM3")
    with jax.default_device(jax.devices("cpu")[0]):
        monkeypatch.setattr(jax, "devices", lambda backend=None: [h100])
        assert _jax_device() == "cpu"  # the default device set, not the backend's first
    assert _jax_device() == "gpu: NVIDIA H100 80GB HBM3"
    with jax.default_device("gpu"):  # a platform's name: its first device
        assert _jax_device() == "gpu: NVIDIA H100 80GB HBM3"
    monkeypatch.undo()
    done = subprocess.run(
        [sys.executable, "-c", "import json, optical; e = optical.kernels.environment(); "
         "print(json.dumps([e['jax_cpu'], e['jax_device']]))"],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "none-such"},
        timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads(done.stdout.splitlines()[-1]) == [False, None]
