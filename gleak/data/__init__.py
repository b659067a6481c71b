"""Data a simulated client trains on and the attacks' auxiliary data: :mod:`gleak.data.images` (safetensors tensor
files and image folders of a classifier) and :mod:`gleak.data.text` (text lines for a language model, tokenised
and checked against the model). Import from the module you need: the text one does not load the image stack."""
