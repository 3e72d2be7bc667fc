"""Transformer prefill layers (Llama, BERT) on the optical core.

>>> import optical
>>> from optical import transformer
>>> model = transformer.load("models/llama-3.2-1b")             # doctest: +SKIP
>>> report = transformer.validate(model, layer=0, tokens=64,
...                               config=optical.presets.get("iris-like"))  # doctest: +SKIP
>>> print(report.table())                                       # doctest: +SKIP
"""

from optical.transformer._engines import LayerInputs, LayerTrace
from optical.transformer.bert import BertLayer
from optical.transformer.checkpoint import Checkpoint
from optical.transformer.llama import LlamaLayer
from optical.transformer.model import (
    BertModel,
    LlamaModel,
    load,
    minilm_directory,
    weights_directory,
)
from optical.transformer.schedule import layer_schedule
from optical.transformer.sentence import SentencePipeline
from optical.transformer.spec import LinearShape, ModelSpec, read_spec
from optical.transformer.synthetic import SyntheticLlama
from optical.transformer.validate import ProductReport, ValidationReport, validate

__all__ = [
    "BertLayer",
    "BertModel",
    "Checkpoint",
    "LayerInputs",
    "LayerTrace",
    "LinearShape",
    "LlamaLayer",
    "LlamaModel",
    "ModelSpec",
    "ProductReport",
    "SentencePipeline",
    "SyntheticLlama",
    "ValidationReport",
    "layer_schedule",
    "load",
    "minilm_directory",
    "read_spec",
    "validate",
    "weights_directory",
]
