"""Model zoo, model loading/saving and last fully-connected layer detection."""

from gleak.models.lastlayer import LastLayer, find_last_layer, guess_last_layer
from gleak.models.loading import (
    LoadedModel,
    arch_input_shape,
    build_arch,
    load_model,
    load_state_dict_strict,
    parse_arch_kwargs,
    save_model,
)
from gleak.models.zoo import ZOO, ZooEntry, build_zoo_model, zoo_input_shape

__all__ = [
    "ZOO",
    "LastLayer",
    "LoadedModel",
    "ZooEntry",
    "arch_input_shape",
    "build_arch",
    "build_zoo_model",
    "find_last_layer",
    "guess_last_layer",
    "load_model",
    "load_state_dict_strict",
    "parse_arch_kwargs",
    "save_model",
    "zoo_input_shape",
]
