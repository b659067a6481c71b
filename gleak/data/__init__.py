"""Data a simulated client trains on and the attacks' auxiliary data: :mod:`gleak.data.images` (safetensors tensor
files and image folders of a classifier) and :mod:`gleak.data.text` (text lines for a language model, tokenised
and checked against the model). The image API is re-exported here."""

from gleak.data.images import IMAGE_SUFFIXES, Dataset, load_dataset, save_dataset

__all__ = ["IMAGE_SUFFIXES", "Dataset", "load_dataset", "save_dataset"]
