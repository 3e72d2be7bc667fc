import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from optical._gemm import row_block, rows_matmul


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
    from threadpoolctl import threadpool_info

    before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    rows_matmul(rng.standard_normal((40, 8)), rng.standard_normal((8, 3)), 16)
    after = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert after == before
