"""The jitted JAX ``x @ w`` that the benchmarks take ratios against.

numpy's ``x @ w`` is written inline where it is timed; this one needs its
operands on the device and a block on the result, so it is written once.
"""

from collections.abc import Callable


def jax_matmul(x, w) -> Callable[[], object]:
    """A call of a jitted JAX ``x @ w`` at full fp32 precision ("highest": no
    TF32 or bf16 passes on a GPU), on device copies of ``x`` and ``w`` made
    here, that returns once the product is ready. Its first call compiles:
    time it after a warm-up."""
    import jax

    mm = jax.jit(lambda a, b: jax.numpy.matmul(a, b, precision="highest"))
    xj, wj = jax.numpy.asarray(x), jax.numpy.asarray(w)
    return lambda: mm(xj, wj).block_until_ready()
