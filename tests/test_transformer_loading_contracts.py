"""Documented contracts of model loading, config checks and the references'
numerics that the other transformer tests left open (found by a mutation audit)."""

import json

import numpy as np
import pytest

from optical import transformer
from optical.transformer import Checkpoint, read_spec
from optical.transformer.spec import ModelSpec
from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

SMALL = {"model_type": "llama", "hidden_size": 48, "num_attention_heads": 6,
         "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 10}


# --------------------------------------------------------------------------- #
# checkpoint files
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize(("seed", "error", "message"), [
    (-1, ValueError, r"seed: -1 is out of range; valid: integer in \[0, 2\*\*64\)"),
    (2**64, ValueError, "seed: 18446744073709551616 is out of range"),
    (True, TypeError, "seed: expected a non-negative integer, got bool"),
    (1.5, TypeError, "seed: expected a non-negative integer, got float"),
])
def test_load_refuses_a_seed_that_is_not_a_non_negative_integer(tmp_path, seed, error, message):
    with pytest.raises(error, match=message):
        transformer.load(write_model(tmp_path, TINY_LLAMA), seed=seed)


def test_llama_hidden_states_refuse_more_tokens_than_positions(tmp_path):
    model = transformer.load(write_model(tmp_path, {**TINY_LLAMA,
                                                    "max_position_embeddings": 16}))
    assert model.hidden_states(0, 16).shape == (16, TINY_LLAMA["hidden_size"])
    with pytest.raises(ValueError, match="tokens: 17 exceed max_position_embeddings 16"):
        model.hidden_states(0, 17)


def test_pt_pickles_without_safetensors_are_refused(tmp_path):
    """find_checkpoint_files' contract names both pickle suffixes (*.bin, *.pt):
    a directory holding only a .pt checkpoint is refused, not silently run on
    synthetic weights."""
    directory = write_model(tmp_path, TINY_LLAMA)
    (directory / "consolidated.00.pt").write_bytes(b"not read")
    with pytest.raises(ValueError, match=r"consolidated\.00\.pt but no \*\.safetensors"):
        transformer.load(directory)


def test_checkpoint_names_are_sorted(tmp_path):
    """Checkpoint.names(): "Every tensor name, sorted" (the files list them in
    their own order: a sharded index in the order written here)."""
    pytest.importorskip("safetensors")
    save_file = pytest.importorskip("safetensors.numpy").save_file
    t = np.zeros(2, np.float32)
    save_file({"z": t, "m": t}, str(tmp_path / "model-1.safetensors"))
    save_file({"b": t, "a": t}, str(tmp_path / "model-2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "z": "model-1.safetensors", "b": "model-2.safetensors",
        "m": "model-1.safetensors", "a": "model-2.safetensors"}}))
    assert Checkpoint(tmp_path).names() == ["a", "b", "m", "z"]
    (tmp_path / "model.safetensors.index.json").unlink()
    assert Checkpoint(tmp_path).names() == ["a", "b", "m", "z"]


def test_a_tensor_gone_from_its_shard_after_load_is_named_missing(tmp_path):
    """A shard rewritten after load() without a tensor the index lists: read()
    says the tensor is missing from that file (a readable file, not damage)."""
    pytest.importorskip("safetensors")
    save_file = pytest.importorskip("safetensors.numpy").save_file
    tensors = random_llama_tensors(TINY_LLAMA, seed=5)
    directory = write_model(tmp_path, TINY_LLAMA, tensors)
    model = transformer.load(directory)
    name = "model.layers.0.mlp.up_proj.weight"
    save_file({n: v for n, v in tensors.items() if n != name},
              str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"tensor '{name}' is missing from .*model\.safetensors "
                                         r"\(the index lists it there\)") as err:
        model.layer(0)
    assert "not a readable" not in str(err.value)


# --------------------------------------------------------------------------- #
# config.json checks
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "intermediate_size",
                                 "vocab_size", "num_attention_heads"])
@pytest.mark.parametrize("value", [0, -2, True, 1.0])
def test_sizes_must_be_positive_integers_not_zero_or_bools(key, value):
    """from_config's need(): a positive integer; 0, negatives, bools (True is
    an int in Python) and floats are refused, naming the key."""
    with pytest.raises(ValueError, match=rf"key '{key}' must be a positive integer, "
                                         rf"got {value!r}"):
        ModelSpec.from_config({**SMALL, key: value})


@pytest.mark.parametrize("text", ["[1, 2]", '"llama"', "3", "null"])
def test_a_config_that_is_not_a_json_object_is_named(tmp_path, text):
    """read_spec raises ValueError (documented) for JSON that is not an object,
    not an AttributeError from deep inside."""
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_spec(tmp_path)


# --------------------------------------------------------------------------- #
# layers: index checks, shapes, eager name checks
# --------------------------------------------------------------------------- #

def _tiny_llama(tmp_path, tensors=None):
    return transformer.load(write_model(tmp_path, TINY_LLAMA, tensors))


@pytest.mark.parametrize("bad", [-1, -3])
def test_negative_layer_indices_are_out_of_range(tmp_path, bad):
    """Layers are numbered 0..num_layers-1; a negative index is not Python's
    from-the-end indexing (it would reach the synthetic weights' derivation)."""
    model = _tiny_llama(tmp_path)
    with pytest.raises(ValueError, match=rf"layer: {bad} is out of range; {model.name} has 3 "
                                         r"layers \(0\.\.2\)"):  # named, as the sweep's
        model.layer(bad)
    with pytest.raises(ValueError, match=rf"layer: {bad} is out of range"):
        model.hidden_states(bad, 4)


def test_a_bool_layer_index_is_refused_and_numpy_integers_are_taken(tmp_path):
    model = _tiny_llama(tmp_path)
    with pytest.raises(TypeError, match="layer: expected an integer, got bool"):
        model.layer(True)
    with pytest.raises(TypeError, match="layer: expected an integer, got float"):
        model.layer(1.0)
    layer = model.layer(np.int64(2))
    assert layer.index == 2 and type(layer.index) is int
    np.testing.assert_array_equal(model.hidden_states(np.int32(1), 4), model.hidden_states(1, 4))


def test_a_norm_weight_of_the_wrong_shape_is_named(tmp_path):
    """Every tensor a layer reads is checked against the shape config.json
    implies, the RMSNorm gains (hidden_size,) included."""
    pytest.importorskip("safetensors")
    tensors = random_llama_tensors(TINY_LLAMA, seed=6)
    name = "model.layers.1.post_attention_layernorm.weight"
    tensors[name] = tensors[name][:-1]
    model = _tiny_llama(tmp_path, tensors)
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \(63,\) .*config\.json "
                                         r"\(hidden_size 64.* implies \(64,\)"):
        model.layer(1)


def test_a_bert_encoder_tensor_missing_from_the_checkpoint_is_named_at_load(tmp_path):
    """As for Llama: load() names a tensor the config implies but the
    checkpoint lacks, before any layer is needed (not at the first encode)."""
    pytest.importorskip("safetensors")
    from tests.test_transformer_bert import _bert_tensors
    from tests.transformer_helpers import TINY_BERT

    tensors = _bert_tensors(TINY_BERT)
    name = "encoder.layer.1.output.LayerNorm.bias"
    del tensors[name]
    with pytest.raises(ValueError, match=rf"tensor '{name}' is missing from the checkpoint"):
        transformer.load(write_model(tmp_path, TINY_BERT, tensors))


def test_a_bert_bias_of_the_wrong_shape_is_named(tmp_path):
    pytest.importorskip("safetensors")
    from tests.test_transformer_bert import _bert_tensors
    from tests.transformer_helpers import TINY_BERT

    tensors = _bert_tensors(TINY_BERT)
    name = "encoder.layer.0.intermediate.dense.bias"
    tensors[name] = tensors[name][:-1]
    model = transformer.load(write_model(tmp_path, TINY_BERT, tensors))
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \(95,\) .*implies \(96,\)"):
        model.layer(0)


def test_bert_hidden_states_are_the_input_of_the_layer_asked_for(tmp_path, monkeypatch):
    """BertModel.hidden_states(layer): the embeddings of its token ids run
    through the layers before ``layer`` (checked here against the layers'
    reference forward, applied one by one to the embeddings)."""
    from optical.transformer import bert
    from optical.transformer._engines import ReferenceEngine
    from tests.transformer_helpers import TINY_BERT

    model = transformer.load(write_model(tmp_path, TINY_BERT))
    seen = []
    encode = type(model).encode

    def spy(self, ids, *args, **kwargs):
        seen.append(np.array(ids))
        return encode(self, ids, *args, **kwargs)

    monkeypatch.setattr(type(model), "encode", spy)
    for index in (0, 1):
        seen.clear()
        h = model.hidden_states(index, 5, seed=3)
        (ids,) = seen
        assert ids.shape == (1, 5)
        expected = bert.embeddings(ids, model.embedding_tables(), model.eps,
                                   ReferenceEngine("float32"))
        for earlier in range(index):
            expected = model.layer(earlier).forward(expected, np.ones(ids.shape, bool),
                                                    ReferenceEngine("float32"))
        np.testing.assert_array_equal(h, expected[0])


# --------------------------------------------------------------------------- #
# RoPE settings
# --------------------------------------------------------------------------- #

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def _plain_inv_freq64(head_dim, theta):
    return theta ** (-np.arange(0, head_dim, 2) / head_dim)


def test_rope_parameters_without_rope_theta_take_the_top_level_one():
    """A transformers >= 5 ``rope_parameters`` object without ``rope_theta``
    next to a top-level ``rope_theta``: Hugging Face's config moves the
    top-level value in (checked against LlamaConfig when installed)."""
    from optical.transformer.rope import rope_settings

    config = {"rope_theta": 123.0, "rope_parameters": {"rope_type": "default"}}
    assert rope_settings(config)[0] == 123.0
    assert rope_settings({"rope_parameters": {"rope_type": "default"}})[0] == 10000.0
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig.from_dict(json.loads(json.dumps({**SMALL, **config})))
    if getattr(hf, "rope_parameters", None) is not None:
        assert hf.rope_parameters["rope_theta"] == 123.0


def test_legacy_type_key_selects_llama3_scaling():
    """Older configs name the rope type ``"type"`` (Hugging Face reads it as
    ``rope_type``): the llama3 frequencies, Meta's apply_scaling, follow."""
    from optical.transformer.rope import inverse_frequencies
    from tests.transformer_helpers import llama3_inv_freq64

    ours = inverse_frequencies(64, 500000.0, {**LLAMA3, "type": "llama3"})
    np.testing.assert_allclose(ours, llama3_inv_freq64(64, 500000.0, LLAMA3), rtol=2e-6)
    assert not np.allclose(ours, _plain_inv_freq64(64, 500000.0), rtol=1e-3)


@pytest.mark.parametrize("scaling", [{"rope_type": "default"}, {"type": "default"},
                                     {"rope_type": "default", "rope_theta": 10000.0}])
def test_rope_type_default_is_unscaled(scaling):
    """``rope_scaling: {"rope_type": "default"}`` (what transformers writes for
    an unscaled model) is supported and means theta ** (-2i / d)."""
    from optical.transformer.rope import inverse_frequencies

    np.testing.assert_allclose(inverse_frequencies(16, 10000.0, scaling),
                               _plain_inv_freq64(16, 10000.0), rtol=2e-6)


@pytest.mark.parametrize("high", [1.0, 0.5])
def test_llama3_high_freq_factor_must_exceed_low(high):
    """The blend divides by high - low: equal (or inverted) factors are refused
    with the key named, not turned into NaN or misordered bands."""
    from optical.transformer.rope import inverse_frequencies

    with pytest.raises(ValueError, match=rf"rope_scaling.high_freq_factor: {high} must exceed "
                                         r"low_freq_factor 1.0"):
        inverse_frequencies(16, 500000.0, {**LLAMA3, "rope_type": "llama3",
                                           "high_freq_factor": high})


def test_apply_rope_rotates_each_pair_of_dimensions_by_its_angle():
    """Rotate-half pairing, as Hugging Face checkpoints use it: dimensions i
    and i + d/2 form a pair turned by the angle position x inv_freq[i],
    counter-clockwise (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos + x_i sin);
    the public function without ``rnd`` and with an identity rounding alike,
    against that rotation in float64."""
    from optical.transformer.rope import apply_rope, inverse_frequencies, rope_tables

    head_dim, tokens = 16, 5
    inv_freq = inverse_frequencies(head_dim, 10000.0)
    cos, sin = rope_tables(np.arange(tokens), inv_freq)
    x = np.random.default_rng(3).standard_normal((2, tokens, head_dim)).astype(np.float32)
    half = head_dim // 2
    angle = np.arange(tokens)[:, None] * inv_freq.astype(np.float64)[None, :]
    first, second = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    expected = np.concatenate([first * np.cos(angle) - second * np.sin(angle),
                               second * np.cos(angle) + first * np.sin(angle)], axis=-1)
    for rotated in (apply_rope(x, cos, sin), apply_rope(x, cos, sin, rnd=lambda a: a)):
        np.testing.assert_allclose(rotated, expected, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(apply_rope(x, cos, sin)[:, 0], x[:, 0])  # position 0


@pytest.mark.parametrize("head_dim", [15, 1])
def test_odd_head_dim_is_refused_for_rope(head_dim):
    from optical.transformer.rope import inverse_frequencies

    with pytest.raises(ValueError, match=rf"head_dim: {head_dim} must be even"):
        inverse_frequencies(head_dim, 10000.0)


# --------------------------------------------------------------------------- #
# rounding
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("size", [8, 1 << 15])  # numpy's path and the kernels'
def test_bfloat16_rounding_keeps_every_nan_a_nan(size):
    """NaNs whose payload would carry into the sign or exponent when rounded
    (0x7FFFFFFF would become -0.0, the signalling 0x7F800001 infinity) stay
    NaN, as ml_dtypes' cast keeps them."""
    from optical.transformer.numerics import round_to

    payloads = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7FC00000,
                         0x7FBFFFFF], np.uint32)
    x = np.resize(payloads, size).view(np.float32)
    assert np.isnan(x).all()
    assert np.isnan(round_to(x, "bfloat16")).all()
    half = round_to(x.copy(), "float16")
    assert np.isnan(half).all()
    # the kernels' path gives numpy's bits, NaN payloads included
    with np.errstate(invalid="ignore"):
        numpy_half = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(half.view(np.uint32), numpy_half.view(np.uint32))


def test_float32_rounding_into_a_buffer_copies_x_there():
    """round_to(x, "float32", out=buf): x itself rounded (unchanged), written
    into buf, and buf returned (as for the half types)."""
    from optical.transformer.numerics import round_to

    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    buf = np.full_like(x, np.nan)
    assert round_to(x, "float32", out=buf) is buf
    np.testing.assert_array_equal(buf, x)
    assert round_to(x, "float32", out=x) is x


def test_rope_parameters_next_to_an_agreeing_rope_scaling_are_taken():
    """Both RoPE keys are taken when they agree (the legacy "type" name for
    the rope type included); transformers >= 5 then reads rope_scaling, with
    the top-level rope_theta. A rope_scaling giving fewer fields, or a
    rope_theta only inside rope_parameters, is refused: every transformers
    version reads rope_scaling alone, and the top-level theta (10000 when
    absent). The other disagreeing cases: test_transformer_checkpoint."""
    from optical.transformer.rope import rope_settings

    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    params = {**llama3, "rope_type": "llama3", "rope_theta": 5e5}
    for legacy in ({**llama3, "rope_type": "llama3"}, {**llama3, "type": "llama3"},
                   {**llama3, "type": "llama3", "rope_theta": 5e5}):
        config = {"rope_parameters": params, "rope_scaling": legacy, "rope_theta": 5e5}
        assert rope_settings(config) == (5e5, legacy, "rope_scaling")
    with pytest.raises(ValueError, match="rope_parameters reads rope_theta 500000.0; "
                                         "transformers >= 5 reads rope_theta 10000.0"):
        rope_settings({"rope_parameters": params, "rope_scaling": {**llama3, "type": "llama3"}})
    with pytest.raises(ValueError, match="rope_parameters reads low_freq_factor 1.0, "
                                         "high_freq_factor 4.0, original_max_position_"
                                         "embeddings 8192; transformers >= 5 reads "
                                         "low_freq_factor None"):
        rope_settings({"rope_parameters": params, "rope_scaling": {"type": "llama3",
                                                                    "factor": 8.0},
                       "rope_theta": 5e5})
    with pytest.raises(ValueError, match="rope_parameters.rope_type = 'llama3' but "
                                         "rope_scaling.rope_type = 'default'"):
        rope_settings({"rope_parameters": params, "rope_scaling": {"factor": 8.0}})
    # A null rope_scaling agrees with an unscaled rope_parameters only; equal
    # thetas under both keys agree, whatever their spelling.
    unscaled = {"rope_type": "default", "rope_theta": 5e5}
    assert rope_settings({"rope_parameters": unscaled, "rope_scaling": None,
                          "rope_theta": 500000})[:2] == (5e5, unscaled)
    assert rope_settings({"rope_parameters": params, "rope_theta": 5e5})[0] == 5e5


def _hf_config(transformers, config):
    """transformers' LlamaConfig of ``config`` (a copy: it fills in the
    RoPE objects it is given)."""
    return transformers.LlamaConfig.from_dict(json.loads(json.dumps(config)))


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("rope", [
    {"rope_theta": 5e5, "rope_scaling": _LLAMA3},
    {"rope_parameters": {**_LLAMA3, "rope_theta": 5e5}},
    {"rope_parameters": {"rope_type": "linear", "factor": 4.0}, "rope_theta": 5e5},
    {"rope_scaling": {"type": "linear", "factor": 4.0, "rope_theta": 5e5}, "rope_theta": 5e5},
    {"rope_parameters": {**_LLAMA3, "rope_theta": 5e5}, "rope_scaling": _LLAMA3,
     "rope_theta": 5e5},
    {"rope_scaling": _LLAMA3, "rope_theta": 5e5, "original_max_position_embeddings": 16},
    {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, "rope_theta": 5e5},
    {"rope_parameters": {"type": "dynamic", "factor": 2.0, "rope_theta": 5e5}},
])
def test_rope_settings_taken_are_transformers_own(rope):
    """Configs every reading agrees on: the inverse frequencies are those
    transformers' LlamaRotaryEmbedding computes from the same config.json."""
    from optical.transformer.rope import inverse_frequencies, rope_settings

    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = {**SMALL, "max_position_embeddings": 64, **rope}
    ours = inverse_frequencies(8, *rope_settings(config)[:2])
    theirs = LlamaRotaryEmbedding(_hf_config(transformers, config)).inv_freq
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)



def test_dynamic_scaling_is_transformers_rotation_at_every_position_allowed():
    """A backlog item (the families audit, ten stops back): "dynamic" NTK
    scaling was refused, though transformers rotates as the default does for
    every position below max_position_embeddings, the longest prompt a
    model's config allows here. The cos/sin tables of a whole prompt of that
    length are transformers' own, bit for bit (its forward's dynamic update
    included), and one token longer is refused."""
    import torch

    from optical import transformer
    from optical.transformer.rope import inverse_frequencies, rope_settings, rope_tables

    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = {**SMALL, "max_position_embeddings": 64, "rope_theta": 5e5,
              "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    positions = np.arange(64)
    cos, sin = rope_tables(positions, inverse_frequencies(8, *rope_settings(config)[:2]))
    rotary = LlamaRotaryEmbedding(_hf_config(transformers, config))
    theirs = rotary(torch.zeros(1, 64, 8), torch.from_numpy(positions)[None])
    # The frequencies its forward used, bit for bit; the tables to numpy's and
    # torch's cos and sin (an ulp apart in a few, as for any rope type).
    np.testing.assert_array_equal(inverse_frequencies(8, *rope_settings(config)[:2]),
                                  rotary.inv_freq.numpy())
    np.testing.assert_array_max_ulp(cos, theirs[0][0].numpy(), maxulp=2)
    np.testing.assert_array_max_ulp(sin, theirs[1][0].numpy(), maxulp=2)
    # (Past the limit transformers' rotation is another: the prompt is refused.)
    longer = rotary(torch.zeros(1, 65, 8), torch.arange(65)[None])[0][0].numpy()
    assert not np.allclose(longer[:64], cos, atol=1e-3)
    spec = transformer.ModelSpec.from_config(config)
    with pytest.raises(ValueError, match="65 exceed max_position_embeddings 64"):
        spec.check_tokens(65)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("scaling", [None, _LLAMA3 | {"original_max_position_embeddings": 8192},
                                     {"rope_type": "linear", "factor": 4.0}])
def test_inverse_frequencies_are_transformers_own_bits(head_dim, scaling):
    """Llama-3's head sizes and theta: the frequencies are bit for bit
    transformers'. numpy's float32 power (up to 0.9 ulp off) and divisions
    where torch multiplies by a reciprocal made 13 of 64 differ by 1-2 ulp,
    an angle error growing with the position (5e-4 rad at 8k tokens: the
    reference drifted from LlamaDecoderLayer to 4.5e-5 along an 8k prompt)."""
    from optical.transformer.rope import inverse_frequencies

    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = {**SMALL, "hidden_size": 2 * head_dim, "num_attention_heads": 2,
              "head_dim": head_dim, "rope_theta": 5e5, "max_position_embeddings": 131072}
    if scaling is not None:
        config["rope_scaling"] = scaling
    theirs = LlamaRotaryEmbedding(_hf_config(transformers, config)).inv_freq.numpy()
    np.testing.assert_array_equal(inverse_frequencies(head_dim, 5e5, scaling), theirs)
    # Other thetas (CodeLlama's 1e6, Yi's 5e6): torch's float32 power misses
    # the correctly rounded value in a rare frequency; an ulp at most (review).
    for theta in (1e6, 5e6):
        theirs = LlamaRotaryEmbedding(_hf_config(transformers, {**config, "rope_theta": theta}))
        np.testing.assert_array_max_ulp(inverse_frequencies(head_dim, theta, scaling),
                                        theirs.inv_freq.numpy(), maxulp=1)

@pytest.mark.parametrize(("rope", "other"), [
    # rope_theta only inside rope_parameters, beside a rope_scaling:
    # transformers >= 5 reads rope_scaling, with the default theta.
    ({"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
      "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, (5e5, {"rope_type": "linear",
                                                                       "factor": 4.0})),
    ({"rope_parameters": {**_LLAMA3, "rope_theta": 5e5}, "rope_scaling": _LLAMA3},
     (5e5, _LLAMA3)),
    # rope_theta inside rope_scaling: transformers >= 5 reads it, < 5 the top level's.
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}},
     (1e4, {"rope_type": "linear", "factor": 4.0})),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
      "rope_theta": 1e4}, (1e4, {"rope_type": "linear", "factor": 4.0})),
    ({"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
      "rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}},
     (1e4, {"rope_type": "linear", "factor": 4.0})),
    # A top-level original_max_position_embeddings: transformers >= 5 reads it
    # in place of the scaling's.
    ({"rope_scaling": _LLAMA3, "rope_theta": 5e5, "original_max_position_embeddings": 4},
     (5e5, _LLAMA3)),
    ({"rope_parameters": {**_LLAMA3, "rope_theta": 5e5}, "original_max_position_embeddings": 4},
     (5e5, _LLAMA3)),
])
def test_rope_settings_read_two_ways_are_refused(rope, other):
    """Configs transformers versions (or the config's own two RoPE keys) read
    as different rotations are refused, naming what differs; the rotation
    transformers >= 5 computes differs from the other reading's (so either
    answer would have been wrong for someone)."""
    from optical.transformer.rope import inverse_frequencies, rope_settings

    config = {**SMALL, "max_position_embeddings": 64, **rope}
    with pytest.raises(ValueError, match="read differently|original_max_position_embeddings = "
                                         "4 but"):
        rope_settings(config)
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    theirs = LlamaRotaryEmbedding(_hf_config(transformers, config)).inv_freq.numpy()
    assert not np.allclose(inverse_frequencies(8, *other), theirs, rtol=1e-3)


def test_a_bert_tensor_a_sharded_index_leaves_out_is_named_with_the_index(tmp_path):
    """As for Llama: a sharded checkpoint is read through its index, so a
    tensor a shard holds but the index omits is named with the index, not
    called missing from the checkpoint (which holds it)."""
    pytest.importorskip("safetensors")
    from tests.test_transformer_bert import _bert_tensors
    from tests.transformer_helpers import TINY_BERT, drop_from_index

    directory = write_model(tmp_path, TINY_BERT, _bert_tensors(TINY_BERT), shards=2)
    name = "encoder.layer.1.output.dense.bias"
    drop_from_index(directory, name)
    with pytest.raises(ValueError, match=rf"^tensor '{name}' is not listed in .*"
                                         r"model\.safetensors\.index\.json$"):
        transformer.load(directory)


@pytest.mark.parametrize("real", [False, True], ids=["synthetic", "checkpoint"])
def test_a_pickled_model_leaves_its_cached_layer_behind(tmp_path, real):
    """A model sent to a worker (pickled) carried its cached layer: 1 kB
    became 243 MB for Llama-3.2-1B after model.layer(0). Without it, the
    copy rebuilds the same bits."""
    import copy
    import pickle

    tensors = random_llama_tensors(TINY_LLAMA) if real else None
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, tensors))
    fresh = len(pickle.dumps(model))
    weights = model.layer(1).weights
    assert sum(w.nbytes for w in weights.values()) > 10 * fresh  # what it would carry
    for again in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert len(pickle.dumps(again)) == fresh
        assert again.layer(1).weights.keys() == weights.keys()
        for name, w in again.layer(1).weights.items():
            np.testing.assert_array_equal(w, weights[name])
    assert model.layer(1).weights is weights  # the original keeps its cache


def test_a_pickled_bert_model_leaves_its_embedding_tables_behind(tmp_path):
    import pickle

    from tests.transformer_helpers import TINY_BERT

    model = transformer.load(write_model(tmp_path, TINY_BERT))
    fresh = len(pickle.dumps(model))
    tables = model.embedding_tables()
    again = pickle.loads(pickle.dumps(model))
    assert len(pickle.dumps(model)) == fresh
    for name, table in again.embedding_tables().items():
        np.testing.assert_array_equal(table, tables[name])
