"""Sentence reconstruction from language-model gradients and updates (docs/methods/text.md): :mod:`.dager` holds the
maths of DAGER (Petrov et al., NeurIPS 2024); the registered attacks live in :mod:`.attacks`."""
