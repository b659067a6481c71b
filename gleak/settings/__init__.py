"""gleak's settings, each declared once (:mod:`gleak.settings.audit`), with the values they take
(:mod:`gleak.settings.values`), how they are read and explained (:mod:`gleak.settings.declare`) and the config files
that may hold them (:mod:`gleak.settings.files`). This package sits in the bottom layer: it imports nothing from the
report, the runs or the command line."""

from gleak.settings.audit import AuditSettings, GlobalSettings
from gleak.settings.declare import Cli, Given, Resolved, Source, resolve, settings_table
from gleak.settings.files import LoadedConfig, find_config, load_config
from gleak.settings.values import Thresholds, parse_thresholds

__all__ = ["AuditSettings", "Cli", "Given", "GlobalSettings", "LoadedConfig", "Resolved", "Source", "Thresholds",
           "find_config", "load_config", "parse_thresholds", "resolve", "settings_table"]
