"""Contracts of the BERT and Llama layers left open by a mutation audit
(mut18): LayerNorm, RMSNorm, exact GELU, SiLU and masked mean pooling
against float64 numpy re-derivations (with epsilons large enough to show
where they sit), BERT's layer_norm_eps default (Hugging Face's 1e-12),
non-boolean masks refused, and the config keys of variants the layers do
not implement."""

import numpy as np
import pytest
from scipy import special

from optical import transformer
from optical.transformer import bert, llama
from optical.transformer._engines import ReferenceEngine
from optical.transformer.spec import ModelSpec
from tests.transformer_helpers import TINY_BERT, TINY_LLAMA, write_model

F32 = ReferenceEngine("float32")


@pytest.mark.parametrize("eps", [1e-12, 0.5])
def test_layer_norm_against_float64(rng, eps):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis, the
    biased variance, eps inside the root (0.5: comparable to the variance)."""
    x = (3.0 + rng.standard_normal((3, 4, 10)) * rng.uniform(0.3, 2.0, (3, 4, 1))
         ).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, 10).astype(np.float32)
    beta = rng.standard_normal(10).astype(np.float32)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    expected = (x64 - mu) / np.sqrt(var + eps) * gamma + beta
    got = bert.layer_norm(x, gamma, beta, eps, F32)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm_against_float64(rng, eps):
    """x / sqrt(mean(x**2) + eps) * gamma over the last axis (no centring)."""
    x = (2.0 + rng.standard_normal((2, 5, 12)) * rng.uniform(0.2, 1.5, (2, 5, 1))
         ).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, 12).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * gamma
    got = llama._rms_norm(x, gamma, eps, F32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_gelu_is_the_erf_form():
    """BERT's "gelu": 0.5 x (1 + erf(x / sqrt 2)), not the tanh approximation
    (which is off by up to ~5e-4 near |x| = 2)."""
    x = np.linspace(-8, 8, 3201).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = 0.5 * x64 * (1 + special.erf(x64 / np.sqrt(2)))
    got = bert._gelu(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_silu_against_float64():
    """x sigmoid(x), finite (and no warning) where exp(-x) overflows float32."""
    x = np.concatenate([np.linspace(-20, 20, 4001), [-200.0, -1e4, 200.0, 1e4]]
                       ).astype(np.float32)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        expected = x64 / (1 + np.exp(-x64))
    got = llama._silu(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-30)


def test_mean_pool_averages_the_real_tokens_and_normalises(rng):
    """Mean over each prompt's real tokens (what the padding holds does not
    count), then unit L2 norm, per prompt."""
    h = rng.standard_normal((3, 6, 5)).astype(np.float32)
    mask = np.zeros((3, 6), dtype=bool)
    mask[0, :6] = mask[1, :2] = mask[2, [0, 3, 4]] = True
    h[~mask] = 1e3  # padding holding anything
    got = transformer.bert.mean_pool(h, mask)
    for b in range(3):
        mean = h[b][mask[b]].astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(got[b], mean / np.linalg.norm(mean), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-6)


def _bert_spec(**change):
    config = {k: v for k, v in TINY_BERT.items() if k != "layer_norm_eps"}
    return ModelSpec.from_config({**config, **change})


def test_bert_layer_norm_eps_defaults_to_hugging_faces():
    """Without layer_norm_eps, BERT's LayerNorms use Hugging Face's default
    1e-12: the layer equals one given 1e-12 outright, and differs from 1e-5
    on inputs whose LayerNorm variance is small (weights and input scaled
    down so the variance is ~1e-7)."""
    from optical.transformer import synthetic

    spec = _bert_spec()
    weights = synthetic.bert_layer_weights(spec, 0, 0)
    small = {k: (v if "LayerNorm" in k else v * np.float32(1e-2)) for k, v in weights.items()}
    h = (np.random.default_rng(1).standard_normal((2, 5, spec.hidden_size)) * 1e-3
         ).astype(np.float32)
    default = bert.BertLayer(spec, 0, small).reference(h)
    hf = bert.BertLayer(_bert_spec(layer_norm_eps=1e-12), 0, small).reference(h)
    other = bert.BertLayer(_bert_spec(layer_norm_eps=1e-5), 0, small).reference(h)
    np.testing.assert_array_equal(default, hf)
    assert np.max(np.abs(other - hf)) > 0.1


@pytest.mark.parametrize("mask", [np.ones((2, 4), dtype=np.int64),
                                  np.ones((2, 4), dtype=np.float32),
                                  np.ones((2, 4), dtype=np.uint8)])
def test_a_mask_that_is_not_boolean_is_refused(mask):
    """An integer mask would index tokens by position (mask [1, 1, 0] picks
    token 1 twice), so only bool is taken."""
    with pytest.raises(ValueError, match=r"mask: expected a bool array of shape \(2, 4\)"):
        bert.check_mask(mask, (2, 4))
    spec = ModelSpec.from_config(TINY_BERT)
    from optical.transformer import synthetic

    layer = bert.BertLayer(spec, 0, synthetic.bert_layer_weights(spec, 0, 0))
    h = np.zeros((2, 4, spec.hidden_size), np.float32)
    with pytest.raises(ValueError, match="mask: expected a bool array"):
        layer.reference(h, mask=mask)


@pytest.mark.parametrize("act", ["relu", "gelu_new", "gelu_pytorch_tanh", "silu"])
def test_bert_activations_other_than_exact_gelu_are_refused(tmp_path, act):
    """Only hidden_act 'gelu' (erf) is this layer's; Hugging Face's
    'gelu_new' and 'gelu_pytorch_tanh' are the tanh approximation."""
    write_model(tmp_path, {**TINY_BERT, "hidden_act": act})
    with pytest.raises(ValueError, match=f"hidden_act '{act}' is not supported; "
                                         "expected 'gelu'"):
        transformer.load(tmp_path)


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias"])
def test_llama_biases_are_refused(tmp_path, key):
    write_model(tmp_path, {**TINY_LLAMA, key: True})
    with pytest.raises(ValueError, match=f"{key}=true is not supported"):
        transformer.load(tmp_path)
    # false (Llama's own value) is taken
    write_model(tmp_path, {**TINY_LLAMA, key: False})
    transformer.load(tmp_path)


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_new"])
def test_llama_activations_other_than_silu_are_refused(tmp_path, act):
    write_model(tmp_path, {**TINY_LLAMA, "hidden_act": act})
    with pytest.raises(ValueError, match=f"hidden_act '{act}' is not supported"):
        transformer.load(tmp_path)


def test_swish_is_silu(tmp_path):
    """transformers' ACT2FN maps "swish" and "silu" to the same SiLU: a
    config naming either computes the same layer."""
    h = np.random.default_rng(0).standard_normal((5, TINY_LLAMA["hidden_size"]))
    out = {}
    for act in ("silu", "swish"):
        model = transformer.load(write_model(tmp_path / act, {**TINY_LLAMA, "hidden_act": act}))
        out[act] = model.layer(0).reference(h.astype(np.float32), dtype="float32")
    np.testing.assert_array_equal(out["silu"], out["swish"])


@pytest.mark.parametrize("spec", [TINY_LLAMA, TINY_BERT], ids=["llama", "bert"])
def test_the_jax_backend_runs_every_product_of_a_layer(tmp_path, monkeypatch, spec):
    """``matmul_options={"backend": "jax"}`` (the engine's documented hook
    for a backend) used to fail on every call: the derived 63-bit seeds are
    beyond the JAX keys' 2**32, and its JAX-array products then reached numpy
    code. Each product now gets the 32-bit derived seed of its own label, the
    layer stays numpy, and the ideal machine gives the numba backend's layer
    to float32 rounding (above 80 dB)."""
    pytest.importorskip("jax")
    import optical
    from optical.transformer import _engines

    model = transformer.load(write_model(tmp_path, spec))
    layer = model.layer(0)
    h = model.hidden_states(0, tokens=5)
    def run(*args, **kwargs):
        return layer.optical(h, *args, **kwargs)

    ideal = optical.presets.get("ideal").replace({"core.inputs": 24, "core.outputs": 16})
    on_jax = run(ideal, seed=3, matmul_options={"backend": "jax"})
    assert isinstance(on_jax, np.ndarray) and on_jax.dtype == np.float32
    # float32 GEMMs summed in another order, through a layer's products and norms
    assert optical.metrics.sqnr_db(run(ideal, seed=3), on_jax) > 80

    derived, seeds = [], []
    derive, matmul = _engines.derive_seed, _engines.matmul
    monkeypatch.setattr(_engines, "derive_seed", lambda *a, **k: derived.append(
        (a, derive(*a, **k))) or derived[-1][1])
    monkeypatch.setattr(_engines, "matmul",
                        lambda *a, seed, **k: seeds.append(seed) or matmul(*a, seed=seed, **k))
    noisy = optical.presets.get("iris-like").replace({"core.inputs": 24, "core.outputs": 16})
    first = run(noisy, seed=3, matmul_options={"backend": "jax"})
    assert len(seeds) >= 4 and seeds == [seed for _, seed in derived]
    for labels, seed in derived:  # the top 32 of the 63 bits the other backends get
        assert labels[:2] == (3, 0) and seed == derive(*labels) >> 31 < 2**32
    assert len(set(seeds)) == len(seeds)
    np.testing.assert_array_equal(run(noisy, seed=3, matmul_options={"backend": "jax"}), first)


def test_a_cached_layers_weights_are_read_only(tmp_path):
    """A style audit scaled `model.layer(1).weights["q_proj"]` in place: every
    later `model.layer(1)` (the model keeps its last layer) ran the scaled
    weights, until another layer evicted it and the result silently
    reverted. The weights are read-only views; a caller's own arrays given
    to a layer keep their flags."""
    import numpy as np

    from optical import transformer
    from optical.transformer.llama import LlamaLayer
    from tests.transformer_helpers import TINY_LLAMA, write_model

    model = transformer.load(write_model(tmp_path, TINY_LLAMA))
    layer = model.layer(1)
    with pytest.raises(ValueError, match="read-only"):
        layer.weights["q_proj"] *= 2
    with pytest.raises(TypeError):
        layer.weights["q_proj"] = layer.weights["q_proj"] * 2
    mine = {k: np.array(v) for k, v in layer.weights.items()}
    LlamaLayer(model.spec, 1, mine)
    assert all(a.flags.writeable for a in mine.values())


def test_results_do_not_depend_on_numpys_floating_point_error_handlers(tmp_path):
    """A left-alone finding: under ``np.seterr(all="raise")`` (a researcher's
    way of catching overflow) every fp16 reference raised FloatingPointError
    where rounding to fp16 underflows (RoPE's tables near cos = 0), every
    wang-2022 validate where softmax's exp underflows, and every embedding
    where the L2 norm squares small components: underflow to subnormals and
    zero is what fp16, bf16 and float32 arithmetic do, not an error. Under
    it each result is the one numpy's default handling gives, bit for bit."""
    from optical import presets
    from optical.transformer import sentence

    wang = presets.get("wang-2022")
    runs = []
    for config in (TINY_LLAMA, TINY_BERT):
        model = transformer.load(write_model(tmp_path / config["model_type"], config))
        layer = model.layer(0)
        h = model.hidden_states(0, 40, seed=0)
        h[..., 0] *= np.float32(60.0)  # a massive channel: scores far apart, exp underflows
        for dtype in ("float16", "bfloat16", "float32"):
            runs.append(lambda layer=layer, h=h, dtype=dtype: layer.reference(h, dtype=dtype))
        runs.append(lambda layer=layer, h=h: layer.optical(h, wang, seed=1))
    pooled = np.random.default_rng(2).standard_normal((2, 5, 8)).astype(np.float32)
    pooled[0] *= np.float32(1e-22)  # squares below float32's least normal (norm < eps)
    mask = np.ones((2, 5), dtype=bool)
    runs.append(lambda: sentence.pool(pooled, mask, sentence.SentencePipeline()))
    expected = [run() for run in runs]
    with np.errstate(all="raise"):
        for run, want in zip(runs, expected, strict=True):
            np.testing.assert_array_equal(run(), want)


def test_a_models_identity_is_read_only(tmp_path):
    """A caches audit set ``model.seed = 1`` on a synthetic model: the layer it
    kept was seed 0's and came back from ``model.layer(0)`` (validate read
    61.1 dB where a seed-1 model gives 57.3) while ``weights_source`` said
    seed 1. What the kept layer was built from cannot be rebound."""
    model = transformer.load(write_model(tmp_path, TINY_LLAMA), seed=0)
    layer = model.layer(0)
    for name, value in (("seed", 1), ("spec", None), ("checkpoint", None),
                        ("directory", tmp_path)):
        with pytest.raises(AttributeError):
            setattr(model, name, value)
    assert model.seed == 0 and model.layer(0) is layer
    other = transformer.load(write_model(tmp_path, TINY_LLAMA), seed=1).layer(0)
    assert not np.array_equal(other.weights["q_proj"], layer.weights["q_proj"])


def test_the_public_numerics_ignore_underflow_alone():
    """The review of the day's diff: softmax, round_to and kl_divergence,
    called directly, were untested under ``np.seterr(all="raise")`` (the
    forwards' decorator covered them inside a layer). Each underflows by
    design and gives numpy's default result; overflow still raises."""
    import optical
    from optical.transformer.numerics import round_to, softmax

    scores = np.array([[0.0, -200.0, 3.0], [-1e30, 5.0, 4.0]], dtype=np.float32)
    tiny = np.array([1e-6, 3e-8, -2e-9, 1.0], dtype=np.float32)  # fp16 subnormals and zero
    logits = np.array([[0.0, -800.0, 2.0], [1.0, 2.0, -900.0]])
    runs = [lambda: softmax(scores), lambda: round_to(tiny, "float16"),
            lambda: optical.metrics.kl_divergence(logits, logits[:, ::-1].copy())]
    expected = [run() for run in runs]
    with np.errstate(all="raise"):
        for run, want in zip(runs, expected, strict=True):
            np.testing.assert_array_equal(run(), want)
        with pytest.raises(FloatingPointError, match="overflow"):
            np.float32(3e38) * np.float32(10)  # the caller's handling kept outside them
