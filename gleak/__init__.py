"""gleak: measure what federated-learning gradients and updates leak about their training data."""

__version__ = "0.1.0"
