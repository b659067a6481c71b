"""The run view's plots (matplotlib, Agg and SVG back ends, no pyplot state): one figure per leakage series, the
max and the median over the round's clients against the round, with the chance level where the metric has one.

Every plot carries an accessible name saying what it shows (the series' title, e.g. "best label iAcc over
rounds"): the SVG gets ``role="img"``, ``aria-label`` and a ``<title>``; the HTML and Markdown reports use it as
the PNG's ``alt`` text. Output is deterministic (no dates, a fixed SVG id salt), so the same report gives the same
bytes. matplotlib is imported only when a run view is drawn.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from markupsafe import escape

from gleak.report.model import RunView, SeriesInfo

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_PREFIX = "run-"  # run-<series>.png beside the reports


def plot_name(info: SeriesInfo) -> str:
    """The PNG's file name beside the reports, e.g. ``run-label_iacc.png``."""
    return f"{PLOT_PREFIX}{info.name}.png"


def figure(view: RunView, info: SeriesInfo) -> Figure:
    """The series ``info`` of ``view`` over the known rounds (the unknown-round group is left out: it has no x)."""
    from matplotlib.figure import Figure

    if info.name == EPSILON_SERIES.name:  # ε alone: the rounds of the run, no leakage line
        return _epsilon_figure(view, [r.round for r in view.rounds if r.round is not None], info)
    points = [(r.round, r.series[info.name]) for r in view.rounds if r.round is not None and info.name in r.series]
    fig = Figure(figsize=(6.4, 3.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    xs = [r for r, _ in points]
    marker = "o" if len(xs) <= 40 else None
    ax.plot(xs, [p.max for _, p in points], color="#dc2626", marker=marker, markersize=3, label="max over clients")
    ax.plot(xs, [p.median for _, p in points], color="#2563eb", linestyle="--", marker=marker, markersize=3,
            label="median over clients")
    chance = [(r, p.chance) for r, p in points if p.chance is not None]
    if chance:
        ax.plot([r for r, _ in chance], [c for _, c in chance], color="#6b7280", linestyle=":", label="chance")
    unit = f" ({info.unit})" if info.unit else ""
    ax.set_xlabel("round")
    ax.set_ylabel(info.metric + unit)
    ax.set_title(info.title, fontsize=10)
    if xs and all(float(x).is_integer() for x in xs) and max(xs) - min(xs) <= 20:
        ax.set_xticks(range(min(xs), max(xs) + 1))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if view.privacy is not None and xs:  # ε over the same rounds, on a second axis: leakage and ε in one figure
        from gleak.report.privacy import short_number
        from gleak.report.run_privacy import epsilon_by_round

        eps = epsilon_by_round(view.privacy, xs)
        shown = [(x, e) for x, e in zip(xs, eps, strict=True) if e is not None]
        if shown:
            twin = ax.twinx()
            twin.plot([x for x, _ in shown], [e for _, e in shown], color="#059669", marker=marker, markersize=3,
                      label=f"largest cumulative ε (δ = {short_number(view.privacy.delta)}, "
                            f"{view.privacy.accountant.upper()})")
            if view.privacy.max_epsilon is not None:
                twin.axhline(view.privacy.max_epsilon, color="#059669", linestyle=":", linewidth=1,
                             label=f"budget ε = {short_number(view.privacy.max_epsilon)}")
            twin.set_ylabel("cumulative ε")
            twin.set_ylim(bottom=0)
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, fontsize=8, loc="best")
    return fig


def _epsilon_figure(view: RunView, xs: list[int], info: SeriesInfo) -> Figure:
    from matplotlib.figure import Figure

    from gleak.report.privacy import short_number
    from gleak.report.run_privacy import epsilon_by_round

    fig = Figure(figsize=(6.4, 3.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    privacy = view.privacy
    assert privacy is not None
    shown = [(x, e) for x, e in zip(xs, epsilon_by_round(privacy, xs), strict=True) if e is not None]
    ax.plot([x for x, _ in shown], [e for _, e in shown], color="#059669", marker="o" if len(shown) <= 40 else None,
            markersize=3, label=f"largest cumulative ε (δ = {short_number(privacy.delta)}, "
                                f"{privacy.accountant.upper()})")
    if privacy.max_epsilon is not None:
        ax.axhline(privacy.max_epsilon, color="#059669", linestyle=":", linewidth=1,
                   label=f"budget ε = {short_number(privacy.max_epsilon)}")
    ax.set_xlabel("round")
    ax.set_ylabel(info.metric)
    ax.set_ylim(bottom=0)
    ax.set_title(info.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def figure_png(fig: Figure) -> bytes:
    """A figure as PNG bytes (no software tag: the same figure gives the same bytes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def figure_svg(fig: Figure, salt: str) -> str:
    """A figure as a whole SVG document: text as text, no date, ids from ``salt`` (the same bytes each time)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    FigureCanvasSVG(fig)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return buffer.getvalue()


def named_svg(svg: str, label: str, css_class: str) -> str:
    """``svg`` with its accessible name: ``role="img"``, ``aria-label`` and a leading ``<title>`` (``label`` is
    escaped here), and ``css_class`` on the root element."""
    label = str(escape(label))
    text = re.sub(r"<svg ", f'<svg role="img" aria-label="{label}" class="{css_class}" ', svg, count=1)
    head_end = text.index(">", text.index("<svg")) + 1
    return text[:head_end] + f"<title>{label}</title>" + text[head_end:]


def png_bytes(view: RunView, info: SeriesInfo) -> bytes:
    return figure_png(figure(view, info))


def svg_markup(view: RunView, info: SeriesInfo) -> str:
    """The plot as inline SVG markup (no XML prolog), with ``role="img"``, ``aria-label`` and a ``<title>``."""
    text = figure_svg(figure(view, info), "gleak")
    return named_svg(text[text.index("<svg"):], info.title, "run-plot")


EPSILON_SERIES = SeriesInfo(name="epsilon", title="cumulative ε over rounds", metric="cumulative ε")


def plotted_series(view: RunView) -> list[SeriesInfo]:
    """The series the run view draws: each leakage series (with ε beside it when the run accounts privacy), or ε
    alone when the run accounts privacy but has no leakage series."""
    if view.series:
        return list(view.series)
    return [EPSILON_SERIES] if view.privacy is not None else []


def run_plots(view: RunView) -> dict[str, bytes]:
    """Every series' PNG, by file name."""
    return {plot_name(info): png_bytes(view, info) for info in plotted_series(view)}
