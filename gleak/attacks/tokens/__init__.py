"""Token recovery from language-model gradients and updates (docs/methods/tokens.md).

:mod:`.view` describes the model and finds the tensors, :mod:`.bag` holds the maths, :mod:`.attacks` the
registered attacks (imported by :mod:`gleak.attacks`, not here: the context imports :mod:`.view`)."""
