"""What a sweep (:class:`~gleak.report.model.SweepReport`) renders: one plot per defense, its table, ``sweep.md`` and
the console summary — all from the report alone.

Each defense's plot shows leakage against the defense's strength: one line per attack (mean over the trials, error
bars one standard deviation), the undefended baseline of each attack as a dashed line of its colour, the chance
level (dotted), and the utility kept (cosine of the defended to the clean contribution; the test accuracy of the model
trained under the defense with ``--utility accuracy``) on a second y axis; one
panel per metric (label iAcc, identification over chance κ, PSNR). The x axis is logarithmic when the strengths
are positive and span more than a decade (symmetric-log, linear near 0, when one of them is 0), and always for
DP-SGD swept over a target ε; DP-SGD's plot states its ε's terms (δ, accountant, q, steps, rounds) and shows the
other half of its noise on a top axis (the noise multiplier z at each target ε, or the ε of each z). Every plot has an
accessible name (:func:`plot_title`): the SVG gets ``role="img"``, ``aria-label`` and a ``<title>``; ``sweep.md``
and the audit's HTML use it as alt text / caption.
The privacy–utility plot (:func:`privacy_utility_figure`, ``privacy-utility.png`` / ``.svg``, one per sweep) shows
leakage (the best attack's mean at each point) against the utility kept, one curve per defense from the undefended
point (a star). Output is deterministic (no dates, a fixed SVG id salt). matplotlib and rich are imported only when
used.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gleak.report.formats.markdown import md_escape
from gleak.report.formats.text import fmt_number
from gleak.report.model import BASELINE, EpsilonTerms, SweepDefense, SweepMetric, SweepReport, SweepRow
from gleak.report.plots import figure_svg, named_svg
from gleak.report.privacy import describe_terms, short_number

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from rich.console import Console

METRIC_ORDER: tuple[SweepMetric, ...] = ("iacc", "identification_kappa", "psnr")
METRIC_LABELS: dict[str, str] = {"iacc": "label iAcc", "identification_kappa": "identification over chance κ",
                                 "psnr": "PSNR (dB)"}
METRIC_SHORT: dict[str, str] = {"iacc": "iAcc", "identification_kappa": "κ", "psnr": "PSNR"}
CHANCE_LABELS: dict[str, str] = {"iacc": "chance (random guessing)", "identification_kappa": "chance (κ = 0)",
                                 "psnr": "no-attack baseline"}
COLOURS = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9333ea",
           "#ea580c", "#475569", "#0d9488")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p")
UTILITY_COLOUR = "#111827"
PRIVACY_UTILITY = "privacy-utility"  # the privacy–utility plot's file stem (no defense is named so)
LOG_SPAN = 10.0  # strengths spanning more than this factor get a log axis


def defense_of(report: SweepReport, name: str) -> SweepDefense:
    for d in report.defenses:
        if d.name == name:
            return d
    raise KeyError(name)


STRENGTH_LABELS = {"epsilon": "target ε", "noise_multiplier": "noise_multiplier z"}


def _strength_label(defense: SweepDefense) -> str:
    if defense.strength is None:
        return "defense (no strength option)"
    return STRENGTH_LABELS.get(defense.strength, defense.strength) if defense.training else defense.strength


def epsilon_terms_of(report: SweepReport, name: str) -> EpsilonTerms | None:
    """The terms of a DP defense's ε (δ, accountant, q, steps, rounds: the same at every point of one defense;
    z aside), from its first row that records them; None for a defense without ε."""
    return next((r.epsilon_terms for r in report.rows if r.defense == name and r.epsilon_terms is not None), None)


def _noise_of(report: SweepReport, name: str) -> dict[float | None, float]:
    """Strength -> the noise multiplier z it ran with (dpsgd)."""
    return {r.strength: r.epsilon_terms.noise_multiplier for r in report.rows  # type: ignore[misc]
            if r.defense == name and r.epsilon_terms is not None and r.strength != BASELINE}


def _epsilon_of(report: SweepReport, name: str) -> dict[float | None, float]:
    """Strength -> the mean ε recorded (dpsgd)."""
    return {r.strength: r.epsilon for r in report.rows  # type: ignore[misc]
            if r.defense == name and r.epsilon is not None and r.strength != BASELINE}


def metrics_of(report: SweepReport, rows: list[SweepRow] | None = None) -> list[SweepMetric]:
    """The metrics of the rows, in :data:`METRIC_ORDER`."""
    present = {r.metric for r in (report.rows if rows is None else rows)}
    return [m for m in METRIC_ORDER if m in present]


def attacks_of(report: SweepReport, metric: str | None = None) -> list[str]:
    """The attacks with rows (of ``metric``), in the report's order."""
    seen: dict[str, str] = {}
    for r in report.rows:
        seen.setdefault(r.attack, r.metric)
    return [a for a, m in seen.items() if metric is None or m == metric]


def measured_accuracy(report: SweepReport) -> bool:
    """Whether the sweep measured test accuracy (``--utility accuracy``)."""
    return any(r.utility.accuracy is not None for r in report.rows)


def points_of(report: SweepReport) -> list[tuple[str, object]]:
    """The sweep's points, (defense, strength), in the order of its rows (the undefended baseline first)."""
    return list(dict.fromkeys((r.defense, r.strength) for r in report.rows))


def utility_label(report: SweepReport) -> str:
    """What the utility axis shows."""
    return "test accuracy" if measured_accuracy(report) else "cosine"


def utility_of(report: SweepReport, row: SweepRow) -> float | None:
    """The utility shown for ``row``'s point: its test accuracy when measured, else its cosine."""
    return row.utility.accuracy if measured_accuracy(report) else row.utility.cosine


def plot_title(report: SweepReport, name: str) -> str:
    """The plot's accessible name: what it shows, in a sentence."""
    defense = defense_of(report, name)
    metrics = " and ".join(METRIC_LABELS[m] for m in metrics_of(report))
    against = f"its {_strength_label(defense)}" if defense.strength else "the defense"
    return (f"{name}: {metrics} of {len(attacks_of(report))} attack(s) against {against}, mean ± std over "
            f"{report.settings.trials} trial(s), with the undefended baseline, chance and the utility kept "
            f"({utility_label(report)})")


def privacy_utility_title(report: SweepReport) -> str:
    """The privacy–utility plot's accessible name."""
    metrics = " and ".join(METRIC_LABELS[m] for m in metrics_of(report))
    names = ", ".join(d.name for d in report.defenses)
    return (f"privacy–utility: leakage ({metrics} of the best attack at each point, mean over "
            f"{report.settings.trials} trial(s)) against the utility kept ({utility_label(report)}), one curve per "
            f"defense ({names}) from the undefended point")


def _points(report: SweepReport, name: str) -> list[float | None]:
    """The defense's strengths in the order run (None: a defense without strength)."""
    out: list[float | None] = []
    for r in report.rows:
        if r.defense == name and r.strength != BASELINE and r.strength not in out:
            out.append(None if r.strength is None else float(r.strength))
    return out


def _mean_of(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def figure(report: SweepReport, name: str) -> Figure:
    """The plot of defense ``name``: one panel per metric, one line per attack."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    defense = defense_of(report, name)
    rows = [r for r in report.rows if r.defense == name]
    base = {r.attack: r for r in report.rows if r.defense == BASELINE}
    strengths = _points(report, name)
    numeric = bool(strengths) and all(s is not None for s in strengths)
    values = [float(s) for s in strengths if s is not None]
    positive = [v for v in values if v > 0]
    log = numeric and len(positive) >= 2 and min(values) >= 0 and max(positive) / min(positive) > LOG_SPAN
    aimed = defense.strength == "epsilon" and defense.training  # dpsgd:epsilon=...: an ε axis, always log
    log = log or (aimed and numeric and len(positive) == len(values) and len(values) >= 2)
    symlog = log and min(values) == 0  # 0 (no noise) beside a decade or more: linear around 0, log beyond
    position = {s: (float(s) if numeric and s is not None else float(i)) for i, s in enumerate(strengths)}
    order = sorted(strengths, key=lambda s: position[s])
    metrics = metrics_of(report, rows) or ["iacc"]
    fig = Figure(figsize=(8.4, 0.7 + 3.2 * len(metrics)), dpi=100, layout="constrained")
    axes: list[Axes] = list(fig.subplots(len(metrics), 1, squeeze=False)[:, 0])
    trials = report.settings.trials
    every = attacks_of(report)
    for ax, metric in zip(axes, metrics, strict=True):
        for attack in attacks_of(report, metric):
            k = every.index(attack)  # one colour and marker per attack, across panels
            colour, marker = COLOURS[k % len(COLOURS)], MARKERS[k % len(MARKERS)]
            got = {r.strength: r for r in rows if r.attack == attack}
            pts = [(position[s], mean, got[s].std or 0.0) for s in order
                   if s in got and (mean := got[s].mean) is not None]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], color=colour,
                            marker=marker, markersize=4, linewidth=1.2, capsize=3, label=attack)
            b = base.get(attack)
            if b is not None and b.mean is not None:
                ax.axhline(b.mean, color=colour, linestyle="--", linewidth=0.8, alpha=0.55)
        chances = [r.chance for r in [*rows, *base.values()] if r.metric == metric and r.chance is not None]
        chance = _mean_of(chances)
        if chance is not None:
            ax.axhline(chance, color="#6b7280", linestyle=":", linewidth=1.5, label=CHANCE_LABELS[metric])
        ax.set_ylabel(METRIC_LABELS[metric])
        if metric == "iacc":
            ax.set_ylim(-0.03, 1.05)
        elif metric == "identification_kappa":
            ax.set_ylim(min(-0.15, *(r.mean - (r.std or 0) for r in rows if r.metric == metric and r.mean is not None),
                            ), 1.05)
        if symlog:
            ax.set_xscale("symlog", linthresh=min(positive))
        elif log:
            ax.set_xscale("log")
        if aimed and log:  # the target εs themselves, not powers of ten
            ax.set_xticks([position[s] for s in order], [_tick(defense, s) for s in order])
            ax.minorticks_off()
        if not numeric:
            ax.set_xticks([position[s] for s in order], [_tick(defense, s) for s in order])
            ax.set_xlim(-0.6, len(order) - 0.4)
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        kept = {r.strength: u for r in rows if (u := utility_of(report, r)) is not None}
        util = [(position[s], kept[s]) for s in order if s in kept]
        accurate = measured_accuracy(report)
        twin.plot([p[0] for p in util], [p[1] for p in util], color=UTILITY_COLOUR, linestyle="-.", marker="s",
                  markersize=3, linewidth=1.0, label="utility: test accuracy of the model trained under it" if
                  accurate else "utility: cosine to the clean contribution")
        undefended = next((utility_of(report, b) for b in base.values()), None)
        if accurate and undefended is not None:
            twin.axhline(undefended, color=UTILITY_COLOUR, linestyle=(0, (1, 3)), linewidth=0.9,
                         label="undefended test accuracy")
        low = min([0.0, *(p[1] for p in util)])
        twin.set_ylim(low - 0.05, 1.05)
        twin.set_ylabel(f"utility ({utility_label(report)})")
        handles, labels = ax.get_legend_handles_labels()
        handles += [Line2D([], [], color="#6b7280", linestyle="--", linewidth=0.8),
                    *twin.get_legend_handles_labels()[0]]
        labels += ["undefended (dashed, per attack)", *twin.get_legend_handles_labels()[1]]
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0,
                  frameon=False)
    scale = ", symlog scale" if symlog else (", log scale" if log else "")
    terms = epsilon_terms_of(report, name)
    if terms is not None and aimed:
        axes[-1].set_xlabel(f"target ε ({name}{scale}; {trials} trial(s) per point)\nrecorded ε ≤ target, at "
                            f"{describe_terms(terms)}")
    else:
        axes[-1].set_xlabel(f"{_strength_label(defense)} ({name}{scale}; {trials} trial(s) per point)")
    if terms is not None and numeric:  # the other half of DP-SGD's noise on the top axis: z for ε, ε for z
        other = _noise_of(report, name) if aimed else _epsilon_of(report, name)
        top = axes[0].secondary_xaxis("top")
        ticks = [s for s in order if s in other]
        top.set_xticks([position[s] for s in ticks], [short_number(other[s]) for s in ticks], fontsize=7)
        top.minorticks_off()
        top.set_xlabel("noise multiplier z picked by Opacus's get_noise_multiplier" if aimed else
                       f"ε at {describe_terms(terms)}", fontsize=8)
    fig.suptitle(_wrap(plot_title(report, name)), fontsize=9)
    fig.draw_without_rendering()  # the constrained layout, computed once and kept: a second save (the PNG then
    fig.set_layout_engine("none")  # the SVG of one figure) would start from the first's layout and shift it
    return fig


def _tick(defense: SweepDefense, strength: float | None) -> str:
    if strength is not None:
        return f"{strength:g}"
    fixed = ",".join(f"{k}={v}" for k, v in defense.fixed.items())
    return defense.name + (f" ({fixed})" if fixed else "")


def _wrap(text: str, width: int = 110) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line])


def best_of(rows: list[SweepRow], metric: str) -> SweepRow | None:
    """The attack with the highest mean of ``metric`` among ``rows`` (one point), None when none answered."""
    scored = [r for r in rows if r.metric == metric and r.mean is not None]
    return max(scored, key=lambda r: r.mean or 0.0) if scored else None


def privacy_utility_figure(report: SweepReport) -> Figure:
    """Leakage against utility: per metric a panel, per defense a curve through its points in the order run,
    starting at the undefended point (a star); x the test accuracy when measured, else the cosine."""
    from matplotlib.figure import Figure

    metrics = metrics_of(report) or ["iacc"]
    fig = Figure(figsize=(8.4, 0.9 + 3.4 * len(metrics)), dpi=100, layout="constrained")
    axes: list[Axes] = list(fig.subplots(len(metrics), 1, squeeze=False)[:, 0])
    base = [r for r in report.rows if r.defense == BASELINE]
    for ax, metric in zip(axes, metrics, strict=True):
        b = best_of(base, metric)
        bx = utility_of(report, base[0]) if base else None
        start = [(bx, b.mean)] if b is not None and b.mean is not None and bx is not None else []
        for k, d in enumerate(report.defenses):
            pts = list(start)
            labels = [""] * len(start)
            for s in _points(report, d.name):
                at = [r for r in report.rows if r.defense == d.name and r.strength == s]
                best = best_of(at, metric)
                u = utility_of(report, at[0]) if at else None
                if best is not None and best.mean is not None and u is not None:
                    pts.append((u, best.mean))
                    labels.append(_tick(d, s))
            colour, marker = COLOURS[k % len(COLOURS)], MARKERS[(k + 1) % len(MARKERS)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker, markersize=4,
                    linewidth=1.2, label=d.name + (f" ({d.strength})" if d.strength else ""))
            for (x, y), text in zip(pts, labels, strict=True):
                if text:
                    ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6, color=colour)
        if start:
            ax.plot([start[0][0]], [start[0][1]], linestyle="none", marker="*", markersize=13, color="#111827",
                    label=f"undefended (best: {b.attack if b else 'n/a'})", zorder=5)
        chance = _mean_of([r.chance for r in report.rows if r.metric == metric and r.chance is not None])
        if chance is not None:
            ax.axhline(chance, color="#6b7280", linestyle=":", linewidth=1.5, label=CHANCE_LABELS[metric])
        ax.set_ylabel(f"leakage: {METRIC_LABELS[metric]} (best attack)")
        if metric == "iacc":
            ax.set_ylim(-0.03, 1.05)
        ax.set_xlabel("utility: test accuracy of the model trained under the defense (held out)"
                      if measured_accuracy(report) else "utility: cosine of the defended to the clean contribution")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.suptitle(_wrap(privacy_utility_title(report)), fontsize=9)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    return fig


def privacy_utility_svg(report: SweepReport, fig: Figure | None = None) -> str:
    """The privacy–utility plot as a standalone SVG file with its accessible name."""
    svg = figure_svg(fig if fig is not None else privacy_utility_figure(report), f"gleak-sweep-{PRIVACY_UTILITY}")
    return named_svg(svg, privacy_utility_title(report), "sweep-plot")


def svg_document(report: SweepReport, name: str, fig: Figure | None = None) -> str:
    """The plot as a standalone SVG file (XML prolog kept) with its accessible name; ``fig``: the plot, when
    already drawn (:func:`figure`), else it is drawn here."""
    svg = figure_svg(fig if fig is not None else figure(report, name), f"gleak-sweep-{name}")
    return named_svg(svg, plot_title(report, name), "sweep-plot")


def svg_markup(report: SweepReport, name: str) -> str:
    """The plot as inline SVG markup (no XML prolog) with its accessible name."""
    text = svg_document(report, name)
    return text[text.index("<svg"):]


# ----------------------------------------------------------------------------------------- tables
@dataclass
class SweepTable:
    """One defense's table: a header, rows of display strings (the baseline first), which columns are numbers."""

    header: list[str]
    rows: list[list[str]]
    numeric: list[bool]


def cell(row: SweepRow | None, total: int) -> str:
    """``mean ± std``, with ``(k/T)`` when only k of the T trials answered; ``n/a`` when none did."""
    if row is None or row.mean is None:
        return "n/a"
    digits = 2 if row.metric == "psnr" else 3
    text = f"{fmt_number(row.mean, digits)} ± {fmt_number(row.std, digits)}"
    return text + (f" ({row.trials}/{total})" if row.failed else "")


def _number(value: float | None, digits: int = 3) -> str:
    return fmt_number(value, digits)


def defense_table(report: SweepReport, name: str) -> SweepTable:
    """Strength by strength (the undefended baseline first): chance, every attack, the utility and ε."""
    defense = defense_of(report, name)
    total = report.settings.trials
    attacks = attacks_of(report)
    metric_of = {r.attack: r.metric for r in report.rows}
    chance_metrics = [m for m in metrics_of(report) if m != "identification_kappa"]
    header = [_strength_label(defense)]
    header += ["chance iAcc" if m == "iacc" else "no-attack PSNR (dB)" for m in chance_metrics]
    header += [a if metric_of[a] == "iacc" else f"{a} {METRIC_SHORT[metric_of[a]]}" for a in attacks]
    terms = epsilon_terms_of(report, name)
    noise = _noise_of(report, name) if defense.strength == "epsilon" and terms is not None else {}
    accurate = measured_accuracy(report)
    header += (["test accuracy"] if accurate else []) + ["cosine", "rel. L2 error"]
    if defense.training:
        header += (["noise_multiplier z"] if noise else []) + [f"ε at {describe_terms(terms)}" if terms else "ε"]
    rows: list[list[str]] = []
    for label, picked in [("none (undefended)", BASELINE), *[(_tick(defense, s), s) for s in _points(report, name)]]:
        at = [r for r in report.rows if (r.defense == BASELINE if picked == BASELINE else
                                         r.defense == name and r.strength == picked)]
        by_attack = {r.attack: r for r in at}
        line = [label]
        for m in chance_metrics:
            line.append(_number(_mean_of([r.chance for r in at if r.metric == m and r.chance is not None]),
                                2 if m == "psnr" else 3))
        line += [cell(by_attack.get(a), total) for a in attacks]
        first = at[0] if at else None
        if accurate:
            line.append(_number(first.utility.accuracy if first else None, 3))
        line += [_number(first.utility.cosine if first else None, 4),
                 _number(first.utility.relative_l2_error if first else None, 4)]
        if defense.training:
            if noise:
                line.append(short_number(noise[picked]) if picked in noise else ("0" if picked == BASELINE else "n/a"))
            line.append(_number(first.epsilon if first else None, 3) if picked != BASELINE else "∞")
        rows.append(line)
    return SweepTable(header, rows, [False] + [True] * (len(header) - 1))


def settings_text(report: SweepReport, code: Callable[[str], str] | None = None) -> str:
    """The sweep's setting in a sentence; ``code`` formats the paths (default: as they are; each renderer escapes
    the result its own way)."""
    s = report.settings
    show = code or (lambda text: text)
    client = f"B = {s.batch_size}, m = {s.local_steps} ({s.scheme})"
    aux = f", aux data {show(s.aux)}" if s.aux else ""
    t = s.training
    trained = "" if t is None else (
        f"; utility: test accuracy after R = {t.rounds} FedAvg rounds × m = {t.local_steps} SGD steps (B = "
        f"{t.batch_size}, lr {t.learning_rate:g}) under each point's defense, the same batches at every point, "
        f"{t.train_size} examples to train on and {t.eval_size} to test on ("
        + (f"{show(t.eval_data)}" if t.eval_data else f"a seeded {t.eval_fraction or 0:.0%} of the data, held out")
        + ")")
    return (f"model {show(s.model)}, data {show(s.data)}{aux}; {client}; {s.trials} trial(s) per point (seed "
            f"{s.seed}), the same batches at every point; attacks: {', '.join(s.attacks)}; reconstruction bounded to "
            f"{s.iterations} iterations" + (f"; the calibrated selector calibrated on {s.confidence} simulated "
                                            "batches" if s.confidence else "") + trained)


def md_code(text: str) -> str:
    """``text`` as a Markdown code span: literal, whatever it holds (backticks and control characters dropped)."""
    return "`" + "".join(" " if ord(ch) < 32 or ord(ch) == 127 else ch for ch in text.replace("`", "'")) + "`"


_PLAIN = re.compile(r"[A-Za-z0-9 .,()=±+-]*")


def md_cell(text: str) -> str:
    """A table cell: as it is when it holds only letters, digits and harmless punctuation, else escaped."""
    return text if _PLAIN.fullmatch(text) else md_escape(text)


LEGEND = ("Cells: mean ± standard deviation over the trials the attack answered; (k/T): only k of the T trials "
          "answered (the others: not applicable, failed or abstained; sweep.json gives the reason); n/a: none did. "
          "iAcc: labels recovered (chance: random guessing for the same batches); κ: identification over chance of "
          "the reconstructions' lineups (0 = chance); utility: the defended contribution against the clean one "
          "(cosine, relative L2 error) and, with --utility accuracy, the test accuracy of the model trained under the "
          "defense.")


def markdown(report: SweepReport) -> str:
    """``sweep.md``: the setting, notices, and per defense its plot (with its accessible name as alt text) and
    table. Paths and specs (untrusted text) are escaped; names are registry names (``NAME_PATTERN``)."""
    lines = ["# Defense sweep: leakage against defense strength", "", settings_text(report, md_code) + ".", ""]
    if report.notices:
        lines += [f"- {md_escape(n)}" for n in report.notices] + [""]
    lines += ["## Privacy–utility", "", f"![{privacy_utility_title(report)}]({PRIVACY_UTILITY}.png)", ""]
    for defense in report.defenses:
        strength = f" ({defense.strength})" if defense.strength else ""
        lines += [f"## {defense.name}{strength}", "", f"Spec: {md_code(defense.spec)}"
                  + (" (applied while the client trains)" if defense.training else "") + ".", "",
                  f"![{plot_title(report, defense.name)}]({defense.plot}.png)", ""]
        table = defense_table(report, defense.name)
        lines.append("| " + " | ".join(table.header) + " |")
        lines.append("|" + "|".join("---:" if n else "---" for n in table.numeric) + "|")
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in table.rows]
        lines.append("")
    lines += [LEGEND, ""]
    return "\n".join(lines)


def print_summary(console: Console, report: SweepReport) -> None:
    """The console view: per point and metric the strongest attack (highest mean), chance and utility."""
    from rich.markup import escape as rich_escape
    from rich.table import Table

    dp = any(r.epsilon is not None for r in report.rows)
    accurate = measured_accuracy(report)
    table = Table(title="gleak sweep: the best attack at each point", title_justify="left")
    for col, right in (("defense", False), ("strength", True), ("metric", False), ("best attack", False),
                       ("mean ± std", True), ("chance", True), *((("accuracy", True),) if accurate else ()),
                       ("cosine", True), *((("ε", True),) if dp else ())):
        table.add_column(col, justify="right" if right else "left", overflow="fold", no_wrap=col == "mean ± std")
    for defense, strength in points_of(report):
        at = [r for r in report.rows if r.defense == defense and r.strength == strength]
        for metric in metrics_of(report, at):
            scored = [r for r in at if r.metric == metric and r.mean is not None]
            best = max(scored, key=lambda r: r.mean or 0.0) if scored else None
            chance = _mean_of([r.chance for r in at if r.metric == metric and r.chance is not None])
            shown = "none" if strength == BASELINE else ("—" if strength is None else f"{strength:g}")
            table.add_row(rich_escape(defense), shown, METRIC_SHORT[metric],
                          rich_escape(best.attack) if best else "n/a", cell(best, report.settings.trials),
                          _number(chance, 2 if metric == "psnr" else 3),
                          *((_number(at[0].utility.accuracy),) if accurate else ()), _number(at[0].utility.cosine),
                          *((_number(at[0].epsilon),) if dp else ()))
    console.print(table)
    for d in report.defenses:
        terms = epsilon_terms_of(report, d.name)
        if terms is not None:
            console.print(f"ε of {rich_escape(d.name)}: at {describe_terms(terms)}", highlight=False)
    t = report.settings.training
    if t is not None:
        spent = report.training_seconds
        points = len({(r.defense, r.strength) for r in report.rows})
        cost = ("not recorded (SOURCE_DATE_EPOCH)" if not spent else
                f"{spent:.1f} s for {points} point(s), {spent / points:.2f} s per point")
        console.print(f"utility: test accuracy on {t.eval_size} held-out examples after {t.rounds} rounds × "
                      f"{t.local_steps} steps (B = {t.batch_size}, lr {t.learning_rate:g}, "
                      f"{report.settings.threads} thread(s)); training took {cost}", highlight=False)
    for notice in report.notices:
        console.print(f"[yellow]notice:[/] {rich_escape(notice)}", soft_wrap=True)
