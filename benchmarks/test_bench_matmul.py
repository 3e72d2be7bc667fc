"""optical.matmul against the plain fp32 matmul, 512 x 4096 @ 4096 x 4096."""


import optical

CASE = "512x4096@4096x4096"


def test_baseline_numpy(benchmark, operands, record):
    x, w = operands
    benchmark.pedantic(lambda: x @ w, rounds=5, warmup_rounds=1)
    record(CASE, "baseline numpy x @ w", benchmark)


def test_optical_numpy_reference_iris_like(benchmark, operands, record):
    x, w = operands
    cfg = optical.presets.get("iris-like")
    benchmark.pedantic(lambda: optical.matmul(x, w, cfg, seed=0), rounds=2, warmup_rounds=0)
    record(CASE, "optical numpy reference, iris-like", benchmark)
