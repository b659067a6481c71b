"""Reconstruction attacks: gradient matching (dlg, ig, feature), the analytic FCN inversion (fcn) and the
generative attacks (fgla, rgla)."""

from gleak.attacks.reconstruct import dlg, fcn, feature, fgla, ig, malicious, rgla  # noqa: F401  (registers the attacks)
