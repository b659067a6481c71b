"""mkdocs hook: the option tables made from the settings' declarations (gleak/settings/audit.py).

A page writes ``<!-- settings-table -->`` where the table goes; the built site shows the flags, variables, config
keys, defaults and help of every audit setting, made from the declarations when the site is built, so adding a
setting needs no edit here (``python -m gleak.settings`` prints the same table)."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- settings-table -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from gleak.settings import AuditSettings, GlobalSettings, settings_table

    return markdown.replace(MARKER, settings_table(GlobalSettings, AuditSettings))
