"""Transformer prefill layers (Llama, BERT) on the optical core."""

from optical.transformer.schedule import layer_schedule
from optical.transformer.spec import LinearShape, ModelSpec, read_spec

__all__ = ["LinearShape", "ModelSpec", "layer_schedule", "read_spec"]
