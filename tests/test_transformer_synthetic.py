"""Synthetic Llama weights and hidden states: seeded, realistic statistics, massive activations."""

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from optical.transformer import SyntheticLlama, load
from optical.transformer.model import LlamaModel
from optical.transformer.numerics import round_to
from optical.transformer.spec import ModelSpec
from optical.transformer.synthetic import (
    bert_layer_weights,
    llama_hidden_states,
    llama_layer_weights,
)
from tests.transformer_helpers import TINY_LLAMA

# Wide enough for the statistics to be measurable, small enough to be quick.
MEDIUM = ModelSpec.from_config({**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 1376,
                                "num_attention_heads": 8, "num_key_value_heads": 2,
                                "head_dim": 64, "num_hidden_layers": 4})


@pytest.fixture(scope="module")
def medium_weights():
    return {i: llama_layer_weights(MEDIUM, i, seed=0) for i in (0, 1)}


def test_weights_are_seeded_per_seed_layer_and_name(medium_weights):
    again = llama_layer_weights(MEDIUM, 1, seed=0)
    for name, w in medium_weights[1].items():
        np.testing.assert_array_equal(again[name], w)
    other_seed = llama_layer_weights(MEDIUM, 1, seed=1)
    assert not np.array_equal(other_seed["q_proj"], medium_weights[1]["q_proj"])
    # different layers and different tensors of one layer are not copies, nor
    # correlated draws, and each layer picks its own outlier channels
    assert not np.array_equal(medium_weights[0]["q_proj"], medium_weights[1]["q_proj"])
    assert not np.array_equal(medium_weights[0]["gate_proj"], medium_weights[0]["up_proj"])
    for a, b in ((medium_weights[0]["q_proj"], medium_weights[1]["q_proj"]),
                 (medium_weights[0]["gate_proj"], medium_weights[0]["up_proj"])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02

    def outlier_columns(w):
        return set(np.flatnonzero(w.std(axis=0) > 3 * np.median(w.std(axis=0))))

    assert outlier_columns(medium_weights[0]["q_proj"]) != \
        outlier_columns(medium_weights[1]["q_proj"])


def test_weight_statistics_are_llama_like(medium_weights):
    for name, w in medium_weights[0].items():
        if w.ndim == 1:
            assert 0.6 < w.mean() < 1.4  # norm weights
            continue
        np.testing.assert_array_equal(round_to(w, "bfloat16"), w)  # stored as bf16
        expected_std = 0.02 * np.sqrt(4096 / w.shape[1])
        column_std = np.median(w.std(axis=0))
        assert 0.94 * expected_std < column_std < 1.06 * expected_std, name
        # (Tukey-h tails: test_weight_tails_have_tukey_h_kurtosis; a whole
        # matrix's kurtosis is its outlier channels' more than its tails'.)
        # exactly weight_outlier_channels input channels with ~4x the typical weights
        ratio = w.std(axis=0) / np.median(w.std(axis=0))
        assert np.count_nonzero(ratio > 3) == SyntheticLlama().weight_outlier_channels, name


def test_weight_tails_have_tukey_h_kurtosis(medium_weights):
    """Away from the outlier channels, every matrix is Tukey-h with h = 0.1:
    kurtosis 3 (1 - 2h)^3 / (1 - 4h)^(5/2) = 5.508 (the module doc's 5.5),
    measured on the seven matrices of layer 0 pooled (2.7M samples; each
    matrix alone is 5.2-6.6). Lighter tails (h = 0.05) give 3.8."""
    h = SyntheticLlama().tail_h
    expected = 3 * (1 - 2 * h) ** 3 / (1 - 4 * h) ** 2.5
    assert expected == pytest.approx(5.508, abs=1e-3)
    pooled = []
    for w in medium_weights[0].values():
        if w.ndim == 2:
            typical = w[:, w.std(axis=0) < 3 * np.median(w.std(axis=0))]
            pooled.append((typical / typical.std()).ravel())
    assert stats.kurtosis(np.concatenate(pooled), fisher=False) == pytest.approx(expected,
                                                                                 rel=0.08)


@pytest.mark.parametrize("extra", [10, 11, -4095])
def test_tukey_h_draws_every_counter_once(extra):
    """Every block of the parallel Tukey-h draw takes its own counters: at
    h = 0 and scale 1 it is the fast normal pairs of counters 0, 1, ...
    exactly, over several blocks (one-value statistics cannot see blocks
    that repeat each other's draws), an odd size's last value the first of
    its pair."""
    from optical import _rng
    from optical.kernels import _rng_numba

    key = _rng.stream_key(5, 2)
    n = 3 * _rng_numba._BLOCK + extra
    tukey, pairs = np.empty(n, np.float32), np.empty(n + n % 2, np.float32)  # (pairs: even)
    _rng_numba.tukey_h_range(key, 0.0, 1.0, tukey)
    _rng_numba.normal_pairs_range(key, np.uint64(0), pairs)
    np.testing.assert_array_equal(tukey, pairs[:n])
    assert np.unique(tukey).size > 0.99 * n  # float32 draws: a rare tie, not repeated blocks


@pytest.mark.parametrize("h", [0.0, 0.1])
def test_tukey_h_samples_follow_their_distribution(h):
    """Inverting ``y = z exp(h z^2 / 2)`` (monotone) must give standard normals
    (KS), with the analytic variance and kurtosis ``3 (1 - 4h)^(-5/2) (1 - 2h)^3``."""
    from optical.transformer import synthetic

    y = synthetic._tukey_h(synthetic._key(3, "test"), (1000, 2001), h, std=0.5).ravel()
    assert y.dtype == np.float32
    norm = 0.5 / np.sqrt((1 - 2 * h) ** -1.5)
    target = y.astype(np.float64) / norm
    z = np.clip(target, -10, 10)
    for _ in range(60):  # Newton on g(z) = z exp(h z^2 / 2)
        e = np.exp(h * z * z / 2)
        z -= (z * e - target) / (e * (1 + h * z * z))
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(y.std() / 0.5 - 1) < 0.01
    kurtosis = 3 * (1 - 4 * h) ** -2.5 * (1 - 2 * h) ** 3
    assert abs(stats.kurtosis(y, fisher=False) / kurtosis - 1) < 0.1
    # counter-based: any part of the matrix is the same whatever else is drawn
    np.testing.assert_array_equal(
        synthetic._tukey_h(synthetic._key(3, "test"), (7, 2001), h, std=0.5).ravel(),
        y[:7 * 2001])


def test_super_weight_is_planted_in_layer_one_down_proj(medium_weights):
    stats_ = SyntheticLlama()
    layer, channel = stats_.super_index(MEDIUM)
    assert layer == 1 and channel == 2427 * 1376 // 14336
    dims, values = stats_.massive(MEDIUM, 0)
    down = medium_weights[1]["down_proj"]
    typical = np.median(np.abs(down))
    assert np.all(np.abs(down[dims, channel]) > 50 * typical)
    others = np.abs(down).ravel()
    others = np.delete(others, np.ravel_multi_index((dims, [channel] * len(dims)), down.shape))
    assert others.max() < np.abs(down[dims, channel]).min()  # the largest entries
    assert np.abs(medium_weights[0]["down_proj"]).max() < np.abs(down[dims, channel]).min()


def test_only_the_super_layer_holds_super_weights(medium_weights):
    """Layers before and after layer 1 have no entry near the super weights
    (~100x the typical weight)."""
    stats_ = SyntheticLlama()
    _, channel = stats_.super_index(MEDIUM)
    dims, _ = stats_.massive(MEDIUM, 0)
    smallest = np.abs(medium_weights[1]["down_proj"][dims, channel]).min()
    for layer in (0, 2, 3):
        weights = medium_weights[0] if layer == 0 else llama_layer_weights(MEDIUM, layer, seed=0)
        assert np.abs(weights["down_proj"]).max() < 0.5 * smallest, layer


def test_massive_activations_are_signed_and_log_uniform_over_their_range():
    """Over many model seeds: magnitudes within massive_range = (300, 1000),
    log-uniform (KS on their logarithms), and either sign."""
    stats_ = SyntheticLlama()
    values = np.concatenate([stats_.massive(MEDIUM, seed)[1] for seed in range(100)])
    assert values.size == 200
    assert 300 <= np.abs(values).min() and np.abs(values).max() <= 1000
    assert stats.kstest(np.log(np.abs(values)),
                        stats.uniform(np.log(300), np.log(1000 / 300)).cdf).pvalue > 0.01
    # Binomial(200, 1/2) negatives: 100 +- 7; 60..140 is beyond 5 sigma.
    assert 60 < np.count_nonzero(values < 0) < 140


@pytest.mark.parametrize("layer", [0, 1, 3])
def test_hidden_state_rms_grows_linearly_with_depth(layer):
    """Away from the first token and the outlier channels, the residual stream
    is Gaussian of RMS 0.05 + 0.3 layer (511 x 506 samples: the RMS is known to
    0.2%); the outlier channels carry 8x that."""
    h = llama_hidden_states(MEDIUM, layer, 512, seed=0)[1:].astype(np.float64)
    outliers = SyntheticLlama().residual_outliers(MEDIUM, 0)
    rest = np.setdiff1d(np.arange(MEDIUM.hidden_size), outliers)
    rms = 0.05 + 0.3 * layer
    assert np.sqrt(np.mean(h[:, rest] ** 2)) == pytest.approx(rms, rel=0.01)
    assert np.sqrt(np.mean(h[:, outliers] ** 2)) == pytest.approx(8 * rms, rel=0.05)
    assert stats.kstest(h[:, rest].ravel() / rms, "norm").pvalue > 0.01


def test_residual_outlier_channels_belong_to_the_model_not_the_prompt():
    """The outlier channels come from the weights' seed (model_seed): prompts
    drawn with other seeds have them at the same channels."""
    expected = SyntheticLlama().residual_outliers(MEDIUM, 7)
    assert not np.array_equal(expected, SyntheticLlama().residual_outliers(MEDIUM, 0))
    for seed in (0, 1):
        h = llama_hidden_states(MEDIUM, 1, 256, seed=seed, model_seed=7)[1:]
        rms = np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=0))
        np.testing.assert_array_equal(np.sort(np.argsort(rms)[-expected.size:]), expected)


def test_massive_activations_appear_on_the_first_token_from_the_super_layer():
    model = load_spec_model()
    dims, _ = SyntheticLlama().massive(MEDIUM, 0)
    h1 = model.hidden_states(1, 32)
    out = model.layer(1).reference(h1, dtype="float32")
    first, rest = np.abs(out[0]), np.abs(out[1:])
    assert 1e2 <= first[dims].min() and first[dims].max() <= 2e3
    assert rest.max() < 30 and np.delete(first, dims).max() < 0.2 * first[dims].min()
    # ... and the synthetic input of later layers carries them
    h2 = model.hidden_states(2, 32)
    assert np.abs(h2[0, dims]).min() >= 1e2 and np.abs(h2[1:]).max() < 30
    assert np.abs(h1).max() < 30  # not before the super layer


def load_spec_model():
    from pathlib import Path

    from optical.transformer.model import LlamaModel

    return LlamaModel(Path("medium"), MEDIUM, None, seed=0)


def test_hidden_state_structure_follows_the_model_seed():
    from pathlib import Path

    from optical.transformer.model import LlamaModel

    model = LlamaModel(Path("medium"), MEDIUM, None, seed=7)
    dims, _ = SyntheticLlama().massive(MEDIUM, 7)
    for seed in (0, 1):  # the input's own seed changes the tokens, not the model's features
        out = model.layer(1).reference(model.hidden_states(1, 16, seed=seed), dtype="float32")
        assert np.abs(out[0, dims]).min() > 1e2


def test_hidden_states_shapes_seeds_and_errors():
    h = llama_hidden_states(MEDIUM, 2, 16, seed=3)
    assert h.shape == (16, 512) and h.dtype == np.float32
    np.testing.assert_array_equal(llama_hidden_states(MEDIUM, 2, 16, seed=3), h)
    batched = llama_hidden_states(MEDIUM, 2, 16, seed=3, batch=3)
    assert batched.shape == (3, 16, 512)
    np.testing.assert_array_equal(llama_hidden_states(MEDIUM, 2, 16, seed=3, batch=1)[0], h)
    # Token 0 of every prompt is BOS: the BOS direction, and past the super
    # layer the massive activations, in each prompt, the other tokens noise.
    u = SyntheticLlama().bos_direction(MEDIUM, 3)
    dims, values = SyntheticLlama().massive(MEDIUM, 3)
    assert SyntheticLlama().super_index(MEDIUM)[0] < 2
    for prompt in batched:
        assert np.all(np.abs(prompt[1:] @ u) < 0.1 * (prompt[0] @ u)), prompt @ u
        np.testing.assert_array_equal(prompt[0, dims], values)
    assert not np.array_equal(batched[0, 1:], batched[1, 1:])
    # Each layer's input draws its own token noise, not a rescaled copy; and
    # a prompt of other length is another draw, not a prefix of this one.
    other = llama_hidden_states(MEDIUM, 3, 16, seed=3)
    assert abs(np.corrcoef(h[1:].ravel(), other[1:].ravel())[0, 1]) < 0.1
    shorter = llama_hidden_states(MEDIUM, 2, 8, seed=3)
    assert abs(np.corrcoef(h[1:8].ravel(), shorter[1:].ravel())[0, 1]) < 0.1
    # The BOS token's component along the BOS direction: 8x the RMS per element
    # (up to the super layer: later, the massive dimensions replace theirs).
    for layer in (0, 1):
        bos = llama_hidden_states(MEDIUM, layer, 4, seed=3)[0] @ u
        assert bos == pytest.approx(8 * (0.05 + 0.3 * layer) * np.sqrt(512), rel=0.05)
    assert not np.array_equal(llama_hidden_states(MEDIUM, 2, 16, seed=4), h)
    with pytest.raises(ValueError, match="tokens"):
        llama_hidden_states(MEDIUM, 2, 0, seed=3)
    with pytest.raises(ValueError, match="layer: 9 is out of range"):
        llama_hidden_states(MEDIUM, 9, 4, seed=3)


def test_real_shapes_of_the_bundled_models_without_building_earlier_layers():
    from pathlib import Path

    model = load(Path(__file__).resolve().parent.parent / "models" / "llama-3.2-1b")
    layer = model.layer(15)  # the last layer alone
    assert layer.weights["down_proj"].shape == (2048, 8192)
    assert layer.weights["k_proj"].shape == (512, 2048)


def test_synthetic_bert_weights_have_the_documented_statistics():
    """all-MiniLM-L6-v2's shapes without its wheel: Gaussian weights of std
    0.02 (BERT's initializer range), LayerNorm scales 1 +- 0.1, per layer and
    seed. The std of 147456+ draws is within 1 % of 0.02 (its standard
    error is under 0.2 %)."""
    spec = ModelSpec.from_config({"model_type": "bert", "hidden_size": 384,
                                  "intermediate_size": 1536, "num_hidden_layers": 6,
                                  "num_attention_heads": 12, "vocab_size": 30522})
    w = bert_layer_weights(spec, 2, seed=0)
    for shape in spec.linear_shapes():
        weight = w[shape.name]
        assert weight.shape == (shape.out_features, shape.in_features)
        assert abs(weight.mean()) < 1e-3 and abs(weight.std() / 0.02 - 1) < 0.01, shape.name
        assert abs(stats.kurtosis(weight.ravel())) < 0.1, shape.name  # Gaussian tails
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
        assert abs(w[name + ".weight"].mean() - 1) < 0.02, name
        assert abs(w[name + ".weight"].std() / 0.1 - 1) < 0.2, name
    other = bert_layer_weights(spec, 3, seed=0)
    assert not np.array_equal(other["query"], w["query"])
    np.testing.assert_array_equal(bert_layer_weights(spec, 2, seed=0)["query"], w["query"])


def test_rms_norm_eps_defaults_to_hugging_faces():
    transformers = pytest.importorskip("transformers")
    config = {k: v for k, v in TINY_LLAMA.items() if k != "rms_norm_eps"}
    layer = LlamaModel(Path("tiny"), ModelSpec.from_config(config), None, seed=0).layer(0)
    assert layer.eps == transformers.LlamaConfig().rms_norm_eps == 1e-6


def test_layer_returns_the_layer_asked_for_while_another_thread_replaces_it(tmp_path,
                                                                              monkeypatch):
    """Threads sharing a model: layer(1) returns layer 1 even when the kept
    layer is replaced between its build and its return (forced here by a
    replaced layer whose deallocation runs Python code, which lets another
    thread in)."""
    import threading
    import time

    from tests.transformer_helpers import write_model

    model = load(write_model(tmp_path, TINY_LLAMA))
    build = type(model)._build_layer
    for index in (0, 1, 2):  # warm: the timings below are of the pauses alone
        model.layer(index)
    model._last_layer = None

    class Slow:
        def __init__(self, layer, pause):
            self.layer, self.index, self.pause = layer, layer.index, pause

        def __del__(self):
            time.sleep(self.pause)

    def slow_build(self, index):
        if index == 1:
            time.sleep(0.2)
        return Slow(build(self, index), 0.3 if index == 2 else 0.0)

    monkeypatch.setattr(type(model), "_build_layer", slow_build)
    got = {}
    first = threading.Thread(target=lambda: got.__setitem__(1, model.layer(1).index))
    first.start()
    time.sleep(0.05)
    model.layer(2)  # built and replaced while layer 1 builds
    time.sleep(0.2)  # the first thread now keeps layer 1, dropping layer 2 (a slow __del__)
    third = threading.Thread(target=lambda: got.__setitem__(0, model.layer(0).index))
    third.start()
    first.join(timeout=30)
    third.join(timeout=30)
    assert got == {1: 1, 0: 0}
