"""The reference Llama layer against independent implementations: Hugging Face's
LlamaDecoderLayer (torch, when installed) and a float64 numpy re-derivation."""

import copy
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import optical
from optical import transformer
from optical.transformer.model import LlamaModel
from optical.transformer.numerics import largest, round_to, softmax
from optical.transformer.rope import inverse_frequencies, rope_settings, rope_tables
from optical.transformer.spec import ModelSpec
from tests.transformer_helpers import (
    TINY_LLAMA,
    llama3_inv_freq64,
    llama_layer64,
    random_llama_tensors,
    write_model,
)

# --------------------------------------------------------------------------- #
# rounding and RoPE
# --------------------------------------------------------------------------- #

def test_bfloat16_rounding_matches_ml_dtypes_including_ties_and_overflow(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-40, 40, 200_000))).astype(np.float32)
    ties = ((rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
             & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45],
                       dtype=np.float32)
    for values in (x, ties[np.isfinite(ties)], special):
        expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(round_to(values, "bfloat16"), expected)


def test_float16_rounding_is_numpys_half():
    x = np.array([1 / 3, 70000.0, -1e-8, 2.0**-24 * 1.5], dtype=np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(round_to(x, "float16"), expected)
    assert np.isinf(expected[1])
    assert round_to(x, "float32") is x
    with pytest.raises(ValueError, match="float8"):
        round_to(x, "float8")


def test_llama3_frequencies_match_metas_apply_scaling_in_all_three_bands():
    scaling = TINY_LLAMA["rope_scaling"]
    for head_dim in (16, 64, 128):
        ours = inverse_frequencies(head_dim, 500000.0, scaling)
        expected = llama3_inv_freq64(head_dim, 500000.0, scaling)
        np.testing.assert_allclose(ours, expected, rtol=2e-6)
        wavelength = 2 * math.pi * 500000.0 ** (np.arange(0, head_dim, 2) / head_dim)
        # unchanged (< 2048), scaled (> 8192) and blended bands are all present
        assert (wavelength < 2048).any() and (wavelength > 8192).any()
        assert ((wavelength > 2048) & (wavelength < 8192)).any()
    plain = inverse_frequencies(16, 10000.0, None)
    np.testing.assert_allclose(plain, 10000.0 ** (-np.arange(0, 16, 2) / 16), rtol=2e-6)


def test_rope_settings_read_both_config_styles():
    old = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    new = {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}}
    assert rope_settings(old)[0] == rope_settings(new)[0] == 500000.0
    assert rope_settings(old)[1]["factor"] == rope_settings(new)[1]["factor"] == 8.0
    with pytest.raises(ValueError, match=r"rope_scaling.rope_type: 'yarn' is not supported"):
        inverse_frequencies(16, 1e4, {"rope_type": "yarn"})
    with pytest.raises(ValueError, match=r"rope_parameters.low_freq_factor: missing"):
        inverse_frequencies(16, 1e4, {"rope_type": "llama3", "factor": 8.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192},
                            key="rope_parameters")


# --------------------------------------------------------------------------- #
# the layer against a float64 re-derivation
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("safetensors")
    tensors = random_llama_tensors(TINY_LLAMA, seed=3)
    directory = write_model(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA, tensors)
    return transformer.load(directory), tensors


def test_float32_reference_matches_float64_rederivation(tiny):
    """Two prompts: unit-RMS hidden states, and states of RMS 0.01 (as a
    first layer's embeddings are), where RMSNorm's eps inside the square
    root matters (outside it: 9e-2 relative error; float32 gives 4e-7)."""
    model, tensors = tiny
    h = np.random.default_rng(5).standard_normal((2, 48, 64)).astype(np.float32)
    h[1] *= np.float32(0.01)
    for index in (0, 2):
        layer = model.layer(index)
        ours = layer.reference(h, dtype="float32")
        prefix = f"model.layers.{index}."
        w = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        for b in range(2):
            expected = llama_layer64(h[b], w, TINY_LLAMA)
            assert optical.metrics.relative_error(expected, ours[b]) < 1e-5
        # a 2-D input is the batch-of-one case
        np.testing.assert_allclose(layer.reference(h[1], dtype="float32"), ours[1],
                                   rtol=1e-5, atol=1e-6)


def test_causality_later_tokens_do_not_change_earlier_outputs(tiny):
    model, _ = tiny
    h = np.random.default_rng(6).standard_normal((20, 64)).astype(np.float32)
    layer = model.layer(1)
    full = layer.reference(h, dtype="float32")
    np.testing.assert_allclose(layer.reference(h[:7], dtype="float32"), full[:7],
                               rtol=1e-5, atol=1e-6)


def test_reference_outputs_are_dtype_representable(tiny):
    model, _ = tiny
    h = np.random.default_rng(7).standard_normal((16, 64)).astype(np.float32)
    for dtype in ("float16", "bfloat16"):
        out = model.layer(0).reference(h, dtype=dtype)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(round_to(out, dtype), out)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_half_precision_product_is_rounded_to_its_dtype(tmp_path, dtype):
    """Hugging Face rounds each op's result to the dtype: so does every
    product the reference records, the scaled attention scores included. At
    head_dim 32 the scale 32**-0.5 is not a power of two, so scores left
    unrounded after scaling would not be representable (at the tiny model's
    head_dim 16 the scale 1/4 is exact and would hide it)."""
    config = {**TINY_LLAMA, "head_dim": 32}
    model = transformer.load(write_model(tmp_path, config, random_llama_tensors(config, seed=4)))
    h = np.random.default_rng(8).standard_normal((2, 12, 64)).astype(np.float32)
    trace = model.layer(0).trace(h, dtype=dtype)
    assert "attention.scores" in trace.products
    for name, product in trace.products.items():
        np.testing.assert_array_equal(round_to(product, dtype), product, err_msg=name)


def test_bad_layer_inputs_are_named(tiny):
    model, _ = tiny
    layer = model.layer(0)
    h = np.zeros((4, 64), dtype=np.float32)
    with pytest.raises(TypeError, match="h: dtype float64"):
        layer.reference(h.astype(np.float64))
    with pytest.raises(ValueError, match=r"h: expected shape \(tokens, 64\)"):
        layer.reference(np.zeros((4, 63), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        layer.reference(np.full((4, 64), np.nan, dtype=np.float32))
    with pytest.raises(TypeError, match="h: numpy.ma.MaskedArray, a numpy.ndarray subclass"):
        layer.reference(np.ma.masked_array(h, mask=h == 0))  # the mask was dropped
    for run in (layer.reference, layer.trace):  # refused with the valid choices listed
        with pytest.raises(ValueError, match=r"^dtype: 'float8' is not a reference dtype; "
                                             r"valid: 'float32', 'float16', 'bfloat16'"):
            run(h, dtype="float8")
    with pytest.raises(ValueError, match="exactly one of dtype"):
        layer.trace(h)
    with pytest.raises(ValueError, match="exactly one of dtype"):  # not silently optical
        layer.trace(h, dtype="float16", config=optical.presets.get("ideal"))
    with pytest.raises(ValueError, match="layer: 3 is out of range"):
        model.layer(3)


# --------------------------------------------------------------------------- #
# the layer against Hugging Face transformers
# --------------------------------------------------------------------------- #

# Importing torch and transformers alone takes ~10 s here: these run in CI (`make test`).

@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    # A copy: transformers 5 writes rope_theta into the rope_scaling dict it
    # is given, which was TINY_LLAMA's own (a later test of the same worker
    # then wrote a config.json whose RoPE settings disagreed).
    kwargs = {k: v for k, v in copy.deepcopy(TINY_LLAMA).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    config = transformers.LlamaConfig(**kwargs, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # HF initialises norms to 1; make them matter
                param.copy_(1 + 0.2 * torch.randn_like(param))
    directory = tmp_path_factory.mktemp("hf-llama")
    model.save_pretrained(directory)
    return torch, model, transformer.load(directory)


def _hf_layer_output(torch, model, index, h, dtype):
    # A copy: casting the shared layer to fp16 and back would leave its weights
    # rounded to fp16 for every later call (a bf16 run would then see bf16(fp16(w))).
    layer = copy.deepcopy(model.model.layers[index]).to(dtype)
    batch, tokens = h.shape[:2]
    x = torch.from_numpy(h).to(dtype)
    positions = torch.arange(tokens)[None].expand(batch, tokens)
    cos, sin = model.model.rotary_emb(x, positions)
    mask = torch.full((tokens, tokens), torch.finfo(dtype).min).triu(1)[None, None].to(dtype)
    with torch.no_grad():
        out = layer(x, attention_mask=mask, position_ids=positions,
                    position_embeddings=(cos, sin))
    out = out[0] if isinstance(out, tuple) else out
    return out.float().numpy()


@pytest.mark.slow
def test_matches_hugging_face_llama_decoder_layer(hf_llama):
    torch, model, ours = hf_llama
    h = np.random.default_rng(11).standard_normal((2, 40, 64)).astype(np.float32)
    layer = ours.layer(1)
    hf = {name: _hf_layer_output(torch, model, 1, h, getattr(torch, name))
          for name in ("float32", "float16", "bfloat16")}
    mine = {name: layer.reference(h, dtype=name) for name in hf}
    assert optical.metrics.relative_error(hf["float32"], mine["float32"]) < 1e-4
    # In half precision we reproduce HF's rounding, not just its maths: our
    # distance to HF fp16 is a small fraction of fp16's own distance to fp32.
    for name, eps in (("float16", 2.0**-11), ("bfloat16", 2.0**-8)):
        own_error = optical.metrics.relative_error(hf["float32"], hf[name])
        ours_vs_hf = optical.metrics.relative_error(hf[name], mine[name])
        assert ours_vs_hf < eps
        assert ours_vs_hf < 0.5 * own_error, (name, ours_vs_hf, own_error)
    for name in ("float16", "bfloat16"):
        assert optical.metrics.relative_error(hf[name], mine[name]) < 1e-5, name


@pytest.mark.slow
def test_bf16_hf_checkpoint_loads_bit_exactly(hf_llama, tmp_path):
    torch, model, _ = hf_llama
    bf16 = copy.deepcopy(model).to(torch.bfloat16)  # the fixture's model stays fp32
    bf16.save_pretrained(tmp_path)
    layer = transformer.load(tmp_path).layer(2)
    state = bf16.state_dict()
    for short, name in (("down_proj", "mlp.down_proj.weight"),
                        ("q_proj", "self_attn.q_proj.weight"),
                        ("input_layernorm", "input_layernorm.weight")):
        expected = state[f"model.layers.2.{name}"].float().numpy()
        np.testing.assert_array_equal(layer.weights[short], expected)


@pytest.mark.slow
def test_a_minimal_config_gets_hugging_faces_defaults(tmp_path):
    """A config.json without the optional keys (rms_norm_eps, rope_theta,
    rope_scaling, hidden_act, biases) reads as Hugging Face's LlamaConfig
    fills them in (eps 1e-6, theta 1e4, no scaling). The hidden states are
    small (mean square 1e-6), so the norm's eps moves the output."""
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    optional = ("rms_norm_eps", "rope_theta", "rope_scaling", "hidden_act", "attention_bias",
                "mlp_bias", "torch_dtype")
    minimal = {k: v for k, v in TINY_LLAMA.items() if k not in optional}
    torch.manual_seed(1)
    config = transformers.LlamaConfig(**{k: v for k, v in minimal.items()
                                         if k not in ("architectures", "model_type")},
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(tmp_path)
    write_model(tmp_path, minimal)  # HF wrote every default into config.json
    assert not set(optional) & set(transformer.load(tmp_path).spec.raw)
    h = 1e-3 * np.random.default_rng(5).standard_normal((1, 40, 64)).astype(np.float32)
    ours = transformer.load(tmp_path).layer(0).reference(h, dtype="float32")
    hf = _hf_layer_output(torch, model, 0, h, torch.float32)
    assert optical.metrics.relative_error(hf, ours) < 1e-4


def test_reference_bits_do_not_depend_on_the_blas_thread_count():
    """The references' GEMMs run in fixed single-threaded pieces: with plain
    numpy products the fp32 and fp16 outputs of this layer (synthetic
    Llama-3.2-1B shapes, 24 tokens) differ between 1 and 2 OpenBLAS threads."""
    from threadpoolctl import threadpool_limits

    from optical import transformer

    model = transformer.load(Path(__file__).resolve().parent.parent / "models" / "llama-3.2-1b")
    layer = model.layer(1)
    h = model.hidden_states(1, 24)
    runs = {}
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            runs[threads] = [layer.reference(h, dtype=d) for d in ("float32", "float16")]
    for one, two in zip(runs[1], runs[2], strict=True):
        np.testing.assert_array_equal(one, two)


def test_prompts_beyond_max_position_embeddings_are_named(tmp_path):
    short = transformer.load(write_model(tmp_path, {**TINY_LLAMA, "max_position_embeddings": 8}))
    hidden = TINY_LLAMA["hidden_size"]
    assert short.layer(0).reference(np.zeros((8, hidden), np.float32)).shape == (8, hidden)
    with pytest.raises(ValueError, match="tokens: 9 exceed max_position_embeddings 8"):
        short.layer(0).reference(np.zeros((9, hidden), np.float32))
    with pytest.raises(ValueError, match="tokens: 9 exceed max_position_embeddings 8"):
        short.hidden_states(0, 9)
    with pytest.raises(ValueError, match="tokens: 9 exceed max_position_embeddings 8"):
        transformer.validate(short, layer=0, tokens=9, config=optical.presets.get("ideal"))


def test_softmax_is_stable_for_large_logits_and_gives_masked_keys_zero():
    s = np.array([[1000.0, 999.0, -np.inf], [0.0, math.log(2.0), -np.inf]], dtype=np.float32)
    p = softmax(s)
    e = math.exp(-1.0)
    np.testing.assert_allclose(p, [[1 / (1 + e), e / (1 + e), 0.0], [1 / 3, 2 / 3, 0.0]],
                               rtol=1e-6)


@pytest.mark.parametrize("value", [True, False])
def test_boolean_rope_numbers_are_refused(value):
    with pytest.raises(ValueError, match="rope_theta must be a positive number"):
        rope_settings({"rope_theta": value})
    scaling = {"rope_type": "llama3", "factor": True, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    with pytest.raises(ValueError, match=r"rope_scaling.factor: must be a positive number"):
        inverse_frequencies(16, 1e4, scaling)


def test_zero_token_input_is_named():
    layer = LlamaModel(Path("tiny"), ModelSpec.from_config(TINY_LLAMA), None, seed=0).layer(0)
    for shape in ((0, 64), (2, 0, 64)):
        with pytest.raises(ValueError, match=r"h: expected shape \(tokens, 64\)"):
            layer.reference(np.zeros(shape, np.float32))


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (2**64, ValueError),
                                             (1.5, TypeError), (True, TypeError)])
def test_an_optical_trace_refuses_a_bad_seed(seed, error):
    """The layer's own check, as optical.matmul's: every product's seed is
    derived from it, so a bad one must not reach the derivation."""
    layer = LlamaModel(Path("tiny"), ModelSpec.from_config(TINY_LLAMA), None, seed=0).layer(0)
    h = np.zeros((2, 64), np.float32)
    with pytest.raises(error, match="seed"):
        layer.trace(h, config=optical.presets.get("ideal"), seed=seed)


def test_reference_products_are_rounded_as_torch_half_rounds_them():
    """model.half() holds each weight in fp16 and every GEMM's result is
    rounded once to fp16 (the attention products too). With fp16's spacing
    2**-10 in [1, 2) and 2**-9 in [2, 4): a weight 1 + 0.4 ulp is held as 1,
    so 3 x it is 3 (unrounded: 3 + 1.2 ulp, which rounds up to 3 + 2 ulp); a
    weight 1 + ulp is exact in fp16 (bf16, spacing 2**-7, holds it as 1); a
    sum 1 + 0.75 ulp rounds to 1 + ulp."""
    from optical.transformer._engines import ReferenceEngine

    ulp = 2.0**-10
    x = np.array([[3.0, 0.0], [0.0, 1.0]], np.float32)
    w = np.array([[1 + 0.4 * ulp, 0.0], [0.0, 1 + ulp]], np.float32)  # [out, in]
    np.testing.assert_array_equal(ReferenceEngine("float16").linear("q", x, w),
                                  np.array([[3.0, 0.0], [0.0, 1 + ulp]], np.float32))
    np.testing.assert_array_equal(ReferenceEngine("bfloat16").linear("q", x, w),
                                  np.array([[3.0, 0.0], [0.0, 1.0]], np.float32))
    a = np.ones((1, 1, 1, 2), np.float32)
    b = np.array([1.0, 0.75 * ulp], np.float32)
    engine = ReferenceEngine("float16")
    assert engine.scores(a, b.reshape(1, 1, 1, 2)).reshape(()) == 1 + ulp
    assert engine.values(a, b.reshape(1, 1, 2, 1)).reshape(()) == 1 + ulp
    exact = ReferenceEngine("float32")  # float32 holds 1 + 0.75 ulp
    assert exact.scores(a, b.reshape(1, 1, 1, 2)).reshape(()) == np.float32(1 + 0.75 * ulp)


def test_largest_is_each_reference_dtypes_largest_finite_value():
    """Against numpy's and ml_dtypes' finfo; rounding it keeps it, and a
    value past the last rounding boundary becomes inf."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert largest("float16") == 65504.0
    assert largest("float32") == float(np.finfo(np.float32).max)
    assert largest("bfloat16") == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    for dtype in ("float16", "bfloat16"):
        top = np.array([largest(dtype)], dtype=np.float32)
        assert round_to(top, dtype)[0] == top[0]
        with np.errstate(over="ignore"):
            assert np.isinf(round_to(top * np.float32(1.01), dtype)[0])
    with pytest.raises(ValueError, match="not a reference dtype"):
        largest("float64")


# --------------------------------------------------------------------------- #
# unusual valid shapes
# --------------------------------------------------------------------------- #

UNUSUAL_SHAPES = {
    "mqa": {"num_key_value_heads": 1},
    "mha": {"num_key_value_heads": 4},
    "head_dim_24": {"head_dim": 24},  # 4 heads x 24 = 96, not the hidden size 64
    "hidden_72_odd_mlp": {"hidden_size": 72, "num_attention_heads": 3, "num_key_value_heads": 1,
                          "head_dim": None, "intermediate_size": 5},
}


@pytest.mark.parametrize("change", UNUSUAL_SHAPES.values(), ids=UNUSUAL_SHAPES.keys())
def test_unusual_shapes_match_float64_and_never_mix_batch_rows(tmp_path, change):
    """MQA, MHA, a head_dim other than hidden / heads, a hidden size of 72
    and an MLP of 5 against the float64 re-derivation, at 1, 2 and 37
    tokens; a batch's rows each equal to their sequence alone (reference
    and ideal optical; the optical pass to float32 rounding: a batch's rows
    sit at other lanes of the BLAS's micro-kernels, which OpenBLAS's Haswell
    kernels round apart, as on this machine's AMD EPYC; a row mixed with
    another prompt's would be off by O(1)). Every other test's head_dim is
    hidden / heads: a score scale of (hidden // heads) ** -0.5 passed them
    all."""
    pytest.importorskip("safetensors")
    config = {**TINY_LLAMA, "num_hidden_layers": 1, **change}
    tensors = random_llama_tensors(config, seed=4)
    layer = transformer.load(write_model(tmp_path, config, tensors)).layer(0)
    w = {k.removeprefix("model.layers.0."): v for k, v in tensors.items()}
    hidden = config["hidden_size"]
    for tokens in (1, 2, 37):
        h = np.random.default_rng(tokens).standard_normal((tokens, hidden)).astype(np.float32)
        assert optical.metrics.relative_error(llama_layer64(h, w, config),
                                              layer.reference(h, dtype="float32")) < 1e-5
    ideal = optical.presets.get("ideal")
    batch = np.random.default_rng(9).standard_normal((3, 37, hidden)).astype(np.float32)
    together = layer.reference(batch, dtype="float32")
    on_ideal = layer.optical(batch, ideal, seed=0)
    for b in range(3):
        np.testing.assert_allclose(together[b], llama_layer64(batch[b], w, config),
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(on_ideal[b], layer.optical(batch[b], ideal, seed=0),
                                   rtol=1e-5, atol=1e-5)
    assert optical.metrics.relative_error(together, on_ideal) < 1e-5


def test_linear_rope_scaling_interpolates_positions():
    """rope_type "linear" (position interpolation, Chen et al. 2023): position
    p turns each pair as the unscaled RoPE turns position p / factor."""
    theta, factor, dim = 1e4, 4.0, 16
    inv = inverse_frequencies(dim, theta, {"type": "linear", "factor": factor})
    positions = np.arange(0, 64)
    cos, sin = rope_tables(positions, inv)
    angles = (positions[:, None] / factor) * theta ** (-np.arange(0, dim, 2) / dim)[None]
    np.testing.assert_allclose(cos, np.cos(np.concatenate([angles, angles], 1)), atol=2e-6)
    np.testing.assert_allclose(sin, np.sin(np.concatenate([angles, angles], 1)), atol=2e-6)


@pytest.mark.slow
def test_linear_rope_scaling_matches_hugging_face(tmp_path):
    """A Llama-2-style config with linear rope scaling (theta 1e4) against
    transformers' own layer, positions 0..39."""
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = {k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type",
                                                                "torch_dtype")}
    config.update(rope_theta=1e4, rope_scaling={"rope_type": "linear", "factor": 4.0})
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **config, attn_implementation="eager")).float().eval()
    with torch.no_grad():  # sharp attention, so that positions matter
        for name in ("q_proj", "k_proj"):
            getattr(model.model.layers[0].self_attn, name).weight.mul_(6.0)
    model.save_pretrained(tmp_path)
    h = np.random.default_rng(6).standard_normal((1, 40, 64)).astype(np.float32)
    ours = transformer.load(tmp_path).layer(0).reference(h, dtype="float32") - h
    hf = _hf_layer_output(torch, model, 0, h, torch.float32) - h  # what the layer adds
    assert optical.metrics.relative_error(hf, ours) < 1e-4
    # The same weights read without the scaling: the test can tell them apart.
    plain = write_model(tmp_path / "plain", {**TINY_LLAMA, "rope_theta": 1e4, "rope_scaling": None})
    shutil.copy(tmp_path / "model.safetensors", plain)
    unscaled = transformer.load(plain).layer(0).reference(h, dtype="float32") - h
    assert optical.metrics.relative_error(hf, unscaled) > 1e-2
