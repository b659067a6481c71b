"""Defenses: transforms of a contribution (noise, clipping, compression, quantization, sign) and DP-SGD at training
time, one class each in one registry (:data:`DEFENSES`), specified as ``NAME[:KEY=VALUE,...]``."""

from gleak.defenses import dpsgd, transforms  # noqa: F401  (registers the defenses)
from gleak.defenses.apply import apply_defenses, contribution_distortion, rebuild_defenses, recorded_defenses
from gleak.defenses.base import DEFENSES, ContributionOptions, Defense, DefenseOptions
from gleak.defenses.spec import build_defense, parse_defense, split_spec

__all__ = ["DEFENSES", "ContributionOptions", "Defense", "DefenseOptions", "apply_defenses", "build_defense",
           "contribution_distortion", "parse_defense", "rebuild_defenses", "recorded_defenses", "split_spec"]
