"""mkdocs hook: render the reStructuredText roles of gleak's docstrings in the API reference.

The docstrings cite code with Sphinx roles (:class:`~gleak.report.model.Report`, :func:`save_truth`,
:meth:`Attack.configure <gleak.attacks.base.Attack.configure>`), which Markdown renders as ``:class:`` followed by
a code span. This hook drops the role and turns the reference into a mkdocs-autorefs cross-reference: a dotted
``gleak.`` path links to its entry in the API reference, a short name links to the one object on the same page
whose path ends with it; anything else stays a plain code span (``optional``: never a warning)."""

from __future__ import annotations

import html
import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|type):<code>(?P<body>.*?)</code>", re.S)
EXPLICIT = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")
HEADING_ID = re.compile(r'id="(gleak\.[\w.]+)"')


def _reference(body: str, ids: list[str]) -> str:
    text = " ".join(html.unescape(body).split())  # a role may wrap onto the docstring's next line
    explicit = EXPLICIT.match(text)
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        target = text.lstrip("~")
        title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
    target = target.rstrip("()")
    if not target.startswith("gleak."):
        matches = [i for i in ids if i.endswith("." + target)]
        if len(matches) != 1:
            return f"<code>{html.escape(title)}</code>"
        target = matches[0]
    return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(title)}</code></autoref>'


def on_page_content(html_text: str, page: Any, **kwargs: Any) -> str:
    if ":<code>" not in html_text:
        return html_text
    ids = sorted(set(HEADING_ID.findall(html_text)))
    return ROLE.sub(lambda m: _reference(m["body"], ids), html_text)
