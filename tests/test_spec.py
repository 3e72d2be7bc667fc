import re
from pathlib import Path

import pytest

from optical import transformer
from optical.transformer import read_spec
from optical.transformer.spec import ModelSpec

MODELS = Path(__file__).resolve().parent.parent / "models"


@pytest.mark.parametrize(("name", "hidden", "inter", "layers", "heads", "kv", "head_dim"), [
    ("llama-3.2-1b", 2048, 8192, 16, 32, 8, 64),
    ("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128),
    ("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128),
    ("all-minilm-l6-v2", 384, 1536, 6, 12, 12, 32),
])
def test_bundled_models_match_the_published_facts(name, hidden, inter, layers, heads, kv, head_dim):
    spec = read_spec(MODELS / name)
    assert (spec.hidden_size, spec.intermediate_size, spec.num_layers) == (hidden, inter, layers)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (heads, kv, head_dim)


def test_llama_8b_linear_shapes():
    shapes = {s.name: (s.in_features, s.out_features) for s in read_spec(MODELS / "llama-3.1-8b").linear_shapes()}
    assert shapes == {"q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024),
                      "o_proj": (4096, 4096), "gate_proj": (4096, 14336),
                      "up_proj": (4096, 14336), "down_proj": (14336, 4096)}


def test_bad_model_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_spec(tmp_path)
    # A missing directory is named as such (it was "no config.json in model
    # directory ..."), as transformer.load names it.
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such model directory"):
        read_spec(tmp_path / "nowhere")
    # A file given for its directory (config.json, say) is named as a file,
    # with the directory to give: it was "no such model directory".
    (tmp_path / "config.json").write_text("{}")
    for call in (read_spec, transformer.load):
        where = re.escape(str(tmp_path))
        with pytest.raises(FileNotFoundError, match=rf"config.json: a file, not a model "
                                                    rf"directory \(give the directory that "
                                                    rf"holds config.json: {where}\)$"):
            call(tmp_path / "config.json")
    with pytest.raises(TypeError, match=r"^path: expected a model directory \(str or "
                                        r"os.PathLike\), got NoneType$"):
        transformer.load(None)  # was pathlib's message, naming no argument
    for text in ("{not json", "[" * 100_000 + "]" * 100_000,  # (a RecursionError)
                 '{"x": %s}' % ("1" * 5000)):  # (past int()'s 4300 digits: a ValueError)
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match="not valid JSON"):
            read_spec(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="unknown architecture model_type='gpt2'"):
        read_spec(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    with pytest.raises(ValueError, match="missing key 'num_attention_heads'"):
        read_spec(tmp_path)


def test_layer_schedule_counts_weight_and_attention_products():
    import optical
    from optical.transformer import layer_schedule

    spec = read_spec(MODELS / "llama-3.1-8b")
    cfg = optical.presets.get("iris-like")
    sched = layer_schedule(spec, 512, cfg, batch=2)
    assert list(sched) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]
    down = sched["down_proj"]
    assert (down.tokens, down.k_tiles, down.n_tiles) == (1024, 14, 4)
    assert down.weight_loads == 56 and down.macs == 1024 * 14336 * 4096
    assert sum(s.macs for s in sched.values()) == 1024 * spec.linear_macs_per_token()

    optical_attention = layer_schedule(spec, 512, cfg.replace({"mapping.attention": "optical"}))
    scores = optical_attention["attention.scores"]
    # 8 KV heads, each K^T (128 x 512) loaded once; 4 query heads x 512 tokens stream through.
    assert scores.weight_loads == 8 * 1 * 1
    assert scores.macs == 32 * 512 * 128 * 512
    assert optical_attention["attention.values"].macs == 32 * 512 * 512 * 128
    with pytest.raises(ValueError, match="batch"):
        layer_schedule(spec, 512, cfg, batch=0)
    # the prompt length is checked as given, not as batch x tokens rows
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match=f"tokens: {bad!r} must be a positive integer"):
            layer_schedule(spec, bad, cfg, batch=2)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    config = {"model_type": "llama", "hidden_size": 48, "num_attention_heads": 6,
              "num_key_value_heads": 4, "intermediate_size": 64, "num_hidden_layers": 1,
              "vocab_size": 10}
    with pytest.raises(ValueError, match="num_attention_heads 6 is not a multiple of "
                                         "num_key_value_heads 4"):
        ModelSpec.from_config(config)


@pytest.mark.parametrize("kv", ["absent", None])
def test_absent_or_null_kv_heads_mean_one_per_query_head(kv):
    """As Hugging Face's LlamaConfig reads them (checked against it when installed)."""
    config = {"model_type": "llama", "hidden_size": 48, "num_attention_heads": 6,
              "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 10}
    if kv is None:
        config["num_key_value_heads"] = None
    assert ModelSpec.from_config(config).num_kv_heads == 6
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert hf.num_key_value_heads == 6


def test_bert_without_max_position_embeddings_defaults_to_512():
    spec = ModelSpec.from_config({"model_type": "bert", "hidden_size": 48,
                                  "num_attention_heads": 6, "intermediate_size": 64,
                                  "num_hidden_layers": 1, "vocab_size": 10})
    assert spec.max_positions == 512  # HF BertConfig's default
    spec.check_tokens(512)
    with pytest.raises(ValueError, match="tokens: 513 exceed max_position_embeddings 512"):
        spec.check_tokens(513)


@pytest.mark.parametrize("head_dim", [None, 12, 16])
def test_bert_head_size_comes_from_hidden_size_alone(head_dim):
    """Hugging Face's BertSelfAttention ignores a head_dim key (checked against
    it when installed); a hidden size the heads do not divide is refused."""
    config = {"model_type": "bert", "hidden_size": 48, "num_attention_heads": 4,
              "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 10}
    if head_dim is not None:
        config["head_dim"] = head_dim
    spec = ModelSpec.from_config(config)
    assert spec.head_dim == 12
    assert {s.name: s.out_features for s in spec.linear_shapes()}["query"] == 48
    with pytest.raises(ValueError, match="hidden_size 50 is not divisible by "
                                         "num_attention_heads 4"):
        ModelSpec.from_config({**config, "hidden_size": 50})
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(**{k: v for k, v in config.items()
                                           if k != "model_type"})
    hf = transformers.models.bert.modeling_bert.BertSelfAttention(hf_config)
    assert hf.attention_head_size == spec.head_dim


def test_explicit_head_dim_is_honoured():
    spec = ModelSpec.from_config({"model_type": "llama", "hidden_size": 64,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "head_dim": 32, "intermediate_size": 96,
                                  "num_hidden_layers": 1, "vocab_size": 10})
    assert spec.head_dim == 32
    shapes = {s.name: (s.in_features, s.out_features) for s in spec.linear_shapes()}
    assert shapes["q_proj"] == (64, 128) and shapes["k_proj"] == (64, 64)
    assert shapes["o_proj"] == (128, 64)


def test_a_bundled_model_named_from_elsewhere_says_where_they_are(tmp_path, monkeypatch):
    """`--model models/llama-3.1-8b` (README, --help) run outside the source
    checkout (an installed wheel ships no models/): the error says where the
    bundled directories are, not only that this one is missing."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        read_spec("models/llama-3.1-8b")
    assert str(info.value) == (
        f"models/llama-3.1-8b: no such model directory in {tmp_path} (the bundled models/ "
        "directories come with optical's source checkout: run from there, or give a full path)")
    with pytest.raises(FileNotFoundError, match=r"^elsewhere: no such model directory$"):
        read_spec("elsewhere")


def test_spec_is_frozen_through_its_config_and_refuses_an_unknown_architecture():
    """A style audit changed `spec.raw["rms_norm_eps"]` in place and the next
    layer built from the "frozen" spec followed it; two specs of other norm
    epsilons compared equal; `ModelSpec(architecture="mistral", ...)` was
    accepted and counted BERT's six matmuls for it."""
    import json
    import pickle

    spec = read_spec(MODELS / "llama-3.2-1b")
    with pytest.raises(TypeError):
        spec.raw["rms_norm_eps"] = 0.5
    with pytest.raises(TypeError):  # nested objects too
        spec.raw["rope_scaling"]["factor"] = 1.0
    assert spec.raw["rope_scaling"]["factor"] == 32.0
    assert json.loads(json.dumps(spec.raw)) == json.loads(json.dumps(dict(spec.raw)))
    other = ModelSpec.from_config({**dict(spec.raw), "rms_norm_eps": 0.5})
    assert other != spec and hash(ModelSpec.from_config(dict(spec.raw))) == hash(spec)
    assert pickle.loads(pickle.dumps(spec)) == spec
    # equal specs hash alike (the diff review: 10000 and 10000.0 compared equal,
    # and their JSON hashed apart)
    a, b = (ModelSpec.from_config({**dict(spec.raw), "rope_theta": t}) for t in (5e5, 500000))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    fields = {f: getattr(spec, f) for f in ("hidden_size", "intermediate_size", "num_layers",
                                            "num_heads", "num_kv_heads", "head_dim",
                                            "vocab_size")}
    with pytest.raises(ValueError, match="architecture 'mistral' is not supported"):
        ModelSpec(architecture="mistral", raw={}, **fields)
    with pytest.raises(ValueError, match="head_dim must be a positive integer, got 0"):
        ModelSpec(architecture="llama", raw={}, **{**fields, "head_dim": 0})
