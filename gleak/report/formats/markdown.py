"""``report.md``: a short Markdown summary for pull-request comments and ``$GITHUB_STEP_SUMMARY``.

A verdict line, the findings, the run view (when captures record rounds or clients: the gate, the plots beside
the report, one row per round and the worst clients), one row per capture and the notices. Every string
from the report goes through :func:`md_escape`, so a capture named ``[x](http://evil)`` or holding ``<script>``
shows as text.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from pathlib import Path

from gleak.report.model import AttackEntry, CaptureReport, Report, RoundSummary, RunPrivacy, RunView, severity_rank
from gleak.report.plots import plotted_series
from gleak.report.run_view import clear_text, gate_text
from gleak.report.verdict import grouped_notices, has_run, notice_text, verdict

MAX_ROUND_ROWS = 50  # longer runs: the first and the last rounds, an ellipsis row between
MAX_CLIENT_ROWS = 10  # the worst clients
NAME = "md"
FILENAME = "report.md"

# Markdown (CommonMark + GFM: tables, strikethrough, autolinks, math) metacharacters, backslash-escaped.
# ':' and '@' break GFM's bare-URL and e-mail autolinks, '$' GitHub's math, '~' strikethrough.
_BACKSLASHED = set("\\`*_{}[]()#+-.!|~:@$")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}  # entities, not backslashes: raw HTML can never form


def md_escape(text: object) -> str:
    """``text`` as literal Markdown inline text: metacharacters backslash-escaped, ``& < >`` as HTML entities
    (so no raw HTML renders), newlines and other control characters as spaces (a table cell stays one line)."""
    out: list[str] = []
    for ch in str(text):
        if ch in _HTML:
            out.append(_HTML[ch])
        elif ch in _BACKSLASHED:
            out.append("\\" + ch)
        elif ch in "\r\n\t\v\f" or (ord(ch) < 32 or ord(ch) == 127):
            out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _best_label_attack(capture: CaptureReport) -> AttackEntry | None:
    """The label attack with the highest iAcc (when scored), else the first one that ran."""
    ran = [a for a in capture.attacks if a.task == "labels" and a.status == "ok"]
    return capture.best_label() or (ran[0] if ran else None)


def _images(capture: CaptureReport) -> str:
    """'ig: 7 of 8 identified (chance 0.10), 9.81 dB', the expectation without truth, the PSNR range of
    reconstructions scored without a lineup (worst / best), or a dash."""
    for a in capture.attacks:
        ident = a.identification
        if a.task == "reconstruct" and a.status == "ok" and ident:
            psnr = (a.scores or {}).get("psnr")
            shown = f", {psnr:.2f} dB" if psnr is not None and math.isfinite(psnr) else ""
            return (f"{md_escape(a.attack)}: {ident['identified']:g} of {ident['n']} identified "
                    f"(chance {ident['chance']:.2f}){shown}")
    exp = capture.expected_images
    if exp:
        return f"{md_escape(exp['attack'])}: expected {exp['rate']:.2f} identified (chance {exp['chance']:.2f})"
    values = [a.scores["psnr"] for a in capture.attacks  # scored without a lineup: the PSNR range
              if a.task == "reconstruct" and a.status == "ok" and a.scores and a.scores.get("psnr") is not None]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return f"{min(finite):.2f} / {max(finite):.2f} dB" if finite else "—"


def _capture_row(capture: CaptureReport) -> str:
    name = md_escape(capture.capture.path)
    if capture.status == "error":
        return f"| {name} | error: {md_escape(capture.error or 'unknown')} | — | — | — | — |"
    if capture.tokens is not None:
        return _token_row(name, capture)
    best = _best_label_attack(capture)
    iacc = (best.scores or {}).get("iacc") if best else None
    chance = (capture.chance or {}).get("iacc")
    margin = "—"
    if iacc is not None and chance is not None:
        margin = f"{iacc - chance:+.3f}"
    attack = md_escape(best.attack) if best else "—"
    return f"| {name} | ok | {attack} | {_num(iacc)} | {margin} | {_images(capture)} |"


def _point(r: RoundSummary, name: str) -> str:
    point = r.series.get(name)
    if point is None:
        return "—"
    chance = f" ({_num(point.chance)})" if point.chance is not None else ""
    return f"{_num(point.max)} / {_num(point.median)}{chance}"


def run_section(report: Report, view: RunView) -> list[str]:
    """The per-round summary: the gate, the plots (PNG beside the report), rounds and worst clients."""
    names = [s.name for s in view.series]
    clear = clear_text(view, report.fail_on)
    lines = ["### Leakage over rounds", "",
             f"Gate: {gate_text(report)}" + (f"; {clear}" if clear else "") + ". Per round: max / median over its "
             "captures (chance in brackets).", ""]
    lines += [f"![{md_escape(s.title)}]({name})" for s, name in zip(plotted_series(view), view.plots, strict=False)]
    if view.plots:
        lines.append("")
    lines += ["| Round | Captures | Clients | Worst | " + " | ".join(md_escape(n) for n in names) + " |",
              "|---|---:|---:|---|" + "---:|" * len(names)]
    rows = view.rounds
    shown: list[RoundSummary | None] = list(rows)
    if len(rows) > MAX_ROUND_ROWS:
        shown = [*rows[:10], None, *rows[len(rows) - (MAX_ROUND_ROWS - 10):]]
    for r in shown:
        if r is None:
            lines.append(f"| … {len(rows) - MAX_ROUND_ROWS} more … | | | |" + " |" * len(names))
            continue
        label = "unknown round" if r.round is None else str(r.round)
        gated = "" if r.gated else " (not gated)"
        lines.append(f"| {label}{gated} | {r.captures} | {r.clients} | {r.worst or 'none'} | "
                     + " | ".join(_point(r, n) for n in names) + " |")
    if view.privacy is not None:
        lines += ["", *privacy_lines(view.privacy)]
    lines += ["", "| Client | Captures | Rounds | Worst | Worst round | Worst finding |",
              "|---|---:|---:|---|---:|---|"]
    for c in view.clients[:MAX_CLIENT_ROWS]:
        name = md_escape(c.client) if c.client is not None else "(no client id)"
        finding = f"{md_escape(c.worst_rule)}: {md_escape(c.worst_title or '')}" if c.worst_rule else "—"
        lines.append(f"| {name} | {c.captures} | {c.rounds} | {c.worst or 'none'} | "
                     f"{'—' if c.worst_round is None else c.worst_round} | {finding} |")
    if len(view.clients) > MAX_CLIENT_ROWS:
        lines.append(f"| … {len(view.clients) - MAX_CLIENT_ROWS} more clients (report.json, report.html) | | | | | |")
    return [*lines, ""]


def privacy_lines(privacy: RunPrivacy) -> list[str]:
    """ε over the run: one row per client (the largest first), its ε with its terms and the round it went over
    the budget."""
    from gleak.report.privacy import short_number
    from gleak.report.run_privacy import client_statement

    budget = f"; budget ε = {short_number(privacy.max_epsilon)}" if privacy.max_epsilon is not None else ""
    lines = [f"**Privacy spent**: {md_escape(privacy.kind)}; composed with Opacus's {privacy.accountant.upper()} "
             f"accountant at δ = {md_escape(short_number(privacy.delta))}{md_escape(budget)}.", ""]
    lines += [f"- {md_escape(n)}" for n in privacy.notes]
    lines += ["", "| Client | ε with its terms | Over budget from round |", "|---|---|---:|"]
    for c in privacy.clients[:MAX_CLIENT_ROWS]:
        name = md_escape(c.client) if c.client is not None else "(no client id)"
        over = "—" if c.over_budget_round is None else str(c.over_budget_round)
        lines.append(f"| {name} | {md_escape(client_statement(privacy, c))} | {over} |")
    if len(privacy.clients) > MAX_CLIENT_ROWS:
        lines.append(f"| … {len(privacy.clients) - MAX_CLIENT_ROWS} more clients (report.json) | | |")
    return lines


def _token_row(name: str, capture: CaptureReport) -> str:
    """A language model's capture: the best token attack by recall (over distinct tokens), its margin over chance;
    token ids and numbers only, never decoded text."""
    best = capture.best_tokens()
    text = md_escape(_sentences(capture))
    if best is None:
        ran = any(t.status == "ok" for t in capture.tokens or [])
        why = "no truth" if ran and capture.truth is None else "no token attack scored"
        return f"| {name} | ok | tokens: {why} | — | — | {text} |"
    scores = best.scores or {}
    recall = scores["recall"]
    margin = recall - scores.get("chance_recall", 0.0)
    return f"| {name} | ok | {md_escape(best.attack)} (token recall) | {_num(recall)} | {margin:+.3f} | {text} |"


CAPTURE_HEADERS = {
    "image": "| Capture | Status | Best label attack | iAcc | Over chance | Images (identification in lineups) |",
    "text": "| Capture | Status | Best token attack | Token recall | Over chance | Sentences |",
    "both": "| Capture | Status | Best label / token attack | iAcc / token recall | Over chance | Images / sentences |"}


def _captures_header(captures: Sequence[CaptureReport]) -> str:
    """The captures table's header, named for what they are: an image classifier's, a language model's, or both."""
    kinds = {c.tokens is not None for c in captures if c.status != "error"}
    return CAPTURE_HEADERS["both" if kinds == {True, False} else "text" if kinds == {True} else "image"]


def _sentences(capture: CaptureReport) -> str:
    """The images column of a language model's capture: its sentence reconstruction in a few words."""
    entry = capture.sentences
    if entry is None:
        return "— (text)"
    if entry.status != "ok":
        return f"{entry.attack}: {entry.status}"
    sc = entry.scores or entry.expected
    if not sc:
        return f"{entry.attack}: {entry.sequences} sequences (not scored)"
    what = "ROUGE-1" if entry.scores else "expected ROUGE-1"
    return (f"{entry.attack}: {what} {_num(float(sc.get('rouge1') or 0.0))}, {entry.exact}/{entry.sequences} exact"
            + (f", {entry.exact_up_to_last}/{entry.sequences} up to the last token"
               if entry.exact_up_to_last > entry.exact else ""))


def render(report: Report, out_dir: Path | None = None) -> str:
    """The summary as GitHub-flavoured Markdown (``out_dir`` is not needed: nothing is embedded)."""
    answer = verdict(report)
    icon = {"FAIL": "❌", "ERROR": "❌", "INCONCLUSIVE": "⚠️", "GATE OFF": "⚪", "PASS": "✅"}[answer.status]
    worst = report.worst()
    lines = [
        f"## {icon} gleak audit: **{answer.status}**",
        "",
        f"{md_escape(answer.headline)}.",
        "",
        f"Worst finding: **{worst or 'none'}** (fails at {gate_text(report)}); {md_escape(answer.counts_text)}; "
        f"{len(report.captures)} capture{'s' if len(report.captures) != 1 else ''}, budget {report.budget}, "
        f"gleak {md_escape(report.gleak_version)}.",
        "",
    ]
    if answer.run_line:
        lines += [f"Run: {md_escape(answer.run_line)}.", ""]
    if report.findings:
        lines += ["### Findings", "",
                  "| Severity | Capture | Rule | Finding | Metric | Measured | Chance | Threshold |",
                  "|---|---|---|---|---|---:|---:|---:|"]
        for f in sorted(report.findings, key=lambda f: -severity_rank(f.severity)):
            lines.append(
                f"| **{f.severity}** | {md_escape(f.capture)} | {md_escape(f.rule)} | {md_escape(f.title)} | "
                f"{md_escape(f.metric or '')} | {_num(f.measured)} | {_num(f.chance)} | {_num(f.threshold)} |"
            )
        lines.append("")
    else:
        lines += ["No findings.", ""]
    if report.run is not None and has_run(report):
        lines += run_section(report, report.run)
    if report.captures:
        lines += ["### Captures", "", _captures_header(report.captures), "|---|---|---|---:|---:|---:|"]
        lines += [_capture_row(c) for c in report.captures]
        lines.append("")
    if report.notices:
        lines += ["### Notices", ""]
        lines += [f"- {md_escape(notice_text(group))}" for group in grouped_notices(report.notices)]
        lines.append("")
    if report.command:
        lines += ["Reproduce: " + md_escape(shlex.join(report.command)), ""]
    return "\n".join(lines)
