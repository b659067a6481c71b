"""``python -m gleak.settings``: the option table of docs/audit.md, from the declarations."""

from gleak.settings import AuditSettings, GlobalSettings, settings_table

print(settings_table(GlobalSettings, AuditSettings), end="")
