import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from optical._gemm import COL_BLOCK, cols_matmul, row_block, rows_matmul, stack_matmul


def test_row_block_depends_on_the_token_count_only():
    assert row_block(1) == 16 and row_block(17) == 32 and row_block(10_000) == 256


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_do_not_depend_on_the_other_rows_or_blas_threads(rng, dtype):
    a = rng.standard_normal((600, 300)).astype(dtype)
    b = rng.standard_normal((300, 130)).astype(dtype)
    whole = rows_matmul(a, b, 256)
    np.testing.assert_allclose(whole, a.astype(np.float64) @ b, rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-3 if dtype == np.float32 else 1e-10)
    # Any split at block boundaries, and any BLAS thread count, gives the same bits.
    parts = np.concatenate([rows_matmul(a[:256], b, 256), rows_matmul(a[256:512], b, 256),
                            rows_matmul(a[512:], b, 256)])
    np.testing.assert_array_equal(parts, whole)
    with threadpool_limits(limits=2, user_api="blas"):
        np.testing.assert_array_equal(rows_matmul(a, b, 256), whole)
    # Nor on how many rows follow in the last block: it is zero-padded to the
    # block, as OpenBLAS's bits change with the number of rows.
    np.testing.assert_array_equal(rows_matmul(a[:530], b, 256), whole[:530])
    # A padded block is a GEMM of the rows' dtype, as a full one is (a float64
    # pad made float32 rows' last block another GEMM, with other bits).
    np.testing.assert_array_equal(rows_matmul(a[:300], b, 256), whole[:300])
    assert whole.dtype == dtype


def test_concurrent_callers_keep_their_bits(rng):
    """Threads calling at once (a Dask worker's threads, say) must not undo
    one another's single-threaded BLAS setting."""
    from concurrent.futures import ThreadPoolExecutor

    a = rng.standard_normal((700, 256)).astype(np.float32)
    b = rng.standard_normal((256, 200)).astype(np.float32)
    expected = rows_matmul(a, b, 256)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: rows_matmul(a, b, 256), range(16)))
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_blas_thread_count_is_restored_after_a_call(rng):
    """Set here, not left by an earlier call: two threads before, two after."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert before and all(t == 2 for t in before)
        rows_matmul(rng.standard_normal((40, 8)), rng.standard_normal((8, 3)), 16)
        assert blas_threads() == before


def test_gemm_tasks_run_on_one_blas_thread_when_called_from_another_thread():
    """The thread that set a BLAS limit (threadpoolctl's controlling thread
    for OpenBLAS) is not the one that runs the GEMMs: a sweep's worker
    thread. Its GEMM tasks still run on one BLAS thread each (the
    controller's plain setter refuses other threads, silently)."""
    import threading

    from threadpoolctl import threadpool_info

    from optical import _gemm

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen: list = []
    with threadpool_limits(limits=2, user_api="blas"):
        worker = threading.Thread(target=lambda: _gemm._concurrently(
            [lambda: seen.append(blas_threads()), lambda: seen.append(blas_threads())]))
        worker.start()
        worker.join()
    assert len(seen) == 2 and all(counts and set(counts) == {1} for counts in seen), seen


def test_column_blocks_are_single_threaded_gemms_whatever_the_threads(rng):
    """``cols_matmul``: each block of COL_BLOCK columns is one single-threaded
    GEMM of all rows, so the bits are those, with 1 or 2 BLAS threads."""
    a = rng.standard_normal((300, 200)).astype(np.float32)
    w = rng.standard_normal((2 * COL_BLOCK + 70, 200)).astype(np.float32)  # HF's [out, in]
    with threadpool_limits(limits=1, user_api="blas"):
        single = np.concatenate([a @ w[c:c + COL_BLOCK].T for c in range(0, len(w), COL_BLOCK)],
                                axis=1)
        np.testing.assert_array_equal(cols_matmul(a, w.T), single)
    with threadpool_limits(limits=2, user_api="blas"):
        np.testing.assert_array_equal(cols_matmul(a, w.T), single)
    np.testing.assert_allclose(single, a.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-3)


def test_stacked_products_are_single_threaded_gemms_whatever_the_threads(rng):
    q = rng.standard_normal((2, 3, 64, 16)).astype(np.float32)
    k = rng.standard_normal((2, 1, 40, 16)).astype(np.float32)  # broadcast over the 3 heads
    kt = k.swapaxes(-1, -2)
    with threadpool_limits(limits=1, user_api="blas"):
        single = np.stack([np.stack([q[b, h] @ kt[b, 0] for h in range(3)]) for b in range(2)])
    with threadpool_limits(limits=2, user_api="blas"):
        out = stack_matmul(q, kt)
    assert out.shape == (2, 3, 64, 40) and out.dtype == np.float32
    np.testing.assert_array_equal(out, single)
    np.testing.assert_allclose(out, q.astype(np.float64) @ kt, rtol=1e-4, atol=1e-4)


class _FakeBlas:
    """A threadpoolctl BLAS controller: OpenMP builds keep a thread count per
    thread, pthreads builds one for the process; every count starts at 2."""

    user_api = "blas"

    def __init__(self, layer):
        import threading

        self.threading_layer = layer
        self.local, self.shared = threading.local(), {"n": 2}

    def _where(self):
        return self.local.__dict__ if self.threading_layer == "openmp" else self.shared

    def get_num_threads(self):
        return self._where().get("n", 2)

    def set_num_threads(self, n):
        self._where()["n"] = n


@pytest.mark.parametrize("layer", ["openmp", "pthreads"])
def test_overlapping_calls_run_on_one_blas_thread_and_leave_every_count_as_found(
        monkeypatch, layer):
    """Two threads' calls overlap (A in first, out first): their GEMM tasks see
    one BLAS thread. An OpenMP build's count is per thread: the callers'
    threads are never changed, so A's is 2 once its call is over (it had been
    left at 1). A pthreads build's count is the process's: held at 1 while any
    call runs (B's still does when A's ends), back at 2 after the last."""
    import threading

    from optical import _gemm

    fake = _FakeBlas(layer)
    monkeypatch.setattr(_gemm._ONE_BLAS_THREAD, "_libs", [fake])
    monkeypatch.setattr(_gemm, "_blas_controllers", lambda: [fake])
    seen, after = [], {}
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def task():
        seen.append(fake.get_num_threads())

    def user(name, wait_before, wait_inside, done):
        wait_before.wait(30)
        with _gemm._ONE_BLAS_THREAD:
            _gemm._concurrently([task, task])
            done[0].set()
            wait_inside.wait(30)
        after[name] = fake.get_num_threads()
        done[1].set()

    go = threading.Event()
    go.set()
    b_out = threading.Event()
    a = threading.Thread(target=user, args=("A", go, b_in, (a_in, a_out)))
    b = threading.Thread(target=user, args=("B", a_in, a_out, (b_in, b_out)))
    a.start()
    b.start()
    a.join(timeout=30)
    b.join(timeout=30)
    assert seen == [1, 1, 1, 1]
    assert after == {"A": 2 if layer == "openmp" else 1, "B": 2}
    assert fake.get_num_threads() == 2  # this thread's, or the process's


@pytest.mark.parametrize("n", [1, COL_BLOCK - 1, COL_BLOCK, COL_BLOCK + 1, 2 * COL_BLOCK + 1])
def test_every_column_block_is_computed_at_the_block_edges(rng, n):
    """cols_matmul at widths around the block size: every column, the last
    lone one included, is the product's (the output starts uninitialised, so
    a skipped block would be garbage)."""
    a = rng.standard_normal((5, 7))
    b = rng.standard_normal((7, n))
    np.testing.assert_allclose(cols_matmul(a, b), a @ b, rtol=1e-12, atol=1e-12)


def test_a_forked_child_gets_a_pool_of_its_own():
    """A child forked after a call inherited the pool but none of its
    threads, and its first call waited forever. Run in a fresh interpreter,
    as test_memory's fork test: this one may hold JAX, whose threads make
    any fork unsafe."""
    import subprocess
    import sys

    code = """
import os, numpy as np
from optical import _gemm
a = np.arange(600 * 8, dtype=np.float64).reshape(600, 8) % 7
b = np.ones((8, 4))
_gemm.rows_matmul(a, b, 256)  # the parent starts the pool
pid = os.fork()
if pid == 0:  # the child: exit 0 only if the product comes back, and right
    import faulthandler
    faulthandler.dump_traceback_later(20, exit=True)
    os._exit(0 if np.array_equal(_gemm.rows_matmul(a, b, 256), a @ b) else 1)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    result = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_blas_library_loaded_after_the_first_call_is_held_at_one_thread_too(monkeypatch):
    """The libraries are listed again once modules were imported since the
    last list: scipy's linear algebra loads an OpenBLAS of its own after
    numpy's, which an earlier list of the first call's had left at its
    count (the test above failed after the sweep tests had imported it)."""
    import sys
    import types

    from optical import _gemm

    late = _FakeBlas("pthreads")
    monkeypatch.setattr(_gemm._ONE_BLAS_THREAD, "_libs", [])
    monkeypatch.setattr(_gemm._ONE_BLAS_THREAD, "_listed_at", len(sys.modules))
    monkeypatch.setattr(_gemm, "_blas_controllers", lambda: [late])
    seen = []
    _gemm._concurrently([lambda: seen.append(late.get_num_threads())])
    assert seen == [2]  # nothing imported since the list: the list stands
    monkeypatch.setitem(sys.modules, "_optical_test_late_blas", types.ModuleType("late"))
    _gemm._concurrently([lambda: seen.append(late.get_num_threads())] * 2)
    assert seen == [2, 1, 1] and late.get_num_threads() == 2  # held inside, restored after
