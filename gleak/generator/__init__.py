"""Feature-to-image generators for the generative attacks (fgla, rgla): the network, its file, its training."""
