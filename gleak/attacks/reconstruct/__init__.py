"""Reconstruction attacks: gradient matching (dlg, ig, feature) and the analytic FCN inversion (fcn)."""

from gleak.attacks.reconstruct import dlg, fcn, feature, ig  # noqa: F401  (registers the attacks)
