"""A federated client simulated on real data, written as a capture and its truth: :mod:`gleak.simulate.images`
(a classifier on image batches; its :class:`~gleak.simulate.images.ClientConfig` is every client's) and
:mod:`gleak.simulate.text` (a language model on token batches, in full or through a LoRA adapter)."""
