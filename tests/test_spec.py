from pathlib import Path

import pytest

from optical.transformer import read_spec

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
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_spec(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="unknown architecture model_type='gpt2'"):
        read_spec(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    with pytest.raises(ValueError, match="missing key 'num_attention_heads'"):
        read_spec(tmp_path)
