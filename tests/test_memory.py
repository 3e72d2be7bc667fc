"""optical._memory: large arrays recycled within the engines' scopes, never
shared while anything still refers to them, and nothing changes a result."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import optical
from optical import _memory, transformer
from tests.transformer_helpers import TINY_LLAMA, write_model

MB = 1 << 20


@pytest.fixture(autouse=True)
def empty_pool():
    _memory.release()
    yield
    _memory.release()


def _owner(a: np.ndarray) -> int:
    """Address of the buffer under ``a``."""
    return a.__array_interface__["data"][0]


def test_outside_a_scope_and_below_the_threshold_it_is_numpy_empty():
    a = _memory.empty((_memory.MIN_BYTES // 4,), np.float32)  # no scope
    with _memory.recycling():
        b = _memory.empty((1024,), np.float32)  # below MIN_BYTES
    assert a.flags.owndata and b.flags.owndata
    assert _memory.held_bytes() == 0


def test_once_the_scopes_close_arrays_are_numpys_again():
    """Nested scopes: pooled inside the outer one after the inner closes, and
    nothing pooled once both have closed (nothing handed to a user is)."""
    with _memory.recycling():
        with _memory.recycling():
            pass
        inside = _memory.empty(_memory.MIN_BYTES, np.uint8)
        assert not inside.flags.owndata
    del inside
    held = _memory.held_bytes()
    after = _memory.empty(_memory.MIN_BYTES, np.uint8)
    assert after.flags.owndata and _memory.held_bytes() == held


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    n = _memory.MIN_BYTES // 4
    with _memory.recycling():
        a = _memory.empty((n,), np.float32)
        address = _owner(a)
        part = a[: n // 2].reshape(2, -1)  # a view of the buffer outlives a
        del a
        b = _memory.empty((n,), np.float32)
        assert _owner(b) != address  # still held by `part`
        del part
        c = _memory.empty((n // 4, 2), np.float64)  # same bytes, other shape and dtype
        assert _owner(c) == address
        assert c.shape == (n // 4, 2) and c.dtype == np.float64 and c.flags.c_contiguous
        assert not np.shares_memory(b, c)
    assert _memory.held_bytes() == 2 * n * 4


@pytest.mark.parametrize("small_first", [False, True])
def test_the_smallest_free_buffer_that_fits_is_taken_and_smaller_ones_dropped(small_first):
    """Whatever order the pool holds them in (made big first, or small first)."""
    unit = _memory.MIN_BYTES
    with _memory.recycling():
        if small_first:
            small, big = _memory.empty(unit, np.uint8), _memory.empty(4 * unit, np.uint8)
        else:
            big, small = _memory.empty(4 * unit, np.uint8), _memory.empty(unit, np.uint8)
        small_at = _owner(small)
        del big, small
        a = _memory.empty(unit, np.uint8)
        assert _owner(a) == small_at
        del a
        # Nothing free fits: the free buffers go back before a new one is mapped.
        c = _memory.empty(8 * unit, np.uint8)
        assert c.nbytes == 8 * unit
        assert _memory.held_bytes() == 8 * unit


def test_fortran_order_is_kept():
    w = np.asfortranarray(np.zeros((4096, 2048), np.float32))
    with _memory.recycling():
        out = _memory.empty_like(w)
    assert out.shape == w.shape and out.strides == w.strides


def test_free_buffers_are_released_once_idle(monkeypatch):
    monkeypatch.setattr(_memory, "HOLD_SECONDS", 0.05)
    with _memory.recycling():
        kept = _memory.empty(_memory.MIN_BYTES, np.uint8)
        _memory.empty(2 * _memory.MIN_BYTES, np.uint8)  # free at once: its array is not kept
    deadline = time.monotonic() + 10
    while _memory.held_bytes() > _memory.MIN_BYTES and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _memory.held_bytes() == _memory.MIN_BYTES  # `kept` is still in use
    kept[:] = 7  # and still valid
    del kept
    assert _memory.release() == _memory.MIN_BYTES
    assert _memory.held_bytes() == 0


def test_the_hold_timer_does_not_keep_a_finished_process_alive():
    """A process whose last scope closed with free buffers ends at once
    (the CLI's ``optical validate`` among them), not after the hold time:
    here an hour, so a timer that kept the interpreter alive would time out."""
    code = ("import numpy as np\nfrom optical import _memory\n"
            "_memory.HOLD_SECONDS = 3600.0\n"
            "with _memory.recycling():\n    _memory.empty(_memory.MIN_BYTES, np.uint8)\n"
            "assert _memory.held_bytes() == _memory.MIN_BYTES\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_fork_taken_while_another_thread_holds_the_pool_lock_leaves_it_free():
    """A child forked while another thread (the hold timer, a worker) holds
    the pool's lock gets a free lock: otherwise its first pooled array
    would wait forever for a thread it does not have. Run in a fresh
    interpreter: this one may hold JAX, whose threads make any fork unsafe."""
    code = """
import os, threading
from optical import _memory
held, done = threading.Event(), threading.Event()
def hold():
    with _memory._lock:
        held.set()
        done.wait(30)
thread = threading.Thread(target=hold)
thread.start()
assert held.wait(30)
pid = os.fork()
if pid == 0:  # the child: exit 0 only if the lock can be taken
    os._exit(0 if _memory._lock.acquire(timeout=5) else 1)
_, status = os.waitpid(pid, 0)
done.set()
thread.join()
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    result = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_threads_never_share_a_buffer():
    n = _memory.MIN_BYTES
    seen, errors = [], []

    def work(value):
        try:
            with _memory.recycling():
                for _ in range(20):
                    a = _memory.empty(n, np.uint8)
                    a[:] = value
                    time.sleep(0.001)
                    if not (a == value).all():
                        errors.append(value)
                    seen.append(_owner(a))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(v,)) for v in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # At most two per thread: the next array is made while the last is alive.
    assert _memory.held_bytes() <= 6 * n


def test_a_layer_gives_the_same_bits_whether_or_not_its_arrays_are_recycled(
        tmp_path, monkeypatch):
    """Every array of a tiny layer pooled (threshold 1 byte) against none
    pooled: the fp16 reference and the optical run agree to the bit, so no
    pooled array was reused while still in use."""
    model = transformer.load(write_model(tmp_path, TINY_LLAMA))
    layer = model.layer(1)
    h = model.hidden_states(1, 12, seed=4)
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})

    def run():
        ref = layer.trace(h, dtype="float16")
        opt = layer.trace(h, config=cfg, seed=4)
        return [ref.output, opt.output, *ref.products.values(), *opt.products.values()]

    monkeypatch.setattr(_memory, "MIN_BYTES", 1 << 62)
    plain = run()
    monkeypatch.setattr(_memory, "MIN_BYTES", 1)
    pooled = run()
    assert _memory.held_bytes() > 0  # the pool was used
    again = run()  # on the buffers the last run left
    for a, b, c in zip(plain, pooled, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_reference_run_leaves_nothing_held_after_the_hold_time(tmp_path, monkeypatch):
    """The fp16 reference's rounded weight is pooled and used by the GEMM after
    it: the hold timer must start once the GEMM is done with it, so nothing of
    the run stays held past the hold time (the last weight did, until some
    later scope closed, when its scope closed before its GEMM)."""
    model = transformer.load(write_model(tmp_path, TINY_LLAMA))
    layer = model.layer(1)
    h = model.hidden_states(1, 12, seed=4)
    monkeypatch.setattr(_memory, "MIN_BYTES", 1)
    monkeypatch.setattr(_memory, "HOLD_SECONDS", 0.0)
    layer.reference(h, dtype="float16")
    deadline = time.monotonic() + 10
    while _memory.held_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _memory.held_bytes() == 0
