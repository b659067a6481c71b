"""Model zoo, model loading/saving and last fully-connected layer detection."""

from gleak.models.lastlayer import LastLayer, find_last_layer, guess_last_layer
from gleak.models.loading import (
    LoadedModel,
    arch_input_shape,
    build_arch,
    load_model,
    load_state_dict_strict,
    load_text_model,
    parse_arch_kwargs,
    save_model,
)
from gleak.models.text import TextModelInfo, is_text_model_dir, load_tokenizer, tokenizer_sha256
from gleak.models.zoo import ZOO, ZooEntry, build_zoo_model, zoo_input_shape

__all__ = [
    "ZOO",
    "LastLayer",
    "LoadedModel",
    "TextModelInfo",
    "ZooEntry",
    "arch_input_shape",
    "build_arch",
    "build_zoo_model",
    "find_last_layer",
    "guess_last_layer",
    "is_text_model_dir",
    "load_model",
    "load_state_dict_strict",
    "load_text_model",
    "load_tokenizer",
    "parse_arch_kwargs",
    "save_model",
    "tokenizer_sha256",
    "zoo_input_shape",
]
