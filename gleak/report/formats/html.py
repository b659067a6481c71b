"""``report.html``: one self-contained page (inline CSS, embedded PNG, inline SVG; no network).

Built from ``gleak/report/templates/report.html.j2`` with autoescaping on: every string from the report
(capture paths, metadata, reasons, the command) reaches the page escaped. The only markup made in Python is
the SVG bar chart, assembled from numbers with its few text labels escaped, and the run view's matplotlib plots
(their only text: our series titles and numbers). A run view's per-client table is sortable by one small inline
script, allowed by its sha256 in the page's Content-Security-Policy and nothing else; the page reads the same
without it.
"""

from __future__ import annotations

import base64
import hashlib
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from gleak.report.model import (
    SEVERITIES,
    AttackEntry,
    CaptureReport,
    Report,
    RunPrivacy,
    SweepReport,
    Thresholds,
    severity_rank,
)
from gleak.report.privacy import statement
from gleak.report.run_view import clear_text, gate_text
from gleak.report.verdict import grouped_notices, has_run, verdict

NAME = "html"
FILENAME = "report.html"

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
TEMPLATE = "report.html.j2"
MAX_EMBED_BYTES = 20 * 1024 * 1024  # artifacts this large or larger are linked by name, not embedded
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SERIES_COLOURS = ("#94a3b8", "#2563eb", "#f59e0b", "#10b981")
SCORE_KEYS = ("iacc", "cacc", "exact", "identification", "psnr", "ssim", "lpips")
SCORE_LABELS = {"iacc": "iAcc", "cacc": "cAcc", "exact": "exact", "identification": "identified",
                "identification_chance": "chance", "psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS"}
IMAGE_SCORE_KEYS = ("identification", "psnr", "ssim", "lpips")
# a language model's capture: the sentence reconstruction's scores shown, in order (never the text)
SENTENCE_SCORE_KEYS = ("rouge1", "rouge2", "rougeL", "exact_match", "exact_up_to_last", "token_accuracy",
                       "chance_rouge1")
# a language model's capture: the token attacks' scores shown, in order (never the tokens' text)
TOKEN_SCORE_KEYS = ("precision", "recall", "f1", "count_accuracy", "chance_recall", "sensitive_recall")


SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th button").forEach(function (button) {
    button.addEventListener("click", function () {
      var th = button.parentElement, col = th.cellIndex, asc = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute("data-sort"), y = b.cells[col].getAttribute("data-sort");
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""
SORT_SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SORT_SCRIPT.encode()).digest()).decode()


def short_sha(sha: str | None) -> str:
    """The first 12 hex digits of a sha256 (empty when unknown)."""
    return sha[:12] if sha else ""


def format_score(key: str, value: float | None) -> str:
    """One score for display: PSNR in dB, the rest as fractions; None (not finite / unknown) as a dash."""
    if value is None or not math.isfinite(value):
        return "—"
    if key == "psnr":
        return f"{value:.2f} dB"
    return f"{value:.3f}"


def format_number(value: float | None, digits: int = 3) -> str:
    """A measured value, chance or threshold: up to ``digits`` decimals, a dash when missing."""
    if value is None or not math.isfinite(value):
        return "—"
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def compact_counts(counts: Sequence[int] | None) -> str:
    """Per-class counts as ``class:count`` for the classes present, e.g. ``3:2 7:1 (Σ 3)``."""
    if counts is None:
        return "—"
    present = [f"{c}:{n}" for c, n in enumerate(counts) if n]
    if not present:
        return "none (Σ 0)"
    return " ".join(present) + f" (Σ {sum(counts)})"


def bar_chart_svg(series: Sequence[tuple[str, Sequence[int]]], class_names: Sequence[str] | None = None) -> Markup:
    """A grouped bar chart as inline SVG: one group per class, one bar per series in each group, a legend.

    Every bar is a ``<rect class="bar sJ">`` (J = the series' position), zero-height bars included, so each
    class has exactly one bar per series. Geometry comes from numbers only; the series and class names are
    escaped before they enter the markup.
    """
    if not series:
        return Markup("")
    n = max(len(counts) for _, counts in series)
    if n == 0:
        return Markup("")
    names = [str(c) for c in range(n)] if class_names is None else [str(c) for c in class_names]
    k = len(series)
    bar_w = max(2, min(14, 560 // (n * k)))
    gap = max(2, bar_w)
    group_w = k * bar_w + gap
    left, top, plot_h, bottom, right = 44, 30, 160, 34, 12
    width = left + n * group_w + right
    width = max(width, 260)
    height = top + plot_h + bottom
    ymax = max(1, *(max(counts, default=0) for _, counts in series))
    base = top + plot_h
    parts: list[str] = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="recovered and true examples per class">'
    ]
    # y axis: ticks at 0, the middle (when an integer) and the maximum
    ticks = sorted({0, ymax} | ({ymax // 2} if ymax >= 4 else set()))
    for t in ticks:
        y = base - t / ymax * plot_h
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 3.5:.1f}" text-anchor="end">{t}</text>')
    parts.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{base}"/>')
    parts.append(f'<line class="axis" x1="{left}" y1="{base}" x2="{width - right}" y2="{base}"/>')
    for j, (label, counts) in enumerate(series):
        colour = SERIES_COLOURS[j % len(SERIES_COLOURS)]
        for c in range(n):
            v = int(counts[c]) if c < len(counts) else 0
            h = v / ymax * plot_h
            x = left + c * group_w + gap / 2 + j * bar_w
            parts.append(
                f'<rect class="bar s{j}" x="{x:.1f}" y="{base - h:.1f}" width="{bar_w}" height="{h:.1f}" '
                f'fill="{colour}"><title>{escape(label)}, class {escape(names[c])}: {v}</title></rect>'
            )
    step = 1 if n <= 40 else math.ceil(n / 20)
    for c in range(0, n, step):
        x = left + c * group_w + group_w / 2
        parts.append(f'<text class="cls" x="{x:.1f}" y="{base + 14}" text-anchor="middle">{escape(names[c])}</text>')
    parts.append(f'<text class="cls" x="{left + (width - left - right) / 2:.1f}" y="{base + 29}" '
                 f'text-anchor="middle">class</text>')
    x = left
    for j, (label, _) in enumerate(series):
        colour = SERIES_COLOURS[j % len(SERIES_COLOURS)]
        parts.append(f'<rect class="key" x="{x}" y="8" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text class="legend" x="{x + 16}" y="18">{escape(label)}</text>')
        x += 16 + 7 * min(len(label), 40) + 18
    parts.append("</svg>")
    return Markup("".join(parts))


def chart_series(capture: CaptureReport) -> tuple[list[tuple[str, list[int]]], str]:
    """The label chart's series and a caption: the true counts beside the best label attack by iAcc (when the
    truth is known), else the first label attack that ran; empty when there is nothing to draw."""
    ran = [a for a in capture.attacks if a.task == "labels" and a.status == "ok" and a.counts is not None]
    if capture.truth_counts is not None and ran:
        best = capture.best_label() or ran[0]
        iacc = (best.scores or {}).get("iacc")
        caption = f"true counts beside {best.attack} (best iAcc, {format_score('iacc', iacc)})"
        return [("true", list(capture.truth_counts)), (best.attack, list(best.counts or []))], caption
    if capture.truth_counts is not None:
        return [("true", list(capture.truth_counts))], "true counts (no label attack ran)"
    if ran:
        return [(ran[0].attack, list(ran[0].counts or []))], f"counts recovered by {ran[0].attack} (no ground truth)"
    return [], ""


def embed_png(out_dir: Path | None, relative: str) -> tuple[str | None, str]:
    """``(data URI, "")`` for a PNG artifact under ``out_dir``, or ``(None, why not)``.

    Only files inside ``out_dir`` that start with the PNG signature and are smaller than 20 MB are read."""
    if out_dir is None:
        return None, "not embedded: no output folder given"
    root = out_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        return None, "not embedded: outside the output folder"
    try:
        if not path.is_file():
            return None, "not embedded: file not found"
        if path.stat().st_size >= MAX_EMBED_BYTES:
            return None, "not embedded: 20 MB or larger"
        data = path.read_bytes()
    except OSError as error:
        return None, f"not embedded: {error.strerror or 'unreadable'}"
    if not data.startswith(PNG_SIGNATURE):
        return None, "not embedded: not a PNG file"
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii"), ""


def _file_ref(label: str, ref: Any) -> dict[str, str] | None:
    if ref is None:
        return None
    return {"label": label, "path": ref.path, "sha": short_sha(ref.sha256), "sha_full": ref.sha256 or ""}


LINEUP_LEGEND = ("How to read it: one row per reconstruction. The first column is the reconstruction; the others are "
                 "its lineup, the true input and look-alikes of the same class from the auxiliary data, ordered from "
                 "most to least similar to the reconstruction. Green frame: the true input came first (identified). "
                 "Blue frame: it did not, and the look-alike that beat it is framed red.")


def _attack_context(attack: AttackEntry, out_dir: Path | None) -> dict[str, Any]:
    scores = attack.scores or {}
    shown = {key: format_score(key, scores.get(key)) for key in SCORE_KEYS if key in scores}
    caption = ", ".join(f"{SCORE_LABELS[k]} {format_score(k, scores.get(k))}" for k in IMAGE_SCORE_KEYS if k in scores)
    images = []
    for relative in attack.artifacts:
        if not relative.lower().endswith(".png"):
            continue
        uri, why = embed_png(out_dir, relative)
        images.append({"path": relative, "uri": uri, "why": why,
                       "legend": LINEUP_LEGEND if relative.lower().endswith("lineup.png") else ""})
    return {
        "attack": attack.attack,
        "task": attack.task,
        "status": attack.status,
        "counts": compact_counts(attack.counts) if attack.task == "labels" else "",
        "scores": shown,
        "seconds": f"{attack.seconds:.2f}",
        "reason": attack.reason or "",
        "warnings": attack.warnings,
        "soft_label": [f"{p:.3f}" for p in attack.soft_label] if attack.soft_label is not None else None,
        "images": images,
        "caption": caption,
    }


def _token_rows(capture: CaptureReport) -> list[dict[str, Any]]:
    """A language model's capture: one row per token attack — how many distinct token ids it recovered, its scores,
    why it did not run; never decoded text (the audit has none to show)."""
    rows = []
    for t in capture.tokens or []:
        scores = t.scores or {}
        rows.append({"attack": t.attack, "status": t.status, "method": t.method or "", "truth": t.truth or "",
                     "found": str(len(t.tokens)) if t.tokens else (f"length {t.max_length}" if t.max_length else ""),
                     "scores": [format_number(scores.get(k)) if k in scores else "" for k in TOKEN_SCORE_KEYS],
                     "seconds": f"{t.seconds:.2f}", "reason": t.reason or "", "warnings": t.warnings})
    return rows


def _sentence_row(capture: CaptureReport) -> dict[str, Any] | None:
    """A language model's capture: the sentence reconstruction — how many sequences, how many exact, its scores
    against the truth (or expected from twins); counts and scores only."""
    entry = capture.sentences
    if entry is None:
        return None
    scores = entry.scores or entry.expected or {}
    exact = str(entry.exact) + (f" ({entry.exact_up_to_last} up to the last token)"
                                if entry.exact_up_to_last > entry.exact else "")
    return {"attack": entry.attack, "status": entry.status, "found": str(entry.sequences), "exact": exact,
            "against": "truth" if entry.scores else ("expected (twins)" if entry.expected else ""),
            "scores": [format_number(scores.get(k)) if k in scores else "" for k in SENTENCE_SCORE_KEYS],
            "seconds": f"{entry.seconds:.2f}", "reason": entry.reason or ""}


def _defense_text(record: dict[str, Any]) -> str:
    """'clip (norm=4.0)' — one recorded defense, its options set."""
    options = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("name", "seed") and v is not None)
    return f"{record.get('name', '?')}" + (f" ({options})" if options else "")


def _capture_context(index: int, capture: CaptureReport, out_dir: Path | None) -> dict[str, Any]:
    series, caption = chart_series(capture)
    setting = [
        ("kind", capture.kind),
        ("B (batch size)", capture.batch_size),
        ("m (local steps)", capture.local_steps),
        ("C (classes)", capture.num_classes),
        ("last layer", capture.last_layer),
        ("model mode", capture.model_mode),
        ("defenses", " then ".join(_defense_text(d) for d in capture.defense) if capture.defense else None),
        ("DP-SGD", statement(capture.epsilon, capture.epsilon_terms)),
        ("seconds", f"{capture.seconds:.2f}"),
    ]
    refs = [_file_ref(label, ref) for label, ref in
            (("capture", capture.capture), ("model", capture.model), ("aux", capture.aux), ("truth", capture.truth))]
    attacks = [_attack_context(a, out_dir) for a in capture.attacks]
    return {
        "id": f"capture-{index}",
        "path": capture.capture.path,
        "status": capture.status,
        "error": capture.error or "",
        "setting": [(k, "—" if v is None else str(v)) for k, v in setting],
        "loss": [(str(k), str(v)) for k, v in (capture.loss or {}).items()],
        "chance": [(str(k), format_number(v)) for k, v in (capture.chance or {}).items()],
        "refs": [r for r in refs if r is not None],
        "assumptions": capture.assumptions,
        "chart": bar_chart_svg(series),
        "chart_caption": caption,
        "truth_counts": compact_counts(capture.truth_counts) if capture.truth_counts is not None else "",
        "attacks": attacks,
        "soft_labels": [a for a in attacks if a["soft_label"] is not None],
        "images": [a for a in attacks if a["images"]],
        "score_keys": [k for k in SCORE_KEYS if any(k in a["scores"] for a in attacks)],
        "score_labels": SCORE_LABELS,
        "skipped": capture.skipped,
        "tokens": _token_rows(capture),
        "token_score_keys": TOKEN_SCORE_KEYS,
        "sentences": _sentence_row(capture),
        "sentence_score_keys": SENTENCE_SCORE_KEYS,
    }


def _thresholds() -> list[dict[str, str]]:
    return [{"name": name, "description": field.description or ""} for name, field in Thresholds.model_fields.items()]


def _series_cell(point: Any) -> dict[str, str]:
    if point is None:
        return {"text": "—", "sort": ""}
    chance = f" (chance {format_number(point.chance)})" if point.chance is not None else ""
    return {"text": f"{format_number(point.max)} / {format_number(point.median)}{chance}", "sort": f"{point.max}"}


def _privacy_context(privacy: RunPrivacy | None) -> dict[str, Any] | None:
    """The run's ε table: each client's final ε with its terms, the round it went over budget, its ε per round."""
    if privacy is None:
        return None
    from gleak.report.privacy import short_number
    from gleak.report.run_privacy import client_statement

    def series(client: Any) -> str:
        shown = [f"{'?' if r.round is None else r.round}: {'unknown' if r.epsilon is None else short_number(r.epsilon)}"
                 for r in client.rounds[:40]]
        more = f" … ({len(client.rounds) - 40} more in report.json)" if len(client.rounds) > 40 else ""
        return ", ".join(shown) + more

    return {"kind": privacy.kind, "accountant": privacy.accountant.upper(), "delta": short_number(privacy.delta),
            "budget": short_number(privacy.max_epsilon) if privacy.max_epsilon is not None else "",
            "notes": privacy.notes,
            "clients": [{"label": c.client if c.client is not None else "(no client id)",
                         "epsilon": "unknown" if c.epsilon is None else short_number(c.epsilon),
                         "statement": client_statement(privacy, c),
                         "over": "—" if c.over_budget_round is None else str(c.over_budget_round),
                         "series": series(c)} for c in privacy.clients]}


def run_context(report: Report) -> dict[str, Any] | None:
    """The run view for the template: plots (inline SVG), the per-round and per-client tables."""
    view = report.run
    if view is None:
        return None
    from gleak.report.plots import plotted_series, svg_markup

    names = [s.name for s in view.series]
    rounds = [{
        "label": "unknown round" if r.round is None else str(r.round), "sort": "" if r.round is None else str(r.round),
        "captures": r.captures, "clients": r.clients, "errors": r.errors, "worst": r.worst or "",
        "worst_rank": severity_rank(r.worst) if r.worst else -1, "findings": r.findings, "gated": r.gated,
        "series": [_series_cell(r.series.get(n)) for n in names]} for r in view.rounds]
    clients = [{
        "label": c.client if c.client is not None else "(no client id)", "captures": c.captures, "rounds": c.rounds,
        "worst": c.worst or "", "worst_rank": severity_rank(c.worst) if c.worst else -1,
        "worst_round": "" if c.worst_round is None else str(c.worst_round), "worst_rule": c.worst_rule or "",
        "worst_title": c.worst_title or "",
        "series": [{"text": format_number(c.series_max.get(n)), "sort": str(c.series_max.get(n, ""))} for n in names]}
        for c in view.clients]
    return {
        "privacy": _privacy_context(view.privacy),
        "gate": gate_text(report), "clear_text": clear_text(view, report.fail_on),
        "series": [{"name": s.name, "title": s.title, "metric": s.metric + (f" ({s.unit})" if s.unit else ""),
                    "svg": Markup(svg_markup(view, s))} for s in plotted_series(view)],
        "rounds": rounds, "clients": clients, "known_rounds": sum(r.round is not None for r in view.rounds),
    }


def sweep_context(sweep: SweepReport | None) -> dict[str, Any] | None:
    """A defense sweep (``gleak audit --sweep DIR``) for the template: per defense its plot (inline SVG, drawn
    from the validated report, never read from the sweep's folder) and its table."""
    if sweep is None:
        return None
    from gleak.report.sweep_plots import (
        LEGEND,
        defense_table,
        plot_title,
        privacy_utility_svg,
        privacy_utility_title,
        settings_text,
        svg_markup,
    )

    defenses = []
    for d in sweep.defenses:
        table = defense_table(sweep, d.name)
        defenses.append({"name": d.name, "strength": d.strength or "", "spec": d.spec, "training": d.training,
                         "title": plot_title(sweep, d.name), "svg": Markup(svg_markup(sweep, d.name)),
                         "header": list(zip(table.header, table.numeric, strict=True)),
                         "rows": [list(zip(row, table.numeric, strict=True)) for row in table.rows]})
    tradeoff = privacy_utility_svg(sweep)
    return {"settings": settings_text(sweep), "notices": sweep.notices, "defenses": defenses, "legend": LEGEND,
            "tradeoff": {"title": privacy_utility_title(sweep), "svg": Markup(tradeoff[tradeoff.index("<svg"):])}}


VERDICT_CLASS = {"PASS": "pass", "FAIL": "fail", "INCONCLUSIVE": "inconclusive", "GATE OFF": "off",
                 "ERROR": "error"}
MAX_NAMED = 5  # captures named under a grouped notice (the JSON lists them all)
MAX_OPEN_LIST = 20  # longer lists (captures, findings past the worst 20) start collapsed


def context(report: Report, out_dir: Path | None = None, sweep: SweepReport | None = None) -> dict[str, Any]:
    """Everything the template shows, as plain strings, numbers and the chart's Markup (``sweep``: a defense sweep
    to show beside the audit)."""
    ids: dict[str, str] = {}
    for i, capture in enumerate(report.captures):
        ids.setdefault(capture.capture.path, f"capture-{i}")
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in SEVERITIES}
    findings = sorted(report.findings, key=lambda f: -severity_rank(f.severity))
    thresholds = report.thresholds.model_dump()
    answer = verdict(report)
    return {
        "verdict": answer.status,
        "verdict_class": VERDICT_CLASS[answer.status],
        "headline": answer.headline,
        "counts_text": answer.counts_text,
        "run_line": answer.run_line,
        "worst": report.worst() or "none",
        "fail_on": report.fail_on,
        "severities": list(SEVERITIES),
        "counts": counts,
        "findings": [
            {
                "severity": f.severity,
                "capture": f.capture,
                "anchor": ids.get(f.capture, ""),
                "rule": f.rule,
                "title": f.title,
                "metric": f.metric or "",
                "measured": format_number(f.measured),
                "chance": format_number(f.chance),
                "threshold": format_number(f.threshold),
                "attack": f.attack or "",
                "detail": f.detail or "",
            }
            for f in findings
        ],
        "notices": [{"code": g.code, "count": g.count, "message": g.message, "captures": g.captures[:MAX_NAMED],
                     "more": max(0, len(g.captures) - MAX_NAMED)} for g in grouped_notices(report.notices)],
        "captures": [_capture_context(i, c, out_dir) for i, c in enumerate(report.captures)],
        "captures_open": len(report.captures) <= MAX_OPEN_LIST,
        "findings_shown": MAX_OPEN_LIST,
        "has_errors": report.has_errors(),
        "run": [
            ("budget", report.budget),
            ("fail on", gate_text(report) if report.run is not None else f"≥ {report.fail_on}"),
            ("seed", str(report.seed)),
            ("device", report.device),
            ("threads", "—" if report.threads is None else str(report.threads)),
            ("captures", str(len(report.captures))),
            ("seconds", f"{report.seconds:.2f}"),
        ],
        "command": shlex.join(report.command) if report.command else "",
        "rounds_view": run_context(report) if has_run(report) else None,
        "sweep": sweep_context(sweep),
        "sort_script": Markup(SORT_SCRIPT) if report.run is not None else "",
        "script_hash": SORT_SCRIPT_HASH if report.run is not None else "",
        "thresholds": [dict(t, value=format_number(thresholds[t["name"]])) for t in _thresholds()],
        "gleak_version": report.gleak_version,
        "schema_version": report.schema_version,
    }


def render(report: Report, out_dir: Path | None = None, sweep: SweepReport | None = None) -> str:
    """The whole page. ``out_dir`` is where PNG artifacts (paths relative to it) are read from to embed them;
    ``sweep`` adds a defense sweep's plots and tables."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(TEMPLATE).render(**context(report, out_dir, sweep))
